"""Shared helpers of the benchmark: the paper's write modes, daemons, statistics.

Daemons are ``ckptfs_testing.mount.Mount`` (the tests' and campaigns' harness).
Invariant: every daemon the benchmark starts is stopped by its own PID (after a
``fusermount3 -u``, ``-uz`` as fallback) by :meth:`Mount.stop`; callers use it
in ``try/finally``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ckptfs_testing.mount import Mount  # noqa: E402

NATIVE = ["unsafe", "atomic_nodirsync", "atomic_dirsync"]
KERNEL = ["ckptfs-sync", "ckptfs-async"]  # our own /dev/fuse transport (kernel caching, passthrough)
MFUSEPY = ["ckptfs-sync-mfusepy"]  # the libfuse high-level path, for the transport comparison
CKPTFS = KERNEL + MFUSEPY
MODES = NATIVE + CKPTFS
# mode -> (commit mode, transport) of its daemon
MOUNTS = {"ckptfs-sync": ("sync", "kernel"), "ckptfs-async": ("async", "kernel"),
          "ckptfs-sync-mfusepy": ("sync", "mfusepy")}


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


def daemon(d: Path, commit: str, transport: str = "kernel", cache_timeout: float | None = None,
           env: dict[str, str] | None = None) -> Mount:
    """Start a foreground ``ckptfs mount -f D --commit C --transport T`` (in place); the caller
    stops it (``.stop()``).  ``cache_timeout``: the kernel transport's cache timeout (default: the
    daemon's own); ``env``: more environment for the daemon (``CKPTFS_WRITE_PASSTHROUGH=0``)."""
    args = ["--transport", transport]
    if cache_timeout is not None and transport == "kernel":
        args += ["--cache-timeout", str(cache_timeout)]
    return Mount(d, commit=commit, env=env, extra_args=args, stop_timeout=300).start(timeout=30)
