"""A ckptfs daemon whose backing store records every call, for the model checker.

Usage: mc_daemon.py MOUNT LOGFILE sync|async

Serves MOUNT in place (foreground) like ``ckptfs mount -f``; on unmount it
pickles the recorded operation log to LOGFILE.  The application marks its
operations with lookups of magic names in the mount root:
``.mc-begin-N`` (operation N starts) and ``.mc-ack-N`` (operations 1..N were
acknowledged); the lookup fails with ENOENT after recording the marker.
"""

from __future__ import annotations

import errno
import os
import pickle
import sys
from typing import Any

from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS
from ckptfs.fuse.adapter import serve
from ckptfs_testing.modelcheck import RecordingStore


class MarkingStore(RecordingStore):
    """RecordingStore that turns lookups of ``.mc-KIND-N`` into markers."""

    def __getattr__(self, name: str) -> Any:
        if name != "lstat":
            return super().__getattr__(name)

        def lstat(path: str) -> os.stat_result:
            if path.startswith(".mc-"):
                kind, _, n = path[4:].partition("-")
                self.mark(kind, int(n))
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            return self.inner.lstat(path)

        return lstat


def main() -> None:
    mount, logfile, commit = sys.argv[1], sys.argv[2], sys.argv[3]
    os_store = OsBackingStore(mount)  # opened before the mount covers the directory
    store = MarkingStore(os_store)
    try:
        fs = CkptFS(store, commit_mode=commit, backing_label=mount)
        store.mark("start", 0)
        serve(fs, mount)
    finally:
        os_store.shutdown()
        with open(logfile, "wb") as f:
            pickle.dump(store.log, f)


if __name__ == "__main__":
    main()
