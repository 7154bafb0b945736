"""Per-file commit records: what a committed version of a path is.

A :class:`FileRecord` is immutable and describes exactly one committed version
of one path: its size, whole-file blake3, per-chunk blake3 digests
(``CHUNK_SIZE`` bytes each, last one short), generation (1 for the first
version of a path, +1 per commit) and commit time.  ``ino`` is the inode of the
staged file; rename preserves it, so recovery can tell whether an install
happened without re-hashing.

The record also travels with the file: :data:`XATTR` (``user.ckptfs.rec``, a backing-file
extended attribute, never shown through the mount), set on the staged file before the fsync that
makes its bytes durable (docs/design.md, "Commit protocol").  A record whose journal entry a power
loss dropped is found again there by recovery (R1).  A file of at most one chunk carries it in
:data:`COMPACT` form (57 bytes: fits in an ext4 inode's own attribute space, so the file needs no
extended-attribute block: one block less to allocate and to write at its fsync, and ``du`` counts
what it counts natively; issue 27); a larger one as JSON.  Both are read.
"""

from __future__ import annotations

import json
import math
import struct
import time
from dataclasses import dataclass, fields

CHUNK_SIZE = 1 << 20  # 1 MiB: granularity of chunk digests and verify-on-read
XATTR = "user.ckptfs.rec"  # the record, carried by the committed inode itself


@dataclass(frozen=True)
class FileRecord:
    size: int
    blake3: str
    chunks: str  # concatenated hex digests, 64 chars per chunk
    generation: int
    committed_at: float
    ino: int = 0
    chunk_size: int = CHUNK_SIZE

    def to_json(self) -> dict:
        # the fields, in declaration order, as ``dataclasses.asdict`` gives them without its deep
        # copy (every field is a str, int or float): ~60 us less per commit (issue 27)
        return {f: getattr(self, f) for f in _FIELDS}

    @classmethod
    def from_json(cls, d: dict) -> FileRecord:
        rec = cls(
            size=int(d["size"]),
            blake3=str(d["blake3"]),
            chunks=str(d["chunks"]),
            generation=int(d["generation"]),
            committed_at=float(d["committed_at"]),
            ino=int(d.get("ino", 0)),
            chunk_size=int(d.get("chunk_size", CHUNK_SIZE)),
        )
        rec.validate()
        return rec

    def validate(self) -> None:
        """Raise ValueError if the record is internally inconsistent."""
        n_chunks = (self.size + self.chunk_size - 1) // self.chunk_size
        if self.size < 0 or len(self.blake3) != 64 or len(self.chunks) != 64 * n_chunks:
            raise ValueError("inconsistent file record")

    def chunk_digest(self, i: int) -> str:
        return self.chunks[64 * i : 64 * (i + 1)]

    def committed_iso(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.committed_at))


_FIELDS = tuple(f.name for f in fields(FileRecord))


# version 1, the raw blake3 digest, size, generation, committed_at, ino (a JSON value starts "{")
COMPACT = struct.Struct("<B32sIIdQ")
COMPACT_VERSION = 1


def to_xattr(rec: FileRecord) -> bytes:
    """The value of :data:`XATTR` for ``rec``: :data:`COMPACT` where it says all of ``rec`` (one
    chunk or none, the default chunk size, fields in range), else JSON."""
    if (rec.chunk_size == CHUNK_SIZE and rec.size <= CHUNK_SIZE and rec.chunks == (rec.blake3 if rec.size else "")
            and 0 <= rec.generation < 1 << 32 and 0 <= rec.ino < 1 << 64 and math.isfinite(rec.committed_at)):
        try:
            return COMPACT.pack(COMPACT_VERSION, bytes.fromhex(rec.blake3), rec.size, rec.generation,
                                rec.committed_at, rec.ino)
        except ValueError:
            pass  # (not hex: a record validate() would refuse anyway)
    return json.dumps(rec.to_json(), sort_keys=True, separators=(",", ":")).encode()


def from_xattr(value: bytes) -> FileRecord:
    """The record an :data:`XATTR` value holds; ValueError/KeyError/TypeError if it holds none."""
    if len(value) == COMPACT.size and value[0] == COMPACT_VERSION:
        _v, digest, size, generation, at, ino = COMPACT.unpack(value)
        if not math.isfinite(at):
            raise ValueError("not a record")
        h = digest.hex()
        rec = FileRecord(size=size, blake3=h, chunks=h if size else "", generation=generation, committed_at=at,
                         ino=ino)
        rec.validate()
        return rec
    d = json.loads(value)
    if not isinstance(d, dict):
        raise ValueError("not a record")
    return FileRecord.from_json(d)
