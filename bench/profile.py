"""py-spy profile of the ckptfs daemon during one workload.

    python -m bench.profile --commit sync --workload w2 --out prof.txt [--dir D]

Mounts ckptfs over a scratch directory, runs ``py-spy record --threads -f raw``
on the daemon while the client runs W2 (1 GiB torch.save), W1 or W7 (300 groups),
then prints the busy samples (threads waiting on a condition or inside the
libfuse loop excluded) by thread and function.  Unmounts, stops by PID.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from .common import daemon
from .workloads import w1, w2, w7

IDLE = ("Condition.wait", "FUSE.__init__")


def summarize(path: Path, top: int = 12) -> None:
    busy: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        leaf = frames[-1].split(" (")[0]
        if any(i in frames[-1] for i in IDLE) or leaf.startswith("thread"):
            continue
        thread = frames[0].split(": ", 1)[1] if ": " in frames[0] else "fuse worker"
        busy[(thread, leaf)] += int(n)
    tot = sum(busy.values())
    print(f"busy samples: {tot}")
    for (thread, leaf), n in busy.most_common(top):
        print(f"{100 * n / tot:5.1f}%  {thread:16s} {leaf}")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile")
    ap.add_argument("--commit", choices=("sync", "async"), default="sync")
    ap.add_argument("--workload", choices=("w1", "w2", "w7"), default="w2")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--gil", action="store_true", help="sample only threads holding the GIL (CPU in Python)")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-prof-", dir=a.dir))
    dm = daemon(base, a.commit)
    try:
        sd = {"w": torch.randn((1024 << 20) // 32, 8)} if a.workload == "w2" else {}
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(dm.pid), "-f", "raw", "-o", a.out, "-r", "200",
                                *(["--gil"] if a.gil else []),
                                "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        if a.workload == "w2":
            print(w2(base, sd, "ckptfs", a.commit == "async"))
        else:
            (base / a.workload).mkdir()
            w = base / a.workload
            lat = sorted(w7(w, 300) if a.workload == "w7" else w1(w, "ckptfs", 300, a.commit == "async"))
            print(f"{a.workload} p50 {1e3 * lat[len(lat) // 2]:.2f} ms")
        time.sleep(0.5)
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    finally:
        dm.stop()
        shutil.rmtree(base, ignore_errors=True)
    summarize(Path(a.out))


if __name__ == "__main__":
    main()
