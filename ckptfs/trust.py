"""Whether the metadata directory of a backing root may be trusted (issue 26, threat model in
docs/design.md).

ckptfs often runs as root over a directory a user owns.  Whoever can write that directory while it
is unmounted can plant ``.ckptfs/``: a symbolic link (``staging -> /root-only/dir``: recovery
deleted every file there), a journal naming paths outside the directory, a log file that is a link
to a root-only file.  So before the daemon (or any command that changes the directory) reads or
writes ``.ckptfs/``, it must be a real directory, not a link, owned by the uid this process runs
as, writable by nobody else, and every entry directly in it too.  Otherwise the command refuses,
saying how to fix it; nothing is read, changed or deleted.  (Paths read from inside are confined
separately: ``layout.safe_rel``.)
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from ckptfs import META_DIR

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore


class UntrustedMetadata(Exception):
    """``.ckptfs/`` may have been written by someone else: one line saying why and what to do."""


def check_meta_dir(store: BackingStore, where: str = "") -> None:
    """Raise :class:`UntrustedMetadata` unless ``.ckptfs`` (if present) and every entry directly in
    it are real files and directories owned by this process's effective uid, writable by no one
    else.  ``where``: the backing directory, for the message."""
    euid = os.geteuid()
    top = os.path.join(where, META_DIR) if where else META_DIR
    fix = (f"if you trust what is in it: chown -R {euid} {top} && chmod 700 {top}; "
           f"otherwise move it away (ckptfs then starts with no records)")
    try:
        st = store.lstat(META_DIR)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedMetadata(f"{top} is a symbolic link: ckptfs follows no link it did not make ({fix})")
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedMetadata(f"{top} is not a directory ({fix})")
    if st.st_uid != euid:
        raise UntrustedMetadata(f"{top} is owned by uid {st.st_uid}, not by uid {euid} that runs ckptfs: "
                                f"someone else may have written it ({fix})")
    if st.st_mode & 0o022:
        raise UntrustedMetadata(f"{top} is writable by group or others (mode {st.st_mode & 0o7777:o}): "
                                f"someone else may have written it ({fix})")
    for name in store.listdir(META_DIR):
        try:
            e = store.lstat(f"{META_DIR}/{name}")
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(e.st_mode):
            raise UntrustedMetadata(f"{top}/{name} is a symbolic link: ckptfs follows no link it did not make "
                                    f"({fix})")
        if e.st_uid != euid or e.st_mode & 0o022:
            raise UntrustedMetadata(f"{top}/{name} is owned by uid {e.st_uid} or writable by others: someone "
                                    f"else may have written it ({fix})")
