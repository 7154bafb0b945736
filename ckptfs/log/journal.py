"""Durable intent journal and snapshot (the commit log).

Layout under ``<backing>/.ckptfs/``::

    snapshot        one frame: {"format", "epoch", "files": {path: record}, "aborts": [...],
                    "groups": {path: group state}, and the owner's extra_state: "generations",
                    "quarantine": {kept_at: row} (engine/quarantine.py)}
    journal.<E>     frames appended since snapshot epoch E
    staging/        shadow copies being written

A frame is ``<u32 length><u32 crc32(payload)><payload JSON>``.  Reading stops at
the first short or mismatching frame: a torn tail (power loss mid-append) is
indistinguishable from "never written" and is discarded.

Invariant (single in-flight op): every mutating operation appends its intent
durably, performs the operation and makes it durable *before* the next intent
is appended.  Hence after a crash only the last intent of the journal can be
incomplete, and recovery finishes or drops just that one.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptfs import META_DIR, crashpoints
from ckptfs.backing import BackingStore
from ckptfs.layout import POOL, SNAPSHOT, STAGING
from ckptfs.records import FileRecord

FORMAT = 1
_HDR = struct.Struct("<II")
MAX_FRAME = 1 << 30
# default for Journal(compact_every=): the owner compacts once this many entries follow the snapshot
COMPACT_EVERY = int(os.environ.get("CKPTFS_COMPACT_EVERY", "4096"))


class CorruptMetadata(Exception):
    """The snapshot is unreadable; refusing to guess what was committed."""


def encode_frame(obj: Any) -> bytes:
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return _HDR.pack(len(payload), zlib.crc32(payload)) + payload


def decode_frames(data: bytes) -> tuple[list[dict], int]:
    """Decode frames; return (entries, length of the valid prefix)."""
    out: list[dict] = []
    pos = 0
    while pos + _HDR.size <= len(data):
        length, crc = _HDR.unpack_from(data, pos)
        end = pos + _HDR.size + length
        if length > MAX_FRAME or end > len(data):
            break
        payload = data[pos + _HDR.size : end]
        if zlib.crc32(payload) != crc:
            break
        try:
            doc = json.loads(payload)
        except ValueError:
            break
        if not isinstance(doc, dict):
            break  # every frame ckptfs writes is an object: anything else is damage
        out.append(doc)
        pos = end
    return out, pos


def read_whole(store: BackingStore, path: str) -> bytes:
    """The whole of metadata file ``path``; CorruptMetadata if it is not a regular file (a
    directory or a device planted there: it was an IsADirectoryError traceback)."""
    try:
        fd = store.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorruptMetadata(f"{path} is a symbolic link") from None
        raise
    try:
        st = store.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptMetadata(f"{path} is not a regular file")
        size = st.st_size
        chunks = []
        off = 0
        while off < size:
            b = store.pread(fd, min(1 << 24, size - off), off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks)
    finally:
        store.close(fd)


@dataclass
class JournalState:
    epoch: int = 0
    files: dict[str, FileRecord] = field(default_factory=dict)
    aborts: list[dict] = field(default_factory=list)
    groups: dict[str, dict] = field(default_factory=dict)  # path -> GroupState json (groups.py)
    entries: list[dict] = field(default_factory=list)  # journal tail after the snapshot
    # the snapshot was written by a clean shutdown and nothing followed it: no journal entry can
    # have been lost, so recovery need not look for records the files carry (R1)
    clean: bool = False


class Journal:
    """Append-only intent log over a BackingStore.  Appends are atomic with
    respect to each other; ordering of intents vs. operations is the caller's
    job (the filesystem's commit lock)."""

    def __init__(self, store: BackingStore, compact_every: int = COMPACT_EVERY) -> None:
        self.store = store
        self.compact_every = compact_every  # entries after the snapshot that make a compaction due
        self.epoch = 0
        self.fd: int | None = None
        self.size = 0
        self.entries_since_snapshot = 0
        self._lock = threading.Lock()
        self.broken: str | None = None
        # an entry appended unsynced that recovery must see before the next install's rename (a
        # group opened, an abort...): every entry but an install's own ``done`` record, whose file
        # carries the record (engine/commit.py step 6, recovery R1)
        self.owed = False
        # files written unsynced whose content the journal's entries since the snapshot can rebuild
        # (a first seal's manifest/COMMIT, engine/groups.py G12), and their directories: made durable
        # before a compaction drops those entries (:meth:`make_deferred_durable`)
        self.deferred: dict[str, None] = {}
        self.deferred_dirs: dict[str, None] = {}
        # extra top-level snapshot keys (e.g. kept generations); set by the owner
        self.extra_state: Callable[[], dict[str, Any]] | None = None

    @staticmethod
    def journal_path(epoch: int) -> str:
        return f"{META_DIR}/journal.{epoch}"

    def ensure_layout(self) -> None:
        for d in (META_DIR, STAGING, POOL):
            if not self.store.exists(d):
                self.store.mkdir(d, 0o700)
                self.store.fsync_dir(os.path.dirname(d))

    def load(self) -> JournalState:
        st = JournalState()
        if self.store.exists(SNAPSHOT):
            frames, _ = decode_frames(read_whole(self.store, SNAPSHOT))
            if len(frames) != 1 or frames[0].get("format") != FORMAT:
                raise CorruptMetadata(f"{SNAPSHOT} is corrupt or of an unknown format")
            snap = frames[0]
            try:
                st.epoch = int(snap["epoch"])
                st.files = {p: FileRecord.from_json(r) for p, r in snap["files"].items()}
                st.aborts = list(snap.get("aborts", []))
                st.groups = dict(snap.get("groups", {}))
                st.clean = snap.get("clean") is True
            except (KeyError, ValueError, TypeError) as e:
                raise CorruptMetadata(f"{SNAPSHOT}: {e}") from e
        jp = self.journal_path(st.epoch)
        if self.store.exists(jp):
            st.entries, _ = decode_frames(read_whole(self.store, jp))
        st.clean = st.clean and not st.entries
        self.epoch = st.epoch
        return st

    def _open(self) -> int:
        if self.fd is None:
            path = self.journal_path(self.epoch)
            created = not self.store.exists(path)
            self.fd = self.store.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self.size = self.store.fstat(self.fd).st_size
            if created:
                # the journal's own directory entry must be durable before any
                # intent in it is relied upon
                self.store.fsync(self.fd)
                self.store.fsync_dir(META_DIR)
        return self.fd

    def append(self, entry: dict, sync: bool = True) -> int:
        """Append one entry; return the journal size before it (for retract).

        A failed write or fdatasync is cut off again and the error raised; if
        even the cut fails the journal is marked broken and every later append
        fails with EIO (reads keep working).
        """
        frame = encode_frame(entry)
        with self._lock:
            if self.broken:
                raise OSError(errno.EIO, f"ckptfs journal unusable after earlier error: {self.broken}")
            fd = self._open()
            before = self.size
            try:
                self.store.pwrite(fd, frame, before)
            except OSError:
                self._cut(before)
                raise
            self.size += len(frame)
            self.entries_since_snapshot += 1
            if sync:
                try:
                    self.store.fdatasync(fd)
                except OSError:
                    # Never retry and report success (fsyncgate).  The op is
                    # not performed; the frame is cut off and the next append
                    # overwrites its bytes, so it cannot be replayed as done.
                    self._cut(before)
                    raise
                self.owed = False
            elif not entry.get("done"):
                self.owed = True
            return before

    def settle(self) -> bool:
        """Make the entries appended unsynced durable if recovery needs any of them (``owed``):
        an install that journals no intent calls this before its rename, so the journal still
        holds everything that preceded the rename, as a synced intent would have made it.  Whether
        it synced."""
        with self._lock:
            if not self.owed or self.fd is None or self.broken:
                return False
            self.store.fdatasync(self.fd)
            self.owed = False
            return True

    def defer_durable(self, names: list[str], directory: str) -> None:
        """``names`` (in ``directory``) were written unsynced and the entries since the snapshot can
        rebuild them: fsync them (and ``directory``) before those entries are compacted away."""
        with self._lock:
            for n in names:
                self.deferred[n] = None
            self.deferred_dirs[directory] = None

    def make_deferred_durable(self) -> int:
        """fsync every deferred file still there, then their directories; how many files.  Before a
        compaction, and before anything links or renames one of them (a reseal's ``.prev``, a
        rollback to an anchor).  An error leaves them deferred and propagates (never retried as
        if durable)."""
        with self._lock:
            names, dirs = list(self.deferred), list(self.deferred_dirs)
        n = 0
        for name in names:
            try:
                fd = self.store.open(name, os.O_RDONLY)
            except FileNotFoundError:
                continue  # removed since (a quarantined or deleted group's seal)
            try:
                self.store.fsync(fd)
                n += 1
            finally:
                self.store.close(fd)
        for d in dirs:
            if self.store.exists(d):
                self.store.fsync_dir(d)
        with self._lock:
            for name in names:
                self.deferred.pop(name, None)
            for d in dirs:
                self.deferred_dirs.pop(d, None)
        return n

    def _cut(self, size: int) -> None:
        try:
            self.store.ftruncate(self.fd, size)  # type: ignore[arg-type]
            self.size = size
        except OSError as e:
            self.broken = f"could not cut journal back: {e}"

    def retract(self, before: int) -> None:
        """Durably remove the entries appended since ``before`` (a failed op)."""
        with self._lock:
            self._cut(before)
            if not self.broken:
                try:
                    self.store.fdatasync(self.fd)  # type: ignore[arg-type]
                except OSError as e:
                    self.broken = f"fdatasync failed: {e}"

    def close(self) -> None:
        if self.fd is not None:
            self.store.close(self.fd)
            self.fd = None

    def compact(self, files: dict[str, FileRecord], aborts: list[dict],
                groups: dict[str, dict] | None = None, clean: bool = False) -> None:
        """Write a snapshot of ``files`` as epoch+1 and retire the old journal.  ``clean``: the
        last write before a clean shutdown (JournalState.clean).

        Caller guarantees no operation is in flight.  Crash-safe at every step:
        until the new snapshot's rename is durable the old snapshot + journal
        stay authoritative; afterwards the old journal is ignored.
        """
        self.make_deferred_durable()  # the entries that could rebuild them go with this compaction
        new_epoch = self.epoch + 1
        snap = {
            "format": FORMAT,
            "epoch": new_epoch,
            "files": {p: r.to_json() for p, r in files.items()},
            "aborts": aborts[-100:],
            "groups": groups or {},
        }
        if clean:
            snap["clean"] = True
        if self.extra_state is not None:
            for k, v in self.extra_state().items():
                snap.setdefault(k, v)
        tmp = SNAPSHOT + ".tmp"
        if self.store.exists(tmp):
            # After a power loss the last compaction's rename may have persisted
            # its new name but not the removal of the old one: tmp is then a
            # second name of the live snapshot, and O_TRUNC through it would
            # empty the snapshot (found by the model checker, weak model).
            self.store.unlink(tmp)
        fd = self.store.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self.store.pwrite(fd, encode_frame(snap), 0)
            self.store.fsync(fd)
        finally:
            self.store.close(fd)
        self.store.rename(tmp, SNAPSHOT)
        self.store.fsync_dir(META_DIR)
        crashpoints.hit("compact_snapshot")
        self.close()
        self.epoch = new_epoch
        self.entries_since_snapshot = 0
        self.size = 0
        self.owed = False
        for name in self.store.listdir(META_DIR):
            if name.startswith("journal.") and name != f"journal.{new_epoch}":
                self.store.unlink(f"{META_DIR}/{name}")
