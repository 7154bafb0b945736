"""Raising the read-ahead of a new FUSE mount (both transports): the kernel proposes 128 KiB at
INIT and clamps the reply to it; root can raise it afterwards through the connection's bdi."""

from __future__ import annotations

import logging
import time

from ckptfs.mounts import mounts_at

log = logging.getLogger("ckptfs.fuse")

READ_AHEAD_KB = 4096  # 4 MiB: the kernel's FUSE default is 128 KiB (32 pages), i.e. 8192 requests per GiB


def _fuse_devs_at(target: str) -> list[str]:
    """MAJ:MIN of the FUSE mounts at ``target``, oldest first, from /proc/self/mountinfo.

    Never touches the mount itself: a daemon must not send requests to its own
    mount (a request in flight when the daemon is killed can never be answered,
    and the thread waiting for it keeps the process from exiting)."""
    return [e.dev for e in mounts_at(target) if e.fstype.startswith("fuse")]


def raise_readahead(target: str, before: list[str], kb: int, timeout: float = 30.0) -> None:
    """Set the new mount's read_ahead_kb (sysfs bdi of the FUSE connection).

    libfuse cannot raise readahead above the kernel's 128 KiB proposal at INIT;
    root can afterwards, through /sys/class/bdi/MAJ:MIN/read_ahead_kb.  Runs in
    a thread: waits for a FUSE mount at ``target`` (the mountpoint's real path,
    taken before mounting) that was not there before (``before``), writes the
    value, and rewrites it once the kernel has processed the INIT reply (which
    clamps readahead to the INIT value).  Best effort: without permission the
    default stays (logged).  Never sends a request to the mount.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
        new = [d for d in _fuse_devs_at(target) if d not in before]
        if not new:
            continue
        path = f"/sys/class/bdi/{new[-1]}/read_ahead_kb"
        for _ in range(5):
            try:
                with open(path, "w") as f:
                    f.write(str(kb))
                time.sleep(0.5)
                with open(path) as f:
                    if int(f.read().strip() or 0) == kb:
                        log.info("read_ahead_kb=%d (%s)", kb, path)
                        return
            except (OSError, ValueError) as e:
                log.info("read_ahead_kb left at the kernel default (%s: %s)", path, e)
                return
        log.info("read_ahead_kb: kernel kept resetting %s", path)
        return
