"""What every command module shares: the one error class, and finding the ckptfs directory a path is in.

Every user error ends in one line ``ckptfs: error: ...`` and exit status 2
(1 for operational failures), never a traceback: commands raise
:class:`CliError` and ``main`` prints it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ckptfs import META_DIR
from ckptfs.mounts import find_backing_root, find_mount_root, is_ckptfs_mount
from ckptfs.xattrs import X_PID

__all__ = ["CliError", "Where", "daemon_pid", "find_backing_root", "find_mount_root", "fusermount",
           "is_ckptfs_mount", "locate"]


class CliError(Exception):
    def __init__(self, msg: str, code: int = 2) -> None:
        super().__init__(msg)
        self.code = code


def fusermount(path: str, lazy: bool = False) -> subprocess.CompletedProcess:
    exe = shutil.which("fusermount3") or shutil.which("fusermount")
    if exe:
        cmd = [exe, "-uz" if lazy else "-u", path]
    elif sys.platform == "darwin" or os.geteuid() == 0:
        cmd = ["umount", *(["-l"] if lazy and sys.platform != "darwin" else []), path]
    else:
        raise CliError("fusermount3 not found: install fuse3 (apt-get install fuse3)")
    return subprocess.run(cmd, capture_output=True, text=True)


def daemon_pid(path: str) -> int | None:
    try:
        return int(os.getxattr(path, X_PID))
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class Where:
    """Where a CLI path lives: ``root`` (mountpoint or backing dir) and ``rel`` inside it."""

    root: str
    rel: str
    mounted: bool


def locate(path: str) -> Where:
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file or directory")
    root = find_mount_root(path)
    if root is not None:
        return Where(root, os.path.relpath(os.path.abspath(path), root).removeprefix("."), True)
    root = find_backing_root(path)
    if root is None:
        raise CliError(f"{path}: not inside a ckptfs mount or a directory ckptfs has managed "
                       f"(no {META_DIR}/ above it)")
    return Where(root, os.path.relpath(os.path.abspath(path), root).removeprefix("."), False)


def walk(top: str):  # type: ignore[no-untyped-def]
    """``os.walk(top)`` without recursion (Python 3.11's recursed into RecursionError on a tree
    1,000 levels deep, issue 26): (dirpath, dirnames, filenames) top-down, names sorted; prune by
    editing ``dirnames``.  Unreadable directories are skipped; links are not followed."""
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                ents = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs = [e.name for e in ents if e.is_dir(follow_symlinks=False)]
        files = [e.name for e in ents if not e.is_dir(follow_symlinks=False)]
        yield d, dirs, files
        stack.extend(os.path.join(d, n) for n in reversed(dirs))
