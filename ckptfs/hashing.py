"""Incremental blake3 digests of a staged file (whole file + per chunk).

:class:`IncrementalDigest` is fed the writes of a version as they arrive.  It
stays valid only while writes are strictly sequential from offset 0; any other
pattern (seek back, hole, truncate) marks it stale and :func:`digest_fd`
re-reads the file once at commit time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import blake3

from ckptfs.records import CHUNK_SIZE

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore


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


def digest_fd(store: BackingStore, fd: int, size: int) -> tuple[str, str]:
    """Hash ``size`` bytes of fd from offset 0 through the backing store."""
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
