"""xfstests' ``fsx`` and ``fsstress`` run the same way natively and on a mount (tests, campaigns).

The two GPL test programs are built from the source tarball in ``shared/tools`` by its
``build-xfstests`` script (never part of the product).  A run is compared with the native run of the
same program, seed and options: the verdict (exit status), and for fsx the operations it disabled
at start because the filesystem refused them (a missing ``fallocate`` mode changes the sequence of
operations, so the two runs would no longer test the same thing).

Invariant: a comparison only passes when both runs did the same operations and both passed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from ckptfs_testing.mount import ROOT

BUILD_SCRIPT = ROOT.parent / "shared" / "tools" / "build-xfstests"


def build() -> Path:
    """The directory holding ``fsx`` and ``fsstress`` (built once into a cache directory)."""
    if not BUILD_SCRIPT.exists():
        raise FileNotFoundError(f"{BUILD_SCRIPT} is missing (shared/tools beside the checkout)")
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"build-xfstests failed: {r.stderr[-2000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


@dataclasses.dataclass
class Run:
    """One fsx or fsstress run: its exit status, what fsx disabled at start, its last lines."""

    rc: int
    disabled: frozenset[str]
    tail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


def _run(argv: list[str], timeout: float, cwd: str | None = None) -> Run:
    t = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc = -9
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += "\n(timed out)"
    lines = out.splitlines()
    disabled = frozenset(ln.split("support ", 1)[-1].split(",")[0] for ln in lines if "disabling" in ln)
    return Run(rc, disabled, "\n".join(lines[-25:]), round(time.monotonic() - t, 2))


def fsx(bindir: Path, path: Path, args: list[str], ops: int, seed: int, timeout: float = 900) -> Run:
    """``fsx -N ops -S seed ARGS path`` (its log files go beside ``path``'s directory, in /tmp)."""
    logdir = Path("/tmp") / f"fsxlog-{os.getpid()}-{threading.get_ident()}"
    logdir.mkdir(exist_ok=True)
    try:
        return _run([str(bindir / "fsx"), "-N", str(ops), "-S", str(seed), "-P", str(logdir), *args, str(path)],
                    timeout)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def fsstress(bindir: Path, directory: Path, procs: int, ops: int, seed: int, timeout: float = 900) -> Run:
    """``fsstress -d DIR -p procs -n ops -s seed`` (fsstress's own verdict: its exit status)."""
    return _run([str(bindir / "fsstress"), "-d", str(directory), "-p", str(procs), "-n", str(ops),
                 "-s", str(seed)], timeout)


class Reader:
    """Another process (``python -c``) that opens, fstats and reads ``path`` in a loop until stopped,
    counting whole reads and errors by errno: the concurrent reader beside fsx."""

    CODE = r"""
import os, sys, time, json, signal
p = sys.argv[1]; stop = False
def h(*a):
    global stop; stop = True
signal.signal(signal.SIGTERM, h)
opens = 0; errs = {}
while not stop:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:
        if e.errno == 2 and opens == 0:
            time.sleep(0.001); continue   # not created yet
        errs[e.errno] = errs.get(e.errno, 0) + 1; continue
    try:
        os.fstat(fd)
        while os.read(fd, 1 << 16):
            pass
        opens += 1
    except OSError as e:
        errs[e.errno] = errs.get(e.errno, 0) + 1
    finally:
        os.close(fd)
print(json.dumps({"opens": opens, "errors": errs}), flush=True)
"""

    def __init__(self, path: Path, python: str) -> None:
        self.proc = subprocess.Popen([python, "-c", self.CODE, str(path)], stdout=subprocess.PIPE, text=True)

    def stop(self) -> dict:
        import json

        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out.strip().splitlines()[-1])
