"""The mount table: one parser of ``/proc/self/mountinfo`` (CLI and FUSE adapter).

A mountinfo line (proc(5))::

    36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)    (10)         (11)

Fields are separated by single spaces; optional fields (7) end at a lone ``-``.
The kernel escapes only space, tab, newline and backslash in paths, as octal
``\\040 \\011 \\012 \\134``; every other byte (UTF-8 included) is written as is.
So lines are split and unescaped as bytes and paths decoded like the rest of
``os`` does (``os.fsdecode``: the filesystem encoding with surrogateescape), which
makes them compare equal to ``os.path.realpath`` of the same directory whatever
its name.  Lines that do not have this shape are skipped, never raised on.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ckptfs import META_DIR

MOUNTINFO = "/proc/self/mountinfo"
CKPTFS_FSTYPE = "fuse.ckptfs"

_ESCAPES = {b"\\040": b" ", b"\\011": b"\t", b"\\012": b"\n", b"\\134": b"\\"}
_ESCAPE_RE = re.compile(rb"\\(?:040|011|012|134)")


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    dev: str  # MAJ:MIN
    root: str
    mountpoint: str
    fstype: str
    source: str
    options: str = ""  # per-mount options (rw,nosuid,...)
    super_options: str = ""  # the filesystem's own options (for NFS: sync, ...)


def unescape(field: bytes) -> str:
    """A mountinfo path field as a ``str`` path (only the kernel's four octal escapes decoded)."""
    return os.fsdecode(_ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], field))


def parse_line(line: bytes) -> MountEntry | None:
    """One mountinfo line, or None if it is malformed."""
    fields = line.rstrip(b"\n").split(b" ")
    try:
        sep = fields.index(b"-", 6)
        if len(fields) < sep + 3:
            return None
        return MountEntry(int(fields[0]), int(fields[1]), os.fsdecode(fields[2]), unescape(fields[3]),
                          unescape(fields[4]), os.fsdecode(fields[sep + 1]), unescape(fields[sep + 2]),
                          os.fsdecode(fields[5]), os.fsdecode(fields[sep + 3]) if len(fields) > sep + 3 else "")
    except ValueError:
        return None


def parse_mountinfo(data: bytes) -> list[MountEntry]:
    """Every well-formed line of a mountinfo text, in order (oldest mount first)."""
    return [e for e in map(parse_line, data.split(b"\n")) if e is not None]


def darwin_fstype(fstype: str, source: str) -> str:
    """macFUSE reports every FUSE mount as ``macfuse`` (older: ``osxfuse``); ours carry the source
    ``ckptfs:...`` (the fsname we mount with), so they get Linux's name for them."""
    if fstype in ("macfuse", "osxfuse") and source.startswith("ckptfs"):
        return CKPTFS_FSTYPE
    return fstype


def read_mountinfo(path: str = MOUNTINFO) -> list[MountEntry]:
    """This process's mount table; empty where it cannot be read.  On Darwin from getfsstat(2)
    (``darwin.mounts``; no mount ids or devices there)."""
    if sys.platform == "darwin" and path == MOUNTINFO:
        from ckptfs import darwin

        try:
            return [MountEntry(0, 0, "", "/", mp, darwin_fstype(fstype, src), src)
                    for mp, fstype, src in darwin.mounts()]
        except OSError:
            return []
    try:
        with open(path, "rb") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []


def mounts_at(mountpoint: str, path: str = MOUNTINFO) -> list[MountEntry]:
    """The mounts whose mountpoint is exactly ``mountpoint`` (no realpath taken), oldest first."""
    return [e for e in read_mountinfo(path) if e.mountpoint == mountpoint]


def mount_entry(path: str, mountinfo: str = MOUNTINFO) -> MountEntry | None:
    """The mount visible at ``path`` (the last one stacked on its real path), if any."""
    found = mounts_at(os.path.realpath(path), mountinfo)
    return found[-1] if found else None


def containing(path: str, mountinfo: str = MOUNTINFO) -> MountEntry | None:
    """The mount that holds ``path``: the last one stacked on the longest mountpoint above it."""
    real = os.path.realpath(path)
    best: MountEntry | None = None
    for e in read_mountinfo(mountinfo):
        mp = e.mountpoint
        if real == mp or real.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mountpoint):
                best = e
    return best


def is_ckptfs_mount(path: str) -> bool:
    ent = mount_entry(path)
    return ent is not None and ent.fstype == CKPTFS_FSTYPE


def _up_to(path: str, found: Callable[[str], bool]) -> str | None:
    """The nearest directory at or above ``path`` for which ``found`` holds."""
    p = os.path.abspath(path)
    while True:
        if found(p):
            return p
        up = os.path.dirname(p)
        if up == p:
            return None
        p = up


def find_mount_root(path: str) -> str | None:
    """The ckptfs mountpoint at or above ``path``, if any."""
    return _up_to(path, is_ckptfs_mount)


def find_backing_root(path: str) -> str | None:
    """The directory at or above ``path`` that ckptfs manages (it holds ``.ckptfs/``), if any."""
    return _up_to(path, lambda p: os.path.isdir(os.path.join(p, META_DIR)))
