"""W1 alone, native atomic+dirsync vs ckptfs sync, interleaved: ``python -m bench.w1check [--groups N] [--reps R]``.

A quick re-measurement of the metadata-bound workload after a change to the
mount's kernel caching (docs/results/performance-analysis.md); the full suite
is ``python -m bench``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from .common import Daemon
from .workloads import w1


def _q(xs: list[float], p: float) -> float:
    return 1e3 * xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.w1check")
    ap.add_argument("--groups", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="backing filesystem (default: a temp dir)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        base = Path(tmp)
        (base / "native").mkdir()
        (base / "ckptfs").mkdir()
        dm = Daemon(base / "ckptfs", "sync")
        lat: dict[str, list[float]] = {"atomic_dirsync": [], "ckptfs-sync": []}
        try:
            for rep in range(a.reps):
                for mode, root, how in (("atomic_dirsync", base / "native", "atomic_dirsync"),
                                        ("ckptfs-sync", base / "ckptfs", "ckptfs")):
                    d = root / f"rep{rep}"
                    d.mkdir()
                    lat[mode].extend(w1(d, how, a.groups, False))
        finally:
            dm.stop()
    for mode, xs in lat.items():
        xs.sort()
        print(f"{mode:16} n={len(xs)} p50 {_q(xs, 0.5):.2f} ms  p90 {_q(xs, 0.9):.2f} ms  "
              f"p99 {_q(xs, 0.99):.2f} ms  "
              f"mean {1e3 * statistics.fmean(xs):.2f} ms")
    n, c = sorted(lat["atomic_dirsync"]), sorted(lat["ckptfs-sync"])
    print(f"ratio p50 {c[len(c) // 2] / n[len(n) // 2]:.2f}x  p99 {c[int(0.99 * len(c))] / n[int(0.99 * len(n))]:.2f}x")


if __name__ == "__main__":
    main()
