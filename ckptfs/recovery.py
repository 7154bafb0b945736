"""Crash recovery: bring the backing directory to a committed state.

Algorithm (idempotent; a crash at any step is repaired by running it again):

1. Load the snapshot and the journal tail (torn tail frames are dropped).
2. Every intent except the last one completed durably before the next intent
   was appended (single in-flight invariant, see journal.py): replay it into
   the record map.
3. Finish the last intent if its effect can be completed from durable state
   (roll forward), otherwise drop it (the path keeps its previous version).
4. Delete all staging debris: no staged file is referenced any more.
5. Drop records whose file vanished or was replaced while unmounted.
6. Compact: write a fresh snapshot (new epoch) and retire the journal.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass, field

from . import crashpoints
from .backing import BackingStore
from .hashing import digest_fd
from .journal import STAGING, Journal
from .records import FileRecord

log = logging.getLogger("ckptfs.recovery")


def parent(path: str) -> str:
    return os.path.dirname(path)


def move_prefix(mapping: dict, src: str, dst: str) -> None:
    """Rename key ``src`` and every key under ``src/`` to live under ``dst``."""
    pre = src + "/"
    for key in [k for k in mapping if k == src or k.startswith(pre)]:
        mapping[dst + key[len(src) :]] = mapping.pop(key)


def drop_prefix(mapping: dict, path: str) -> None:
    pre = path + "/"
    for key in [k for k in mapping if k == path or k.startswith(pre)]:
        del mapping[key]


def apply_entry(files: dict[str, FileRecord], e: dict) -> None:
    """Apply a completed journal entry to the record map."""
    op = e["op"]
    if op == "install":
        files[e["path"]] = FileRecord.from_json(e["rec"])
    elif op == "unlink":
        files.pop(e["path"], None)
    elif op == "rename":
        drop_prefix(files, e["dst"])
        move_prefix(files, e["src"], e["dst"])
    elif op == "symlink":
        files.pop(e["path"], None)


def _staged_matches(store: BackingStore, staging: str, rec: FileRecord) -> bool:
    fd = store.open(staging, os.O_RDONLY)
    try:
        if store.fstat(fd).st_size != rec.size:
            return False
        whole, chunks = digest_fd(store, fd, rec.size)
        return whole == rec.blake3 and chunks == rec.chunks
    finally:
        store.close(fd)


def _same_file(store: BackingStore, a: str, b: str) -> bool:
    """True if ``a`` and ``b`` are two names of one regular file."""
    try:
        sa, sb = store.lstat(a), store.lstat(b)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(sa.st_mode) and sa.st_ino == sb.st_ino and sa.st_dev == sb.st_dev


def finish_inflight(store: BackingStore, e: dict) -> bool:
    """Complete the last journal intent on disk.  True if it now holds."""
    op = e["op"]
    if op == "install":
        rec = FileRecord.from_json(e["rec"])
        path, staging = e["path"], e["staging"]
        if store.exists(staging):
            if not _staged_matches(store, staging, rec):
                return False
            store.rename(staging, path)
            store.fsync_dir(parent(path))
            return True
        try:
            st = store.lstat(path)
        except FileNotFoundError:
            return False
        return st.st_ino == rec.ino and st.st_size == rec.size
    if op == "unlink":
        if store.exists(e["path"]):
            store.unlink(e["path"])
            store.fsync_dir(parent(e["path"]))
        return True
    if op == "rename":
        src, dst = e["src"], e["dst"]
        if store.exists(src) and _same_file(store, src, dst):
            # the rename's new entry persisted, the removal of the old one did
            # not; rename() between two names of one file does nothing (POSIX)
            store.unlink(src)
            store.fsync_dir(parent(src))
        elif store.exists(src):
            store.rename(src, dst)
            store.fsync_dir(parent(dst))
            store.fsync_dir(parent(src))
        return True
    if op == "mkdir":
        if not store.exists(e["path"]):
            store.mkdir(e["path"], int(e.get("mode", 0o755)))
            store.fsync_dir(parent(e["path"]))
        return True
    if op == "rmdir":
        if store.exists(e["path"]):
            try:
                store.rmdir(e["path"])
            except OSError as err:
                if err.errno != errno.ENOTEMPTY:
                    raise
                return False
            store.fsync_dir(parent(e["path"]))
        return True
    if op == "symlink":
        if not store.exists(e["path"]):
            store.symlink(e["target"], e["path"])
            store.fsync_dir(parent(e["path"]))
        return True
    raise ValueError(f"unknown journal op {op!r}")


@dataclass
class RecoveryReport:
    replayed: int = 0
    inflight: str | None = None
    inflight_completed: bool = False
    staging_removed: int = 0
    records_dropped: list[str] = field(default_factory=list)
    files: dict[str, FileRecord] = field(default_factory=dict)
    aborts: list[dict] = field(default_factory=list)

    def summary(self) -> str:
        s = f"replayed {self.replayed} journal entries"
        if self.inflight:
            s += f"; in-flight {self.inflight} {'completed' if self.inflight_completed else 'rolled back'}"
        s += f"; removed {self.staging_removed} staging files"
        if self.records_dropped:
            s += f"; {len(self.records_dropped)} records of files changed while unmounted dropped"
        return s


def recover(store: BackingStore, journal: Journal | None = None) -> RecoveryReport:
    journal = journal or Journal(store)
    journal.ensure_layout()
    state = journal.load()
    rep = RecoveryReport(files=state.files, aborts=state.aborts)
    ops = []
    for e in state.entries:
        if e.get("op") == "abort":
            rep.aborts.append(e)
        else:
            ops.append(e)
    for e in ops[:-1]:
        apply_entry(rep.files, e)
        rep.replayed += 1
    if ops:
        last = ops[-1]
        rep.inflight = f"{last['op']} {last.get('path') or last.get('src')}"
        rep.inflight_completed = finish_inflight(store, last)
        if rep.inflight_completed:
            apply_entry(rep.files, last)
        rep.replayed += 1
    crashpoints.hit("recovery_replayed")
    staged = store.listdir(STAGING)
    for name in staged:
        store.unlink(f"{STAGING}/{name}")
    if staged:
        store.fsync_dir(STAGING)
    rep.staging_removed = len(staged)
    for path, rec in list(rep.files.items()):
        try:
            st = store.lstat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != rec.size or (rec.ino and st.st_ino != rec.ino):
            del rep.files[path]
            rep.records_dropped.append(path)
    journal.compact(rep.files, rep.aborts)
    return rep
