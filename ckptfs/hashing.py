"""Incremental blake3 digests of a staged file (whole file + per chunk).

:class:`IncrementalDigest` is fed the writes of a version as they arrive.  It
stays valid only while writes are strictly sequential from offset 0; any other
pattern (seek back, hole, truncate) marks it stale and :func:`digest_fd`
re-reads the file once at commit time.
"""

from __future__ import annotations

import mmap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import blake3

from ckptfs.records import CHUNK_SIZE

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore

PARALLEL_MIN = 4 * CHUNK_SIZE  # below this a second thread costs more than it saves
PARALLEL_BLOCK = 8 * CHUNK_SIZE  # bytes per read: whole chunks, so each block splits into them
PARALLEL_RING = 3  # blocks in flight (read, hashed whole, hashed per chunk)


class IncrementalDigest:
    def __init__(self) -> None:
        self.whole = blake3.blake3()
        self.chunk = blake3.blake3()
        self.chunk_fill = 0
        self.chunks: list[str] = []
        self.upto = 0  # bytes hashed so far (== next expected offset)
        self.stale = False

    def copy(self) -> IncrementalDigest:
        other = IncrementalDigest()
        other.whole = self.whole.copy()
        other.chunk = self.chunk.copy()
        other.chunk_fill = self.chunk_fill
        other.chunks = list(self.chunks)
        other.upto = self.upto
        other.stale = self.stale
        return other

    def update(self, data: bytes | memoryview, offset: int) -> None:
        if self.stale:
            return
        if offset != self.upto:
            self.stale = True
            return
        view = memoryview(data)
        self.whole.update(view)
        pos = 0
        while pos < len(view):
            take = min(CHUNK_SIZE - self.chunk_fill, len(view) - pos)
            self.chunk.update(view[pos : pos + take])
            self.chunk_fill += take
            pos += take
            if self.chunk_fill == CHUNK_SIZE:
                self.chunks.append(self.chunk.hexdigest())
                self.chunk = blake3.blake3()
                self.chunk_fill = 0
        self.upto += len(view)

    def truncated(self, length: int) -> None:
        if length != self.upto:
            self.stale = True

    def finish(self, size: int) -> tuple[str, str] | None:
        """(whole hex, chunk hexes) if still valid for a file of ``size`` bytes."""
        if self.stale or size != self.upto:
            return None
        chunks = list(self.chunks)
        if self.chunk_fill:
            chunks.append(self.chunk.hexdigest())
        return self.whole.hexdigest(), "".join(chunks)


def digest_fd(store: BackingStore, fd: int, size: int, parallel: bool = False) -> tuple[str, str]:
    """Hash ``size`` bytes of fd from offset 0 through the backing store.

    ``parallel``: the per-chunk digests are computed on a second thread while this one reads and
    feeds the whole-file digest (blake3 releases the GIL): about half the time on two cores for a
    file the page cache holds (a writer's staging file at seal, docs/design.md W1).  Same result."""
    if not parallel or size <= PARALLEL_MIN:
        return _digest_serial(store, fd, size)
    whole = blake3.blake3()
    chunk_hexes: list[list[str]] = []

    def chunks_of(mv: memoryview) -> list[str]:
        return [blake3.blake3(mv[i:i + CHUNK_SIZE]).hexdigest() for i in range(0, len(mv), CHUNK_SIZE)]

    pool = hasher_pool()
    # a ring of PARALLEL_RING blocks in anonymous mappings, reused for the whole file: a bytes
    # object per block would leave freed blocks in malloc's arenas (one per thread), and the
    # daemon's RSS grew by hundreds of MiB (bench W6)
    ring = _take_ring()
    pending: list[Future[list[str]] | None] = [None] * PARALLEL_RING
    try:
        off, i = 0, 0
        mv: memoryview | None = None
        while off < size:
            slot = i % PARALLEL_RING
            job = pending[slot]
            if job is not None:  # its block is reused now: its chunks first
                chunk_hexes.append(job.result())
            want = min(PARALLEL_BLOCK, size - off)
            mv = memoryview(ring[slot])[:want]
            got = store.preadinto(fd, mv, off)
            if got <= 0:
                raise OSError(5, "file shrank while hashing")
            if got < want and got % CHUNK_SIZE:
                raise OSError(5, "short read while hashing")  # chunk boundaries must stay aligned
            mv = mv[:got]
            pending[slot] = pool.submit(chunks_of, mv)
            whole.update(mv)
            off += got
            i += 1
        for k in range(i, i + PARALLEL_RING):  # the rest, in file order
            job = pending[k % PARALLEL_RING]
            if job is not None:
                chunk_hexes.append(job.result())
                pending[k % PARALLEL_RING] = None
    finally:
        mv = None  # (a view of a ring block keeps its mapping open)
        for job in pending:
            if job is not None:
                job.cancel()
                try:
                    job.result()
                except Exception:  # (cancelled, or the error already raised above)
                    pass
        _give_ring(ring)
    return whole.hexdigest(), "".join(h for hs in chunk_hexes for h in hs)


_POOL_LOCK = threading.Lock()
_RINGS: list[list[mmap.mmap]] = []  # at most one kept: its pages stay mapped (24 MiB), no faults per file


def _take_ring() -> list[mmap.mmap]:
    with _POOL_LOCK:
        if _RINGS:
            return _RINGS.pop()
    return [mmap.mmap(-1, PARALLEL_BLOCK) for _ in range(PARALLEL_RING)]


def _give_ring(ring: list[mmap.mmap]) -> None:
    with _POOL_LOCK:
        if not _RINGS:
            _RINGS.append(ring)
            return
    for m in ring:
        try:
            m.close()
        except BufferError:
            pass  # a view still exported: freed with it


_POOL: ThreadPoolExecutor | None = None


def hasher_pool() -> ThreadPoolExecutor:
    """The chunk hashers, shared by every parallel digest and whole-file verify (integrity/reads.py),
    started once: a thread per file would cost more than it saves on a checkpoint's small shards."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(2, thread_name_prefix="ckptfs-digest")
        return _POOL


def _digest_serial(store: BackingStore, fd: int, size: int) -> tuple[str, str]:
    d = IncrementalDigest()
    off = 0
    while off < size:
        buf = store.pread(fd, min(CHUNK_SIZE, size - off), off)
        if not buf:
            raise OSError(5, "file shrank while hashing")
        d.update(buf, off)
        off += len(buf)
    res = d.finish(size)
    assert res is not None
    return res
