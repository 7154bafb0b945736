"""Crash recovery: bring the backing directory to a committed state.

Algorithm (idempotent; a crash at any step is repaired by running it again):

1. Load the snapshot and the journal tail (log/metadata.py: torn tail frames are dropped, damaged
   parts are never trusted).
2. Replay (engine/replay.py) every intent except the last one: each completed durably before the
   next intent was appended (single in-flight invariant, I2), so it goes into the record map.
3. Finish the last intent if its effect can be completed from durable state (roll forward),
   otherwise drop it (the path keeps its previous version).  An async group commit's intent
   (``install_batch``, engine/commit.py C5) is finished file by file, in close order.
4. Delete all staging debris: no staged file is referenced any more.
5. Reconcile records with the files on disk (offline changes, see :func:`classify`): a record is
   dropped if its file vanished or was replaced by a *new* file; it is kept (and verification will
   flag the file) if the committed inode was changed in place or now sits at another committed path.
   Then every regular file left without a record gets the one its inode carries, if any
   (:func:`adopt_carried`, R1): an install whose journal entry a power loss dropped (the entry is
   written after the install, unsynced; the record was made durable with the file's bytes).
6. Reconcile kept generations (engine/generations.py) the same way.
7. Settle groups (:func:`settle_groups`): a group still open was torn by the crash and is moved into
   quarantine (or rolled back to its seal, G11); a sealed group whose COMMIT/manifest does not
   verify or whose files are missing is corrupt and quarantined too; deletions stopped half-way
   are finished or undone (G9).  Every move has a deterministic target, so a crash during this step
   is finished by the next run.
8. Compact: write a fresh snapshot (new epoch) and retire the journal.

Damaged metadata is never trusted and never raises: with a corrupt snapshot or a journal corrupt
before its tail, journal entries are only hints (no roll-forward of the last intent, which might
be stale), kept only where step 5 confirms them on disk.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptfs import META_DIR, crashpoints, trust
from ckptfs.backing import BackingStore
from ckptfs.engine import quarantine as qt
from ckptfs.engine.generations import GenEntry, link_for_recovery, reconcile
from ckptfs.engine.replay import BATCH, PARSE_ERRORS, Replayed, batch_items, replay
from ckptfs.engine.rollback import OP as ROLLBACK
from ckptfs.engine.rollback import apply_rollback, apply_rollback_state, make_durable, rollback_plan
from ckptfs.engine.seals import (
    CORRUPT,
    OPEN,
    SEALED,
    TORN,
    TRASHED,
    GroupState,
    SealError,
    build_manifest,
    lineage,
    quarantine_target,
    read_seal,
    rebuild_seal,
    write_seal,
)
from ckptfs.hashing import digest_fd
from ckptfs.layout import (
    POOL,
    QUARANTINE,
    SNAPSHOT,
    STAGING,
    TRASH,
    drop_prefix,
    move_group,
    move_prefix,
    move_tree_back,
    parent,
    rmtree,
)
from ckptfs.log.journal import Journal, read_whole
from ckptfs.log.metadata import load_trusted
from ckptfs.records import XATTR, FileRecord, from_xattr
from ckptfs.rules import TEMP_OF_RE

log = logging.getLogger("ckptfs.recovery")


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


def _seal_records_only(problem: str) -> bool:
    """Whether ``problem`` (from :func:`_sealed_problem`) is about the seal's own records in
    ``.ckptfs/groups``, not about the group's files."""
    return not problem.startswith("file ")


def _members_verify(store: BackingStore, files: dict[str, FileRecord], g: GroupState) -> bool:
    """Whether every file recorded in g is there and verifies against its record, and they are as
    many as g held when it was sealed (a file deleted while unmounted lost its record: incomplete)."""
    from ckptfs.hashing import digest_fd

    pre = g.path + "/"
    members = {k: r for k, r in files.items() if k.startswith(pre)}
    if not members or (g.files and len(members) < g.files):
        return False
    for k, r in members.items():
        try:
            if store.lstat(k).st_size != r.size:
                return False
            fd = store.open(k, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            whole, _chunks = digest_fd(store, fd, r.size)
        except OSError:
            return False
        finally:
            store.close(fd)
        if whole != r.blake3:
            return False
    return True


def _hidden(store: BackingStore, files: dict[str, FileRecord], groups: dict[str, GroupState],
            quarantine: qt.Table, g: GroupState, state: str, reason: str, target: str) -> str:
    """g is (now) at ``target``: it leaves the group table for a row of the quarantine table."""
    q = qt.put_group(quarantine, files, g, {"path": g.path, "to": target, "state": state, "reason": reason,
                                             "time": time.time()})
    if not q.files:  # moved by an interrupted earlier run: its records went with the files (classify)
        q.files, q.bytes, _ = qt.on_disk(store, target)
    drop_prefix(files, g.path)
    groups.pop(g.path, None)
    g.state, g.moved_to, g.reason, g.tentative = state, target, reason, False
    log.warning("group %s is %s: %s; moved to %s", g.path, state, reason, target)
    return f"{g.path}: {state} ({reason}) -> {target}"


def settle_groups(store: BackingStore, files: dict[str, FileRecord], groups: dict[str, GroupState],
                  gens: dict[str, list[GenEntry]] | None = None, journal: Journal | None = None,
                  persist: Callable[[], None] | None = None, quarantine: qt.Table | None = None,
                  seal_parts: bool = False) -> list[str]:
    """Reseal late groups (G10), roll torn re-saves back to their seal (G11, needs ``journal`` and
    ``persist``), quarantine other torn (still open) and corrupt (unverifiable) groups (each a row of
    ``quarantine``, engine/quarantine.py); purge trash.

    ``seal_parts`` (``mount --node-part``, docs/mirror.md): a first save's open group holding
    committed files is a node's part of a multi-node checkpoint, sealed (as the live daemon seals
    it when idle) instead of torn; whether the whole checkpoint is complete is decided remotely,
    from its completion record (mirror protocol M3), never from this node's part.

    ``persist`` makes the state recovered so far durable (a compaction) before the first rollback
    is journaled: the replayed in-flight entry may have been dropped, and once another entry follows
    it, a later recovery would take it as done (found by the model checker, weak model)."""
    notes: list[str] = []
    persisted = False
    table: qt.Table = quarantine if quarantine is not None else {}
    for path, g in list(groups.items()):
        if g.state in (TORN, CORRUPT, TRASHED):
            continue
        target = quarantine_target(g)
        if g.state == OPEN:
            if not store.exists(path):
                if store.exists(target):  # moved by an interrupted earlier recovery
                    notes.append(_hidden(store, files, groups, table, g, TORN, "not sealed before the crash", target))
                else:
                    del groups[path]
                continue
            if g.tentative:  # made by mkdir, no checkpoint file yet (issue 10)
                try:
                    entries = store.listdir(path)
                except OSError:  # replaced by a file while unmounted
                    del groups[path]
                    continue
                if entries:
                    del groups[path]  # ordinary files only: an ordinary directory, untouched
                    continue
                # empty: a save that its maker started was cut by the crash (the daemon resolves a
                # maker that exited normally within a second); quarantined like any torn group
                move_group(store, path, target)
                notes.append(_hidden(store, files, groups, table, g, TORN,
                                     "made for a save the crash interrupted before its first file", target))
                continue
            if g.late:  # only files added after its seal: they are committed, reseal with them (G10)
                notes.append(_reseal(store, files, g))
                continue
            if seal_parts and not g.manifest_blake3 and any(k.startswith(path + "/") for k in files):
                notes.append(_reseal(store, files, g, "idle: a node's part left open by the crash (recovery)"))
                continue
            plan = (rollback_plan(store, files, gens or {}, g, reason="re-save torn by the crash")
                    if journal and persist else None)
            if plan is not None:  # a torn re-save of a sealed group: back to its seal (G11)
                if not persisted:
                    persist()
                    persisted = True
                make_durable(store)
                mark = journal.append(plan)
                crashpoints.hit("rollback_logged")
                if not apply_rollback(store, plan):
                    journal.retract(mark)
                    move_group(store, path, target)
                    notes.append(_hidden(store, files, groups, table, g, TORN,
                                         "re-save torn by the crash; its kept generations are gone", target))
                    continue
                apply_rollback_state(files, groups, plan, gens, table)
                notes.append(f"{path}: re-save torn by the crash; rolled back to its seal "
                             f"({len(plan['restore'])} files restored, the re-save kept at {plan['to']})")
                log.warning("group %s: torn re-save rolled back to its seal", path)
                continue
            state, reason = TORN, "not sealed before the crash (no COMMIT)"
        else:
            if not store.exists(path):
                del groups[path]  # deleted while unmounted
                continue
            problem = _sealed_problem(store, g)
            if problem is None:
                continue
            if _seal_records_only(problem) and _members_verify(store, files, g):
                # the seal's own records are damaged (garbage in .ckptfs/groups) but every file of the
                # group verifies against the record it carries: the data is intact, so the seal is
                # rebuilt from those records instead of quarantining it (issue 25)
                notes.append(_reseal(store, files, g, f"recovery: seal records damaged ({problem}); rebuilt "
                                                      "from the files' own records"))
                continue
            state, reason = CORRUPT, f"seal does not verify: {problem}"
        move_group(store, path, target)
        notes.append(_hidden(store, files, groups, table, g, state, reason, target))
    notes += _settle_trashed(store, files, groups)
    if store.exists(TRASH):
        keep = {g.moved_to for g in groups.values() if g.state == TRASHED}
        for name in store.listdir(TRASH):
            if f"{TRASH}/{name}" not in keep:
                rmtree(store, f"{TRASH}/{name}")
    return notes


def _reseal(store: BackingStore, files: dict[str, FileRecord], g: GroupState, event: str = "") -> str:
    """Seal a late-reopened group (or, with ``event``, a node's part) over its committed records
    (what the live daemon's seal would write)."""
    pre = g.path + "/"
    members = {k[len(pre):]: r for k, r in files.items() if k.startswith(pre)}
    lin = lineage(g.step, None, 0, g.created_at)
    lin["event"] = event or "recovery: files added after the seal"
    g.manifest_blake3 = write_seal(store, g.id, build_manifest(g.id, g.path, g.rule, members, lin))
    g.state, g.late, g.sealed_at = SEALED, False, time.time()
    g.files, g.bytes = len(members), sum(r.size for r in members.values())
    why = event or "files were added after its seal"
    log.warning("group %s sealed by recovery (%d files; %s)", g.path, g.files, why)
    return f"{g.path}: sealed with the {g.files} committed files ({why})"


def _settle_trashed(store: BackingStore, files: dict[str, FileRecord], groups: dict[str, GroupState]) -> list[str]:
    """Deferred deletions (engine/groups.py G9): purge if a newer sibling sealed, else put the group back."""
    notes: list[str] = []
    for path, g in list(groups.items()):
        if g.state != TRASHED:
            continue
        key = g.order
        newer = any(s.state == SEALED and parent(s.path) == parent(path)
                    and s.order > key for s in groups.values())
        if newer:
            del groups[path]
            drop_prefix(files, g.moved_to)
            drop_prefix(files, path)
            rmtree(store, path)  # what the interrupted deletion had not reached yet
            rmtree(store, g.moved_to)
            notes.append(f"{path}: interrupted deletion completed")
            continue
        move_tree_back(store, g.moved_to, path)
        move_prefix(files, g.moved_to, path)
        g.state, g.moved_to, g.reason = SEALED, "", ""
        notes.append(f"{path}: restored (its deletion waited for a newer group that never sealed)")
        log.warning("group %s restored: deleted while a newer group was open, which never sealed", path)
    return notes






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


def _reused(store: BackingStore, path: str, e: dict) -> bool:
    """Whether ``path`` now holds another inode than the one the unlink/rename intent ``e`` named
    (``ino``; older entries have none): the intent completed, and a later install put a new file
    at that name.  An install of a file whose record travels with it journals no intent (engine/
    commit.py), so the last intent in the journal need not be the operation in flight: it is
    redone only while the disk still shows it pending."""
    if "ino" not in e:
        return False
    try:
        return store.lstat(path).st_ino != int(e["ino"])
    except FileNotFoundError:
        return False


def finish_inflight(store: BackingStore, e: dict) -> bool:
    """Complete the last journal intent on disk.  True if it now holds."""
    op = e["op"]
    if op == "install":
        rec = FileRecord.from_json(e["rec"])
        path, staging = e["path"], e["staging"]
        if store.exists(staging):
            if not _staged_matches(store, staging, rec):
                return False
            if parent(path) and not store.exists(parent(path)):
                # its directory is gone: a torn group moved to quarantine by an earlier, interrupted
                # recovery whose own rename of this file a power loss undid (model checker, weak model).
                # Never acknowledged (an acknowledged install's rename is durable), so it is dropped.
                return False
            if e.get("keep"):
                link_for_recovery(store, path, e["keep"])
            store.rename(staging, path)
            store.fsync_dir(parent(path))
            return True
        try:
            st = store.lstat(path)
        except FileNotFoundError:
            return False
        return st.st_ino == rec.ino and st.st_size == rec.size
    if op == "unlink":
        if store.exists(e["path"]) and not _reused(store, e["path"], e):
            store.unlink(e["path"])
            store.fsync_dir(parent(e["path"]))
        return True
    if op == "rename":
        src, dst = e["src"], e["dst"]
        if _reused(store, src, e):
            return True  # done: a later install (which journals no intent, R1) made a new file there
        if e.get("keep") and store.exists(src) and not _same_file(store, src, dst):
            link_for_recovery(store, dst, e["keep"])  # the replaced version is kept first (fs.rename)
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
    if op == "exchange":
        # redone only while ``src`` still holds the inode it held before (``ino``): once swapped,
        # another exchange would swap the names back
        try:
            if store.lstat(e["src"]).st_ino == e["ino"] and store.exists(e["dst"]):
                store.exchange(e["src"], e["dst"])
                store.fsync_dir(parent(e["dst"]))
                store.fsync_dir(parent(e["src"]))
        except FileNotFoundError:
            pass
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
    if op == "mknod":
        if not store.exists(e["path"]):
            store.mknod(e["path"], int(e["mode"]), int(e.get("dev", 0)))
            store.fsync_dir(parent(e["path"]))
        return True
    if op == "link":
        if not store.exists(e["dst"]):
            if not store.exists(e["src"]):
                return False
            store.link(e["src"], e["dst"])
            store.fsync_dir(parent(e["dst"]))
        return True
    if op in ("group_open", "group_seal", "group_forget", "group_trash", "group_restore"):
        return True  # state-only entries (a seal's files are durable or rebuilt from its entry, G12)
    if op in ("group_quarantine", "group_retire"):
        move_group(store, e["path"], e["to"])
        return True
    if op == ROLLBACK:
        return apply_rollback(store, e)
    if op == qt.FORGET:  # gc: the row is forgotten, its directory deleted (engine/quarantine.py Q2)
        if not str(e["to"]).startswith(QUARANTINE + "/") or ".." in str(e["to"]):
            raise ValueError(f"quarantine_forget of {e['to']!r} outside {QUARANTINE}")
        rmtree(store, e["to"])
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
    seals_rebuilt: list[str] = field(default_factory=list)  # G12: lazy seal files rewritten from the journal
    renames_finished: list[str] = field(default_factory=list)  # R2: temporary names of interrupted renames
    generations: dict[str, list[GenEntry]] = field(default_factory=dict)
    quarantine: qt.Table = field(default_factory=dict)  # what was moved out of sight (engine/quarantine.py)
    problems: list[str] = field(default_factory=list)  # untrusted metadata (metadata.py)
    suspect: list[str] = field(default_factory=list)  # kept records whose file changed offline
    records_adopted: list[str] = field(default_factory=list)  # records read back from their files (R1)
    walked: bool = False  # the tree was walked for them (not after a clean shutdown)

    def summary(self) -> str:
        s = f"replayed {self.replayed} journal entries"
        if self.inflight:
            s += f"; in-flight {self.inflight} {'completed' if self.inflight_completed else 'rolled back'}"
        s += f"; removed {self.staging_removed} staging files"
        if self.records_dropped:
            s += f"; {len(self.records_dropped)} records of files changed while unmounted dropped"
        if self.records_adopted:
            s += f"; {len(self.records_adopted)} records read back from their files"
        if self.group_notes:
            s += f"; groups hidden: {'; '.join(self.group_notes)}"
        if self.suspect:
            s += f"; {len(self.suspect)} committed files changed in place or swapped while unmounted (suspect)"
        if self.problems:
            s += f"; METADATA PROBLEMS: {len(self.problems)} (untrusted parts ignored)"
        return s


def classify(path: str, rec: FileRecord, st: os.stat_result | None, owner: dict[int, str]) -> str:
    """What an offline change to a committed file means: ``ok`` / ``drop`` / ``suspect``.

    * gone or not a regular file -> ``drop`` (deleted while unmounted);
    * same inode as committed -> ``ok`` if its size matches else ``suspect``;
      either way the record is kept: bytes of a committed inode never change
      legitimately (ckptfs installs by rename), so any difference is corruption
      and verification reports it.  An offline in-place rewrite (``open(O_TRUNC)``
      on the unmounted directory) cannot be told apart and is reported too
      (safe direction); ``ckptfs forget DIR PATH`` (unmounted) accepts it;
    * another committed path's inode -> ``suspect`` (swapped or moved: corruption);
    * any other inode -> ``drop``: replaced by a new file while unmounted (the
      atomic write-then-rename every careful writer does); it is untracked.
    """
    if st is None or not stat.S_ISREG(st.st_mode):
        return "drop"
    if not rec.ino:
        return "ok" if st.st_size == rec.size else "drop"
    if st.st_ino == rec.ino:
        return "ok" if st.st_size == rec.size else "suspect"
    if owner.get(st.st_ino, path) != path:
        return "suspect"
    return "drop"


def carried_record(store: BackingStore, path: str) -> tuple[FileRecord, os.stat_result] | None:
    """The record the regular file at ``path`` carries (records.XATTR) and its stat, if it names
    this very inode (a copy made outside ckptfs carries another inode's: None)."""
    try:
        st = store.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        rec = from_xattr(store.getxattr(path, XATTR))
    except OSError:
        return None  # no record on it (ENODATA), or no xattrs here
    except (ValueError, KeyError, TypeError):
        log.warning("%s carries an unreadable %s; left untracked", path, XATTR)
        return None
    return (rec, st) if rec.ino == st.st_ino else None


def carried_instead(store: BackingStore, path: str, rec: FileRecord, st: os.stat_result,
                    owner: dict[int, str], files: dict[str, FileRecord]) -> FileRecord | None:
    """The record the inode at ``path`` carries, where it and not the journal's ``rec`` describes
    that inode: an inode is installed once, so a carried record that differs from ``rec`` and is
    not the record of the path owning that inode number while that path still holds it or holds
    ``rec``'s inode (``owner``: a second name, files swapped offline: left suspect) means ``rec``
    is stale (a later install's done entry was lost, the inode
    number reused).  None otherwise.  For paths :func:`classify` does not find ``ok``."""
    got = carried_record(store, path)
    if got is None or got[0] == rec:
        return None
    other = owner.get(st.st_ino)
    if other is not None and other != path and files.get(other) == got[0]:
        try:
            there = store.lstat(other).st_ino
        except OSError:
            there = None
        if there in (st.st_ino, rec.ino):
            return None  # a second name of it, or the two swapped: suspect
    return got[0]  # moved here, its old name gone or reused (a rename whose done entry was lost: R2)


def _finish_unrecorded_temp(store: BackingStore, d: str, name: str, linked: frozenset[str] = frozenset()) -> bool:
    """R2 for a temporary name no record names: if the name it stands for, beside it, is the same
    inode, and that inode was installed by ckptfs (it carries its own record: only such a file is
    ever renamed by :meth:`CkptFS._temp_rename`'s one-sync path), the rename between them was cut by
    a power loss after its new name persisted: remove the temporary name (the other keeps the file
    and gets its carried record).  A second name that is a user's hard link is left alone: one made
    offline or through the mount to a file without a record carries none; one the journal still
    names (``linked``: the destinations of replayed ``link`` entries) is a link, not a rename."""
    target = _temp_target(name)
    if target is None:
        return False
    pre = d + "/" if d else ""
    if pre + name in linked or pre + target in linked:
        return False
    try:
        st = store.lstat(pre + name)
        if st.st_nlink < 2 or store.lstat(pre + target).st_ino != st.st_ino:
            return False
    except OSError:
        return False
    if carried_record(store, pre + name) is None:
        return False  # not a file ckptfs installed: a user's hard link (made offline, or to such a file)
    store.unlink(pre + name)
    store.fsync_dir(d)
    log.warning("recovery: %s was being renamed over %s when the daemon stopped: finished", pre + name,
                pre + target)
    return True


def adopt_carried(store: BackingStore, files: dict[str, FileRecord], suspect: list[str] | None = None,
                  renamed: list[str] | None = None, linked: frozenset[str] = frozenset()) -> list[str]:
    """R1: give every regular file under the root (``.ckptfs`` excluded) that has no record the
    one its inode carries (records.XATTR), if that record names this very inode.  The install
    protocol sets it on the staged file before the fsync that makes the bytes durable, so it
    describes them; a size that differs means the file was changed in place while unmounted: the
    record is kept and the path reported in ``suspect`` (verification flags it), as for journaled
    records (:func:`classify`).  A copy made outside ckptfs (``cp -a``, ``rsync -X``) carries
    another inode's record and is ignored.  ``renamed`` given: a temporary name without a record
    that is a second name of the name it stands for is the remains of a rename and is removed (R2,
    :func:`finish_temp_renames`; never one ``linked`` names or a file without a carried record: a
    user's hard link), listed there.  Returns the adopted paths.  Walks the whole tree: a
    getdents per directory, and a stat + getxattr per file without a record only."""
    adopted: list[str] = []
    stack = [""]
    while stack:
        d = stack.pop()
        pre = d + "/" if d else ""
        try:
            entries = store.scandir(d)
        except OSError:
            continue
        for name, _ino, t in entries:
            path = pre + name
            if not d and name == META_DIR:
                continue
            if stat.S_ISDIR(t):
                stack.append(path)
                continue
            if t and not stat.S_ISREG(t) or path in files:
                continue
            if renamed is not None and _finish_unrecorded_temp(store, d, name, linked):
                renamed.append(path)  # R2: the temporary name of an interrupted rename
                continue
            got = carried_record(store, path)
            if got is None:
                continue
            rec, st = got
            files[path] = rec
            adopted.append(path)
            if st.st_size != rec.size and suspect is not None:
                suspect.append(path)
    if adopted:
        log.info("recovery: %d records read back from their files (journal entries lost)", len(adopted))
    return adopted


def carried_later(store: BackingStore, path: str, rec: FileRecord) -> bool:
    """R3: whether the inode at ``path`` carries a record of this very inode that differs from the
    journal's ``rec`` and was committed later.  An inode number is reused once its file is gone, so
    the journal can hold a record of an earlier file that had the same number and size (an unlink
    or rename whose ``done`` entry a power loss dropped, fs.py I8, and a later install at that path
    whose ``done`` entry was dropped too): :func:`classify` sees the number and size match.  The
    record the inode carries describes it (set before the fsync that made its bytes durable); the
    journal's is only ever newer for the same file when it was re-recorded without re-installing
    (``ckptfs forget`` accepting an offline change), which this leaves alone.  Found by the model
    checker's FUSE-recorded pointer workload (inode numbers reused by the backing filesystem).
    Costs a getxattr per recorded file, after an unclean stop only."""
    got = carried_record(store, path)
    return got is not None and got[0] != rec and got[0].committed_at > rec.committed_at


def _temp_target(name: str) -> str | None:
    m = TEMP_OF_RE.fullmatch(name)
    return m.group(1) if m else None


def finish_temp_renames(store: BackingStore, files: dict[str, FileRecord]) -> list[str]:
    """R2: finish renames of a temporary name over the name it stands for (``model.pt.tmp`` ->
    ``model.pt``, ``latest.tmp`` -> ``latest``), which journal no intent (fs.py I8): a power loss
    between the rename and its directory's fsync can leave the file under both names (the new name
    persisted, the old one not yet removed).  A recorded file whose inode has a second name, where
    one of the two is a temporary name of the other in the same directory and no journaled link made
    that pair (both recorded with that inode), is such a rename: the temporary name is removed and
    the record moves to the other name.  Returns the temporary names removed."""
    done: list[str] = []
    seen: set[int] = set()
    by_ino: dict[int, list[str]] = {}
    for p, r in files.items():
        if r.ino:
            by_ino.setdefault(r.ino, []).append(p)
    for path in list(files):
        rec = files.get(path)
        if rec is None:
            continue
        try:
            st = store.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2 or st.st_ino in seen:
            continue
        seen.add(st.st_ino)
        d, base = parent(path), os.path.basename(path)
        pre = d + "/" if d else ""
        target = _temp_target(base)
        if target is not None:  # the temporary name is recorded (the rename's done entry was lost)
            pairs = [(path, pre + target)]
        else:  # the name it stands for is recorded: look for its temporary name beside it
            try:
                names = store.listdir(d)
            except OSError:
                continue
            pairs = [(pre + n, path) for n in names if _temp_target(n) == base]
        for tmp, dst in pairs:
            try:
                same = store.lstat(tmp).st_ino == st.st_ino and store.lstat(dst).st_ino == st.st_ino
            except OSError:
                continue
            linked = {tmp, dst} <= set(by_ino.get(st.st_ino, ())) and files[tmp] == files[dst]
            if not same or linked:
                continue  # (a link made through the mount is journaled: both names recorded)
            store.unlink(tmp)
            store.fsync_dir(d)
            moved = files.pop(tmp, None)
            if moved is not None and moved.ino == st.st_ino:
                files[dst] = moved
            done.append(tmp)
            log.warning("recovery: %s was being renamed over %s when the daemon stopped: finished", tmp, dst)
            break
    return done


def rebuild_lazy_seals(store: BackingStore, r: Replayed, groups: dict[str, GroupState]) -> list[str]:
    """G12: the seal files of groups first sealed since the last compaction were written unsynced;
    rewrite any that a power loss took, byte-identical, from the journal (seals.rebuild_seal).  The
    group's current seal only while it is still the one that entry made; its anchor always (a later
    anchor came from a durable reseal, which drops the entry in replay).  Returns the groups rebuilt."""
    by_id = {g.id: g for g in groups.values() if g.id}
    out: list[str] = []
    for gid, (entry, path, rule, members) in r.lazy_seals.items():
        g = by_id.get(gid)
        if g is None:
            continue  # quarantined, retired or deleted since: its seal is not needed
        current = g.state == SEALED and g.manifest_blake3 == entry.get("manifest")
        which = (("",) if current else ()) + (("anchor",) if entry.get("anchor") else ())
        if not which:
            continue  # re-saved since, and this seal kept no anchor
        try:
            rewritten = rebuild_seal(store, gid, path, rule, members, entry, which)
        except OSError as err:
            log.error("group %s: could not rewrite its seal from the journal: %s", g.path, err)
            continue
        if rewritten:
            out.append(g.path)
            log.warning("group %s: seal files lost to the crash rewritten from the journal (%s)",
                        g.path, ", ".join(w or "seal" for w in rewritten))
    return out


def _preserve(store: BackingStore, src: str, dst: str) -> None:
    """Copy damaged metadata aside for forensics (never renamed: stays idempotent)."""
    try:
        data = read_whole(store, src)
        fd = store.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            store.pwrite(fd, data, 0)
            store.fsync(fd)
        finally:
            store.close(fd)
    except OSError as e:
        log.warning("could not preserve %s: %s", src, e)


def recover(store: BackingStore, journal: Journal | None = None, seal_parts: bool = False) -> RecoveryReport:
    trust.check_meta_dir(store)  # a planted .ckptfs is refused before anything in it is used (issue 26)
    journal = journal or Journal(store)
    journal.ensure_layout()
    loaded = load_trusted(journal)
    state = loaded.state
    stamp = time.strftime("%Y%m%dT%H%M%S")
    if loaded.snapshot_corrupt:
        _preserve(store, SNAPSHOT, f"{META_DIR}/corrupt-snapshot.{stamp}")
    if loaded.journal_corrupt_at is not None:
        _preserve(store, journal.journal_path(state.epoch), f"{META_DIR}/corrupt-journal.{state.epoch}.{stamp}")
    trusted = not loaded.snapshot_corrupt and loaded.journal_corrupt_at is None
    # with untrusted metadata the last entry is not known to be the in-flight one: hints only
    r = replay(loaded, last="hold" if trusted else "apply")
    rep = RecoveryReport(files=r.files, aborts=r.aborts, problems=r.problems, groups=r.groups,
                         quarantine=r.quarantine)
    gens_raw = r.gens
    if r.held is not None and r.held.get("done"):
        r.apply(r.held)  # written after its install was durable: nothing to finish (engine/commit.py step 6)
    elif r.held is not None:
        last = r.held
        try:
            if last["op"] == BATCH:  # C5: every install of the batch finished, in close order
                items = batch_items(last)
                rep.inflight = f"{BATCH} of {len(items)}"
                done = []
                stop = False  # a staged file that cannot be installed: none after it is either
                for it in items:
                    if stop and store.exists(it["staging"]):
                        continue  # (its rename never happened: the prefix ends before it)
                    if finish_inflight(store, it):
                        done.append(it)
                    elif store.exists(it["staging"]):
                        stop = True
                rep.inflight_completed = len(done) == len(items)
                r.apply(dict(last, items=done))
            else:
                rep.inflight = f"{last['op']} {last.get('path') or last.get('src')}"
                rep.inflight_completed = finish_inflight(store, last)
                if rep.inflight_completed:
                    r.apply(last)
        except PARSE_ERRORS as err:
            rep.inflight_completed = False
            rep.problems.append(f"last journal entry untrusted ({err!r}); not rolled forward")
    rep.replayed = r.applied
    crashpoints.hit("recovery_replayed")
    staged = store.listdir(STAGING)
    for name in staged:
        store.unlink(f"{STAGING}/{name}")
    if staged:
        store.fsync_dir(STAGING)
    rep.staging_removed = len(staged)
    if store.exists(POOL):  # empty files made ahead (engine/pool.py P1): never referenced, never synced
        for name in store.listdir(POOL):
            store.unlink(f"{POOL}/{name}")
    if not loaded.state.clean:  # (a clean stop's snapshot: every rename's entry is in it)
        rep.renames_finished = finish_temp_renames(store, rep.files)
    owner = {r.ino: p for p, r in rep.files.items() if r.ino}
    for path, rec in list(rep.files.items()):
        try:
            st = store.lstat(path)
        except OSError:
            st = None
        verdict = classify(path, rec, st, owner)
        if verdict != "ok" and st is not None and carried_instead(store, path, rec, st, owner, rep.files):
            verdict = "drop"  # (the carried record is adopted below)
        elif verdict == "ok" and st is not None and not loaded.state.clean and carried_later(store, path, rec):
            verdict = "drop"  # a stale record on a reused inode number (R3; the carried one is adopted below)
        if verdict == "drop":
            del rep.files[path]
            rep.records_dropped.append(path)
        elif verdict == "suspect":
            rep.suspect.append(path)
    rep.walked = not loaded.state.clean  # (a clean shutdown's snapshot: no journal entry can be lost)
    if rep.walked:
        rep.records_adopted = adopt_carried(store, rep.files, rep.suspect, rep.renames_finished, frozenset(r.linked))
    rep.generations, probs = reconcile(store, {p: g for p, g in gens_raw.items() if p in rep.files})
    rep.problems += probs
    for p in rep.problems:
        log.error("metadata: %s", p)
    gens = rep.generations
    for k in qt.reconcile(store, rep.quarantine):
        log.warning("quarantine: %s is gone (a gc cut short); its record is dropped", k)
    journal.extra_state = lambda: {"generations": {p: [g.to_json() for g in gs] for p, gs in gens.items()},
                                   qt.SNAPSHOT_KEY: qt.to_json(rep.quarantine)}
    def persist() -> None:
        journal.compact(rep.files, rep.aborts, {p: g.to_json() for p, g in rep.groups.items()})

    rep.seals_rebuilt = rebuild_lazy_seals(store, r, rep.groups)
    rep.group_notes = settle_groups(store, rep.files, rep.groups, rep.generations, journal, persist,
                                    rep.quarantine, seal_parts=seal_parts)
    persist()
    return rep
