"""Quick re-measurement of one metadata-bound workload, native vs ckptfs sync, interleaved.

``python -m bench.quick w1 [--groups N] [--reps R]``: W1 (small-file saves, latency per group)
against native atomic+dirsync.  ``python -m bench.quick w5 [--rounds R]``: W5 (stat, open+close,
readdir of a 1000-entry directory) against the native directory.  ``python -m bench.quick writes
[--size-mib M] [--reps R]``: W2 (one durable torch.save), W3 (64-shard DCP-style save) and W7 (the
atomic writer's group) natively (atomic+dir-fsync) and through two mounts, one whose writers use
FUSE passthrough (the digest computed from the staging file at seal) and one whose writes reach the
daemon (``CKPTFS_WRITE_PASSTHROUGH=0``: the digest streamed as they arrive), interleaved.  Used after a change to the
mount's kernel caching (docs/results/performance-analysis.md); the full suite is ``python -m bench``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from .common import daemon
from .workloads import w1, w2, w3, w5, w5_prepare, w7


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


def check_writes(base: Path, size_mib: int, reps: int, groups: int) -> None:
    import torch

    sd = {"w": torch.randn((size_mib << 20) // 4 // 8, 8)}
    buf = memoryview(bytes(size_mib << 20))
    kinds = {"native": None, "passthrough": {}, "streamed": {"CKPTFS_WRITE_PASSTHROUGH": "0"}}
    mounts = {}
    for kind, env in kinds.items():
        (base / kind).mkdir()
        if env is not None:
            mounts[kind] = daemon(base / kind, "sync", env=env)
    res: dict[str, dict[str, list[float]]] = {kind: {"w2": [], "w3": [], "w7_p50": [], "w7_p99": []} for kind in kinds}
    try:
        for rep in range(reps):
            for kind in kinds:
                d = base / kind / f"rep{rep}"
                d.mkdir()
                how = "atomic_dirsync" if kind == "native" else "ckptfs"
                res[kind]["w2"].append(w2(d, sd, how, False)["durable_s"])
                res[kind]["w3"].append(w3(d, buf, 64, how, False))
                lat = sorted(w7(d, groups))
                res[kind]["w7_p50"].append(lat[len(lat) // 2])
                res[kind]["w7_p99"].append(lat[min(len(lat) - 1, int(0.99 * len(lat)))])
                (d / "model.pt").unlink()
    finally:
        for m in mounts.values():
            m.stop()
    med = {kind: {k: statistics.median(v) for k, v in r.items()} for kind, r in res.items()}
    for kind, r in med.items():
        print(f"{kind:12} " + "  ".join(f"{k} {1e3 * v:.1f} ms" for k, v in r.items()))
    for kind in ("passthrough", "streamed"):
        print(f"ratio {kind:11} " + "  ".join(f"{k} {med[kind][k] / med['native'][k]:.2f}x" for k in med[kind]))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quick")
    ap.add_argument("workload", choices=("w1", "w5", "writes"))
    ap.add_argument("--size-mib", type=int, default=1024, help="writes: W2 and W3 bytes")
    ap.add_argument("--groups", type=int, default=400, help="w1: groups per repetition")
    ap.add_argument("--reps", type=int, default=3, help="w1: repetitions")
    ap.add_argument("--rounds", type=int, default=5, help="w5: rounds (median)")
    ap.add_argument("--dir", default=None, help="backing filesystem (default: a temp dir)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        if a.workload == "w1":
            check_w1(Path(tmp), a.groups, a.reps)
        elif a.workload == "writes":
            check_writes(Path(tmp), a.size_mib, a.reps, a.groups)
        else:
            check_w5(Path(tmp), a.rounds)


if __name__ == "__main__":
    main()
