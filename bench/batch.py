"""Async group commit (docs/design.md C5) on and off, back to back.

    python -m bench.batch [--dir D] [--pairs N] [--shards S] [--mib M] [--files F] [--json OUT]

Two async mounts of the same code, one with group commits (the default) and one with
``CKPTFS_BATCH_MAX=1`` (one install at a time, as before C5), each running in turn, in alternating
order, ``--pairs`` times: W3 (a DCP-style save of ``--mib`` MiB as ``--shards`` shard files plus
``.metadata``, seconds until durable: the closes, then ``fsync`` of the directory) and a burst of
``--files`` 4 KiB files written back to back, then ``fsync`` of their directory (seconds until
durable).  Each pair records the disk's speed just before it (64 MiB dd + fdatasync; this disk
switches between two speeds) and the daemon's counts (``batches``, ``batched_installs``), which do
not drift with the disk.  Prints per pair and the medians of the per-pair ratios (batched / one at
a time).

Invariant: every mount is unmounted and its daemon stopped by PID; the scratch directory is
removed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from .common import daemon, fsync_path
from .workloads import disk_probe, w3


def burst(root: Path, files: int) -> float:
    """``files`` files of 4 KiB written and closed back to back, then their directory fsynced."""
    d = root / "burst"
    d.mkdir()
    blob = os.urandom(4096)
    t0 = time.perf_counter()
    for i in range(files):
        with open(d / f"f{i:05d}", "wb") as f:
            f.write(blob)
    fsync_path(d, directory=True)
    took = time.perf_counter() - t0
    shutil.rmtree(d)
    return took


def one(base: Path, name: str, batch_max: str, buf: memoryview, shards: int, files: int) -> dict:
    root = base / name
    root.mkdir(exist_ok=True)
    dm = daemon(root, "async", env={"CKPTFS_BATCH_MAX": batch_max})
    try:
        out = {"w3_s": w3(root, buf, shards, "unsafe", True), "burst_s": burst(root, files)}
        stats = json.loads(os.getxattr(root, "user.ckptfs.stats"))
        out.update(batches=stats.get("batches", 0), batched=stats.get("batched_installs", 0),
                   commits=stats.get("commits", 0))
        return out
    finally:
        dm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.batch")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--shards", type=int, default=512)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-batch-", dir=a.dir))
    rows = []
    try:
        buf = memoryview(os.urandom(a.mib << 20))
        for i in range(a.pairs):
            disk = disk_probe(base)
            order = [("batched", "64"), ("single", "1")]
            if i % 2:
                order.reverse()
            row: dict = {"pair": i, "disk_MBps": round(disk)}
            for name, bm in order:
                row[name] = one(base, name, bm, buf, a.shards, a.files)
            rows.append(row)
            b, s = row["batched"], row["single"]
            print(f"pair {i} disk {disk:.0f} MB/s  W3 {b['w3_s']:.3f} / {s['w3_s']:.3f} s "
                  f"({b['batches']} batches of {b['batched']})  burst {b['burst_s']:.3f} / {s['burst_s']:.3f} s",
                  flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(r["batched"][k] / r["single"][k] for r in rows) for k in ("w3_s", "burst_s")}
    print(f"median ratio batched / one at a time: W3 {med['w3_s']:.2f}, burst {med['burst_s']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows, "median_ratio": med}, indent=1))


if __name__ == "__main__":
    main()
