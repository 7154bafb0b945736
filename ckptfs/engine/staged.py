"""Staged versions and open-file handles (in-memory state of the write path).

A :class:`Version` is one shadow copy in ``.ckptfs/staging``: the bytes a path
will hold once committed.  Life cycle::

    open --(flush/fsync: checks pass)--> committing/queued --> installed
      \\--(release while still dirty and doomed, or unlinked)--> discarded

Invariant: a version's staging file is written only while ``state == "open"``;
once it leaves ``open`` its bytes are frozen (a later write through the same
handle first clones it into a new version: copy-on-write).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ckptfs.records import FileRecord
from ckptfs.streamhash import AsyncDigest

# Version states (the life cycle above)
OPEN = "open"  # being written; the only state in which its staging file changes
QUEUED = "queued"  # sealed, waiting for the async committer
COMMITTING = "committing"  # sealed, being installed
INSTALLED = "installed"  # renamed over its path: it is the committed version
DISCARDED = "discarded"  # never installed; its staging file is gone


@dataclass(eq=False)
class Version:
    path: str
    staging: str
    fd: int
    digest: AsyncDigest = field(default_factory=AsyncDigest)  # hashed off the request path
    size: int = 0
    dirty: bool = True
    state: str = OPEN  # OPEN | QUEUED | COMMITTING | INSTALLED | DISCARDED
    refs: int = 0  # handles referencing this version
    writers: int = 0  # write handles referencing this version
    doomed: str | None = None  # reason it must never commit (writer killed...)
    doomed_errno: int | None = None  # errno of the failed write that doomed it (close reports it)
    unlinked: bool = False
    error: OSError | None = None  # async commit failure
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    record: FileRecord | None = None
    ino: int = 0  # backing inode number of the staging file (inodes.InodeMap)


@dataclass(eq=False)
class Handle:
    path: str
    writable: bool
    fd: int | None = None  # backing fd of the committed file (reads before first write)
    version: Version | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
