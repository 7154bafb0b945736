"""Cost of the durability primitives one ckptfs commit is made of, natively.

    python -m bench.syncs [--dir D] [--n 300]

Per iteration on the backing filesystem: write a 128 KiB file, then time
fsync(file), a 300-byte append + fdatasync (the journal intent), rename, and
fsync(directory); also an fsync(file) in parallel with the journal fdatasync.
Prints medians in ms.  Used to explain the W1 floor: a ckptfs sync commit
needs three syncs where the paper's atomic mode needs two.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

from .common import median


def measure(d: str, n: int) -> dict[str, float]:
    data = os.urandom(128 << 10)
    j = os.open(os.path.join(d, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    t: dict[str, list[float]] = {k: [] for k in ("fsync_file", "fdatasync_journal", "rename", "fsync_dir",
                                                 "fsync_file_parallel_journal")}
    try:
        for i in range(n):
            fd = os.open(os.path.join(d, f"s{i}"), os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(fd, data, 0)
            t0 = time.perf_counter()
            os.fsync(fd)
            t1 = time.perf_counter()
            os.write(j, b"x" * 300)
            os.fdatasync(j)
            t2 = time.perf_counter()
            os.rename(os.path.join(d, f"s{i}"), os.path.join(d, f"f{i}"))
            t3 = time.perf_counter()
            os.fsync(dfd)
            t4 = time.perf_counter()
            os.close(fd)
            for k, v in zip(("fsync_file", "fdatasync_journal", "rename", "fsync_dir"),
                            (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                t[k].append(v)
            fd = os.open(os.path.join(d, f"p{i}"), os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(fd, data, 0)
            os.write(j, b"x" * 300)
            t0 = time.perf_counter()
            th = threading.Thread(target=os.fsync, args=(fd,))
            th.start()
            os.fdatasync(j)
            th.join()
            t["fsync_file_parallel_journal"].append(time.perf_counter() - t0)
            os.close(fd)
    finally:
        os.close(j)
        os.close(dfd)
    return {k: 1e3 * median(v) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.syncs")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="ckptfs-syncs-", dir=a.dir)
    try:
        for k, v in measure(d, a.n).items():
            print(f"{k:30s} {v:.3f} ms")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
