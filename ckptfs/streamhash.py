"""Blake3 digests of a staged version computed off the FUSE request path.

:class:`AsyncDigest` has the contract of :class:`hashing.IncrementalDigest`
(``update`` / ``truncated`` / ``finish`` / ``copy`` / ``stale``) and produces
exactly the same digests (whole-file blake3 as ``b3sum`` prints it + one
blake3 per 1 MiB chunk), but a write request only *queues* its bytes: one
shared hasher thread consumes them.  Invariants:

* Order: items are hashed in the order ``update`` was called for a digest
  (one FIFO, one consumer thread), and ``update`` is called in write order
  under the version's lock, so the stream hashed is exactly the bytes written
  at offsets 0, 1, 2, ... .
* Sequential-or-stale is decided synchronously in ``update`` (``next_offset``),
  as in IncrementalDigest; a stale digest drops its queued bytes and is
  recomputed from the staged file at commit (``digest_fd``).
* ``finish`` returns only after every queued byte of this digest is hashed.
* Bounded memory: at most ``MAX_PENDING`` bytes are queued over all digests;
  ``update`` blocks (back-pressure on the writer) beyond that, so the daemon's
  RSS does not grow with the checkpoint size.
* Small writes (<= ``INLINE_MAX``) with nothing queued are hashed inline: a
  thread hand-off costs more than hashing a few KiB.
"""

from __future__ import annotations

import collections
import threading

from ckptfs.hashing import IncrementalDigest

MAX_PENDING = 64 << 20
INLINE_MAX = 64 << 10


class _Worker:
    """One daemon thread hashing queued (digest, bytes, offset) items in FIFO order."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: collections.deque[tuple[AsyncDigest, bytes, int]] = collections.deque()
        self.pending = 0
        self.thread: threading.Thread | None = None

    def submit(self, d: AsyncDigest, data: bytes, offset: int) -> None:
        with self.cond:
            while self.pending and self.pending + len(data) > MAX_PENDING:
                self.cond.wait()
            self.queue.append((d, data, offset))
            self.pending += len(data)
            d.queued += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="ckptfs-hasher", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                d, data, offset = self.queue.popleft()
            if not d.stale:
                d.inner.update(data, offset)  # blake3 releases the GIL on large inputs
            with self.cond:
                self.pending -= len(data)
                d.queued -= 1
                self.cond.notify_all()

    def wait(self, d: AsyncDigest) -> None:
        with self.cond:
            while d.queued:
                self.cond.wait()


_worker = _Worker()


class AsyncDigest:
    """IncrementalDigest whose hashing runs on the shared hasher thread."""

    def __init__(self) -> None:
        self.inner = IncrementalDigest()
        self.next_offset = 0
        self.queued = 0  # items of this digest not yet hashed (guarded by the worker's cond)
        self._stale = False

    @property
    def stale(self) -> bool:
        return self._stale

    @stale.setter
    def stale(self, value: bool) -> None:
        self._stale = value
        if value:
            self.inner.stale = True

    @property
    def upto(self) -> int:
        return self.next_offset

    def update(self, data: bytes | memoryview, offset: int) -> None:
        if self._stale:
            return
        if offset != self.next_offset:
            self.stale = True
            return
        self.next_offset += len(data)
        if len(data) <= INLINE_MAX and not self.queued:
            self.inner.update(data, offset)
            return
        _worker.submit(self, data if isinstance(data, bytes) else bytes(data), offset)

    def truncated(self, length: int) -> None:
        if length != self.next_offset:
            self.stale = True

    def finish(self, size: int) -> tuple[str, str] | None:
        """(whole hex, chunk hexes) once all queued bytes are hashed; None if stale."""
        if self._stale or size != self.next_offset:
            return None
        _worker.wait(self)
        return self.inner.finish(size)

    def copy(self) -> AsyncDigest:
        _worker.wait(self)
        other = AsyncDigest()
        other.inner = self.inner.copy()
        other.next_offset = self.next_offset
        other._stale = self._stale
        return other
