"""Quick re-measurement of one metadata-bound workload, native vs ckptfs sync, interleaved.

``python -m bench.quick w1 [--groups N] [--reps R]``: W1 (small-file saves, latency per group)
against native atomic+dirsync.  ``python -m bench.quick w5 [--rounds R]``: W5 (stat, open+close,
readdir of a 1000-entry directory) against the native directory.  Used after a change to the
mount's kernel caching (docs/results/performance-analysis.md); the full suite is ``python -m bench``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from .common import daemon
from .workloads import w1, w5, w5_prepare


def _q(xs: list[float], p: float) -> float:
    return 1e3 * xs[min(len(xs) - 1, int(p * len(xs)))]


def check_w1(base: Path, groups: int, reps: int) -> None:
    (base / "native").mkdir()
    (base / "ckptfs").mkdir()
    dm = daemon(base / "ckptfs", "sync")
    lat: dict[str, list[float]] = {"atomic_dirsync": [], "ckptfs-sync": []}
    try:
        for rep in range(reps):
            for mode, root, how in (("atomic_dirsync", base / "native", "atomic_dirsync"),
                                    ("ckptfs-sync", base / "ckptfs", "ckptfs")):
                d = root / f"rep{rep}"
                d.mkdir()
                lat[mode].extend(w1(d, how, groups, False))
    finally:
        dm.stop()
    for mode, xs in lat.items():
        xs.sort()
        print(f"{mode:16} n={len(xs)} p50 {_q(xs, 0.5):.2f} ms  p90 {_q(xs, 0.9):.2f} ms  "
              f"p99 {_q(xs, 0.99):.2f} ms  "
              f"mean {1e3 * statistics.fmean(xs):.2f} ms")
    n, c = sorted(lat["atomic_dirsync"]), sorted(lat["ckptfs-sync"])
    print(f"ratio p50 {c[len(c) // 2] / n[len(n) // 2]:.2f}x  p99 {c[int(0.99 * len(c))] / n[int(0.99 * len(n))]:.2f}x")


def check_w5(base: Path, rounds: int) -> None:
    for m in ("native", "ckptfs"):
        (base / m).mkdir()
        w5_prepare(base / m / "w5")  # natively, before the mount covers it (as in python -m bench)
    dm = daemon(base / "ckptfs", "sync")
    try:
        res = {"native": w5(base / "native" / "w5", rounds), "ckptfs-sync": w5(base / "ckptfs" / "w5", rounds)}
    finally:
        dm.stop()
    for mode, r in res.items():
        print(f"{mode:12} " + "  ".join(f"{k} {v:,.0f}/s" for k, v in r.items()))
    print("ratio native/ckptfs " + "  ".join(f"{k} {res['native'][k] / res['ckptfs-sync'][k]:.1f}x"
                                             for k in res["native"]))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quick")
    ap.add_argument("workload", choices=("w1", "w5"))
    ap.add_argument("--groups", type=int, default=400, help="w1: groups per repetition")
    ap.add_argument("--reps", type=int, default=3, help="w1: repetitions")
    ap.add_argument("--rounds", type=int, default=5, help="w5: rounds (median)")
    ap.add_argument("--dir", default=None, help="backing filesystem (default: a temp dir)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        if a.workload == "w1":
            check_w1(Path(tmp), a.groups, a.reps)
        else:
            check_w5(Path(tmp), a.rounds)


if __name__ == "__main__":
    main()
