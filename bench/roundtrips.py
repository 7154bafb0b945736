"""Count the FUSE requests per W1 group (libfuse ``-d`` log of a ckptfs mount).

    python -m bench.roundtrips [--dir D] [--groups 20]

Mounts ckptfs with ``--debug --transport mfusepy`` (the parser reads libfuse's
request log) over a scratch directory, writes ``--groups``
groups of the paper's workload after a marker file, and prints the mean number
of requests of each opcode per group.  Unmounts and stops the daemon by PID.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptfs.mounts import is_ckptfs_mount

from .common import ROOT
from .workloads import w1


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.roundtrips")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--groups", type=int, default=20)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-rt-", dir=a.dir))
    d, logf = base / "mnt", base / "fuse-debug.log"
    d.mkdir()
    with open(logf, "w") as log:
        argv = [sys.executable, "-m", "ckptfs", "mount", "-f", str(d), "--debug", "--transport", "mfusepy"]
        p = subprocess.Popen(argv, stdout=log, stderr=log, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not is_ckptfs_mount(str(d)):
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError("ckptfs did not mount")
            time.sleep(0.05)
        (d / "warm").mkdir()
        w1(d / "warm", "ckptfs", 2, False)
        with open(d / "MARK", "wb"):
            pass
        (d / "w1").mkdir()
        w1(d / "w1", "ckptfs", a.groups, False)
    finally:
        if subprocess.run(["fusermount3", "-u", str(d)]).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(d)])
        p.wait(60)
    after = logf.read_text().split("/MARK")[-1].split("LOOKUP /w1\n", 1)[-1]
    ops = collections.Counter(re.findall(r"opcode: (\w+)", after))
    total = sum(ops.values()) / a.groups
    print(f"FUSE requests per group: {total:.1f}")
    for k, v in ops.most_common():
        print(f"  {k:10s} {v / a.groups:.2f}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
