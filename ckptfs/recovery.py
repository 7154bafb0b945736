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
6. Settle groups (groups.py): a group still open was torn by the crash and is
   moved into quarantine; a sealed group whose COMMIT/manifest does not verify
   or whose files are missing is corrupt and quarantined too; retired groups'
   trash is purged.  Every move has a deterministic target, so a crash during
   this step is finished by the next run.
7. Compact: write a fresh snapshot (new epoch) and retire the journal.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass, field

from . import crashpoints
from .backing import BackingStore
from .groups import CORRUPT, OPEN, QUARANTINE, SEALED, TORN, TRASH, TRASHED, GroupState, SealError, read_seal
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


def apply_entry(files: dict[str, FileRecord], e: dict, groups: dict[str, GroupState] | None = None) -> None:
    """Apply a completed journal entry to the record map (and the group map)."""
    op = e["op"]
    if groups is not None:
        apply_group_entry(files, groups, e)
    if op == "install":
        files[e["path"]] = FileRecord.from_json(e["rec"])
    elif op == "unlink":
        files.pop(e["path"], None)
    elif op == "rename":
        drop_prefix(files, e["dst"])
        move_prefix(files, e["src"], e["dst"])
    elif op == "symlink":
        files.pop(e["path"], None)


def apply_group_entry(files: dict[str, FileRecord], groups: dict[str, GroupState], e: dict) -> None:
    op = e["op"]
    if op == "group_open":
        groups[e["path"]] = GroupState(path=e["path"], rule=e["rule"], id=e.get("id", ""), state=OPEN,
                                       created_at=float(e.get("time", 0)), step=e.get("step"))
    elif op == "group_seal":
        g = groups.get(e["path"])
        if g is not None:
            g.state, g.manifest_blake3 = SEALED, e["manifest"]
            g.sealed_at, g.files, g.bytes = float(e.get("time", 0)), int(e.get("files", 0)), int(e.get("bytes", 0))
            g.reason = ""
    elif op in ("group_quarantine", "group_retire"):
        g = groups.get(e["path"])
        if g is not None:
            g.state = e.get("state", TRASHED)
            g.moved_to, g.reason = e["to"], e.get("reason", "")
            if g.state == TRASHED:
                del groups[e["path"]]
        drop_prefix(files, e["path"])
        groups_keys_under = [k for k in groups if k.startswith(e["path"] + "/")]
        for k in groups_keys_under:
            del groups[k]
    elif op == "group_forget":
        groups.pop(e["path"], None)
    elif op == "rename":
        live = {k: v for k, v in groups.items() if v.state in (OPEN, SEALED)}
        for k in live:
            del groups[k]
        drop_prefix(live, e["dst"])
        move_prefix(live, e["src"], e["dst"])
        for k, g in live.items():
            g.path = k
            groups[k] = g
    elif op == "rmdir":
        g = groups.get(e["path"])
        if g is not None and g.state in (OPEN, SEALED):
            del groups[e["path"]]


def quarantine_target(g: GroupState) -> str:
    return f"{QUARANTINE}/{g.id or int(g.created_at * 1000)}"


def move_group(store: BackingStore, path: str, to: str) -> None:
    """Move a group directory into .ckptfs (quarantine or trash); idempotent."""
    top = os.path.dirname(to)
    if not store.exists(top):
        store.mkdir(top, 0o700)
        store.fsync_dir(parent(top))
    if store.exists(path) and not store.exists(to):
        store.rename(path, to)
        store.fsync_dir(parent(path))
        store.fsync_dir(top)


def _sealed_problem(store: BackingStore, g: GroupState) -> str | None:
    """Why a sealed group cannot be trusted, or None (G1 + files present)."""
    try:
        manifest, digest = read_seal(store, g.id)
    except SealError as e:
        return str(e)
    if g.manifest_blake3 and digest != g.manifest_blake3:
        return f"manifest digest {digest} is not the one journaled at seal ({g.manifest_blake3})"
    for rel, rj in manifest["files"].items():
        try:
            st = store.lstat(f"{g.path}/{rel}")
        except OSError:
            return f"file {rel} listed in the manifest is missing"
        if st.st_size != int(rj.get("size", -1)):
            return f"file {rel} has size {st.st_size}, manifest says {rj.get('size')}"
    return None


def settle_groups(store: BackingStore, files: dict[str, FileRecord], groups: dict[str, GroupState]) -> list[str]:
    """Quarantine torn (still open) and corrupt (unverifiable) groups; purge trash."""
    notes: list[str] = []
    for path, g in list(groups.items()):
        if g.state in (TORN, CORRUPT):
            continue
        target = quarantine_target(g)
        if g.state == OPEN:
            if not store.exists(path):
                if store.exists(target):  # moved by an interrupted earlier recovery
                    g.state, g.moved_to, g.reason = TORN, target, "not sealed before the crash"
                else:
                    del groups[path]
                continue
            state, reason = TORN, "not sealed before the crash (no COMMIT)"
        else:
            if not store.exists(path):
                del groups[path]  # deleted while unmounted
                continue
            problem = _sealed_problem(store, g)
            if problem is None:
                continue
            state, reason = CORRUPT, f"seal does not verify: {problem}"
        move_group(store, path, target)
        drop_prefix(files, path)
        g.state, g.moved_to, g.reason = state, target, reason
        notes.append(f"{path}: {state} ({reason}) -> {target}")
        log.warning("group %s is %s: %s; moved to %s", path, state, reason, target)
    if store.exists(TRASH):
        for name in store.listdir(TRASH):
            rmtree(store, f"{TRASH}/{name}")
    return notes


def rmtree(store: BackingStore, path: str) -> None:
    """Remove ``path`` and everything under it through the store."""
    try:
        st = store.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for name in store.listdir(path):
            rmtree(store, f"{path}/{name}")
        store.rmdir(path)
    else:
        store.unlink(path)


def _staged_matches(store: BackingStore, staging: str, rec: FileRecord) -> bool:
    fd = store.open(staging, os.O_RDONLY)
    try:
        if store.fstat(fd).st_size != rec.size:
            return False
        whole, chunks = digest_fd(store, fd, rec.size)
        return whole == rec.blake3 and chunks == rec.chunks
    finally:
        store.close(fd)


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
        if store.exists(src):
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
    if op in ("group_open", "group_seal", "group_forget"):
        return True  # state-only entries (a seal's COMMIT is durable before its entry)
    if op in ("group_quarantine", "group_retire"):
        move_group(store, e["path"], e["to"])
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
    groups: dict[str, GroupState] = field(default_factory=dict)
    group_notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        s = f"replayed {self.replayed} journal entries"
        if self.inflight:
            s += f"; in-flight {self.inflight} {'completed' if self.inflight_completed else 'rolled back'}"
        s += f"; removed {self.staging_removed} staging files"
        if self.records_dropped:
            s += f"; {len(self.records_dropped)} records of files changed while unmounted dropped"
        if self.group_notes:
            s += f"; groups hidden: {'; '.join(self.group_notes)}"
        return s


def recover(store: BackingStore, journal: Journal | None = None) -> RecoveryReport:
    journal = journal or Journal(store)
    journal.ensure_layout()
    state = journal.load()
    rep = RecoveryReport(files=state.files, aborts=state.aborts,
                         groups={p: GroupState.from_json(g) for p, g in state.groups.items()})
    ops = []
    for e in state.entries:
        if e.get("op") == "abort":
            rep.aborts.append(e)
        else:
            ops.append(e)
    for e in ops[:-1]:
        apply_entry(rep.files, e, rep.groups)
        rep.replayed += 1
    if ops:
        last = ops[-1]
        rep.inflight = f"{last['op']} {last.get('path') or last.get('src')}"
        rep.inflight_completed = finish_inflight(store, last)
        if rep.inflight_completed:
            apply_entry(rep.files, last, rep.groups)
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
    rep.group_notes = settle_groups(store, rep.files, rep.groups)
    journal.compact(rep.files, rep.aborts, {p: g.to_json() for p, g in rep.groups.items()})
    return rep
