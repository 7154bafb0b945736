"""Empty staging files made ahead of need, off the request path (issue 27).

Every new version begins as an empty file in ``.ckptfs/staging``.  Creating it (an inode and a
directory entry on the backing filesystem) was the largest part of a small file's CREATE: on ext4
right after the previous file's commit synced the journal, ~145 us of the ~930 us a small file
cost in the daemon (profile in docs/results/performance-analysis.md).  A :class:`StagingPool` keeps up to
``size`` empty files in ``.ckptfs/pool``, made by its own thread; a new version takes one and
renames it into ``staging/`` under its own name (a rename is cheaper than a create there, and keeps
``staging/`` holding exactly the versions in use).

Invariants:

* P1 a pooled file is empty, ``0600``, owned by the daemon, and referenced by nothing: recovery
  deletes ``pool/`` with ``staging/`` (``recovery.py`` step 4) and a clean stop deletes what is left;
  no commit ever names a file in ``pool/`` (a version's staging name is always under ``staging/``);
* P2 nothing about a version depends on the pool: where it is empty, stopped or failing (a full
  disk), :meth:`take` returns None and the version's file is created on the request path as before;
  the caller sets the owner, mode and times of the file it takes (it was made earlier);
* P3 the pool's own files are never synced: they matter to no crash state.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import uuid

from ckptfs.backing import BackingStore
from ckptfs.layout import POOL

log = logging.getLogger("ckptfs")

POOL_SIZE = 32  # files kept ready; refilled once half are taken


class StagingPool:
    """Pre-made empty staging files (module doc).  Thread-safe; its thread starts at the first
    :meth:`take` (a daemon that never writes makes none)."""

    def __init__(self, store: BackingStore, size: int = POOL_SIZE) -> None:
        self.store = store
        self.size = size
        self.free: collections.deque[tuple[str, int]] = collections.deque()
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopped = False
        self.taken = 0
        self.misses = 0  # takes that found the pool empty (the caller created its file itself)

    def take(self) -> tuple[str, int] | None:
        """(name under ``pool/``, open O_RDWR fd) of an empty file, or None (create one yourself)."""
        with self.cond:
            if self.stopped:
                return None
            if self.thread is None:
                self.thread = threading.Thread(target=self._fill, name="ckptfs-pool", daemon=True)
                self.thread.start()
            got = self.free.popleft() if self.free else None
            if got is None:
                self.misses += 1
            else:
                self.taken += 1
            if len(self.free) <= self.size // 2:
                self.cond.notify_all()
            return got

    def _fill(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and len(self.free) > self.size // 2:
                    self.cond.wait()
                if self.stopped:
                    return
                want = self.size - len(self.free)
            made = []
            for _ in range(want):
                name = f"{POOL}/{uuid.uuid4().hex}"
                try:
                    fd = self.store.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                except OSError as e:
                    log.debug("staging pool: %s (versions create their own files)", e)
                    break
                made.append((name, fd))
            with self.cond:
                self.free.extend(made)
                if self.stopped:
                    return  # stop() cleans up what is in ``free``
                if not made:
                    self.cond.wait(5.0)  # a full disk, say: try again later (P2: nobody waits for us)

    def stop(self) -> None:
        """Stop the thread; close and delete the files not taken (P1)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
            t = self.thread
        if t is not None:
            t.join(10)
        with self.cond:
            left = list(self.free)
            self.free.clear()
        for name, fd in left:
            try:
                self.store.close(fd)
                self.store.unlink(name)
            except OSError as e:
                log.debug("staging pool: %s: %s", name, e)
