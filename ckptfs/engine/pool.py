"""Empty staging files made ahead of need, off the request path (issue 27).

Every new version begins as an empty file in ``.ckptfs/staging``.  Creating it (an inode and a
directory entry on the backing filesystem) was the largest part of a small file's CREATE: on ext4
right after the previous file's commit synced the journal, ~145 us of the ~930 us a small file
cost in the daemon (profile in docs/results/performance-analysis.md).  A :class:`StagingPool` keeps up to
``size`` empty files in ``.ckptfs/staging``, made by its own thread under the names the versions
that take them will have (``staging/<uuid>``): a new version takes one and uses it as it is, no
rename (the pool first made them in ``.ckptfs/pool`` and renamed each into ``staging/``: one
``renameat`` per new file more than a native create: 24-200 us each in the core's profiles of a
small file and of an atomic writer's save; issue 27).

Invariants:

* P1 a pooled file is empty, ``0600``, owned by the daemon, and referenced by nothing until a
  version takes it: recovery deletes every file in ``staging/`` (``recovery.py`` step 4; and
  ``pool/``, where an earlier version kept them) and a clean stop deletes those not taken; no
  journal entry names a pooled file before its version's install intent does;
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
from ckptfs.layout import STAGING

log = logging.getLogger("ckptfs")

POOL_SIZE = 32  # files kept ready; refilled once half are taken


class StagingPool:
    """Pre-made empty staging files (module doc).  Thread-safe; its thread starts at the first
    :meth:`take` (a daemon that never writes makes none)."""

    def __init__(self, store: BackingStore, size: int = POOL_SIZE) -> None:
        self.store = store
        self.size = size
        self.free: collections.deque[tuple[str, int]] = collections.deque()
        self.making: set[str] = set()  # names being created now (not in ``free`` yet)
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopped = False
        self.taken = 0
        self.misses = 0  # takes that found the pool empty (the caller created its file itself)

    def take(self) -> tuple[str, int] | None:
        """(name under ``staging/``, open O_RDWR fd) of an empty file, or None (create one yourself)."""
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

    def held(self) -> set[str]:
        """The staging names of the files it holds, not taken (``staging/`` holds these besides the
        versions in use: P1)."""
        with self.cond:
            return {name for name, _fd in self.free} | self.making

    def _fill(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and len(self.free) > self.size // 2:
                    self.cond.wait()
                if self.stopped:
                    return
                want = self.size - len(self.free)
            made = 0
            for _ in range(want):
                name = f"{STAGING}/{uuid.uuid4().hex}"  # (the name its version will have, P1)
                with self.cond:
                    self.making.add(name)
                try:
                    fd = self.store.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                except OSError as e:
                    log.debug("staging pool: %s (versions create their own files)", e)
                    with self.cond:
                        self.making.discard(name)
                    break
                with self.cond:  # each file usable at once (a take need not wait for the batch)
                    self.making.discard(name)
                    self.free.append((name, fd))
                    made += 1
                    if self.stopped:
                        return  # stop() cleans up what is in ``free``
            with self.cond:
                if self.stopped:
                    return
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
