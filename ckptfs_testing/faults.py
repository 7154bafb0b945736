"""Fault injection and operation recording around any BackingStore.

:class:`FaultyStore` forwards every call to the wrapped store.  Once armed it
counts calls to the operations in ``ops`` and makes the N-th one fail with the
chosen errno (the way SQLite's test VFS does), once.  Every call is appended to
``log`` so tests can see the exact operation sequence of a workload.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from ckptfs.backing import BackingStore

#: operations that change or persist backing state (where an error matters)
MUTATING = ("open", "pwrite", "ftruncate", "fallocate", "fsync", "fdatasync", "copy_range", "mkdir", "rmdir",
            "unlink", "rename", "exchange", "link", "symlink", "mknod", "fsync_dir", "chmod", "chown", "fchown",
            "fchmod", "utime", "setxattr", "fsetxattr")


class FaultyStore:
    bypassable = False  # every byte through this store (backing.BackingStore: no passthrough)

    def __init__(self, inner: BackingStore, ops: tuple[str, ...] = MUTATING) -> None:
        self.inner = inner
        self.ops = ops
        self.calls = 0
        self.fail_at: int | None = None
        self.errno = errno.EIO
        self.fired: tuple[str, tuple] | None = None
        self.log: list[tuple[str, tuple]] = []
        self.recording = False

    def arm(self, fail_at: int | None, err: int = errno.EIO) -> None:
        """Count from now; fail the ``fail_at``-th matching call (None: never)."""
        self.calls = 0
        self.fail_at = fail_at
        self.errno = err
        self.fired = None
        self.recording = True
        self.log = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name not in self.ops:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.recording:
                self.calls += 1
                self.log.append((name, args if name != "pwrite" else (args[0], len(args[1]), args[2])))
                if self.fail_at is not None and self.calls == self.fail_at and self.fired is None:
                    self.fired = (name, args[:2] if name.endswith("setxattr") else args[:1])  # (+ the xattr name)
                    raise OSError(self.errno, f"injected {errno.errorcode[self.errno]} in {name}: "
                                  f"{os.strerror(self.errno)}")
            return attr(*args, **kwargs)

        return call
