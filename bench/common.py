"""Shared helpers of the benchmark: the paper's write modes, daemons, statistics.

Invariant: every daemon this module starts is stopped by its own PID (after a
``fusermount3 -u``, ``-uz`` as fallback) by :meth:`Daemon.stop`; callers use it
in ``try/finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ckptfs.cli import is_ckptfs_mount  # noqa: E402

NATIVE = ["unsafe", "atomic_nodirsync", "atomic_dirsync"]
CKPTFS = ["ckptfs-sync", "ckptfs-async"]
MODES = NATIVE + CKPTFS


def fsync_path(p: Path, directory: bool = False) -> None:
    """fsync a file or directory by path (``fsyncdir`` through a mount)."""
    fd = os.open(p, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(p: Path, data: bytes | memoryview, mode: str) -> None:
    """Write ``data`` at ``p`` in one of the paper's modes.

    ``unsafe`` and ``ckptfs``: open/write/close in place.  ``atomic_nodirsync``:
    write ``p.tmp``, fsync, rename.  ``atomic_dirsync``: that plus an fsync of
    the parent directory.
    """
    if mode in ("unsafe", "ckptfs"):
        with open(p, "wb") as f:
            f.write(data)
        return
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    if mode == "atomic_dirsync":
        fsync_path(p.parent, directory=True)


def drop_caches() -> bool:
    """Write back and drop the page cache (root only); False where not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class Daemon:
    """A foreground ``ckptfs mount -f DIR`` (in place) started by this process."""

    def __init__(self, d: Path, commit: str) -> None:
        self.d = d
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("CKPTFS_CRASH_AT", None)
        self.p = subprocess.Popen([sys.executable, "-m", "ckptfs", "mount", "-f", str(d), "--commit", commit],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        deadline = time.monotonic() + 30
        while not is_ckptfs_mount(str(d)):
            if time.monotonic() > deadline or self.p.poll() is not None:
                self.stop()
                raise RuntimeError(f"ckptfs did not mount {d}")
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.p.pid

    def rss_kib(self) -> tuple[int, int]:
        """(current VmRSS, peak VmHWM) of the daemon in KiB."""
        vals = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    vals[k] = int(v.split()[0])
        return vals.get("VmRSS", 0), vals.get("VmHWM", 0)

    def cpu_s(self) -> float:
        """User + system CPU seconds the daemon has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stats(self) -> dict:
        return json.loads(os.getxattr(str(self.d), "user.ckptfs.stats"))

    def stop(self) -> None:
        if is_ckptfs_mount(str(self.d)):
            if subprocess.run(["fusermount3", "-u", str(self.d)], capture_output=True).returncode != 0:
                time.sleep(0.5)
                if subprocess.run(["fusermount3", "-u", str(self.d)], capture_output=True).returncode != 0:
                    subprocess.run(["fusermount3", "-uz", str(self.d)], capture_output=True)
        try:
            self.p.wait(300)
        except subprocess.TimeoutExpired:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait()
