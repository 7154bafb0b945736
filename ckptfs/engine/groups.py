"""Checkpoint-group life cycle: a component of the engine with explicit dependencies.

:class:`GroupEngine` is given everything it touches (see its constructor): the backing store,
the journal, the shared tables (records, groups, staged versions), the two locks, the kept
generations, the event hub, and the four commit-path operations it needs (``barrier``,
``ns_op``, ``children_pending``, ``lexists``).  The filesystem facade calls it at the points
where a write, a close or a namespace change can open, seal, tear or delete a group.

Invariants (with groups.py G1-G3):

G4  A group's ``group_open`` entry is in the journal before any install or
    namespace intent inside it, so recovery knows every group that could be
    torn; it is appended under ``commit_lock``.
G5  A group is sealed only when no version inside it is still open, queued
    or committing: the manifest lists committed records only.
G6  A pointer (``latest``, ``latest_checkpointed_iteration.txt``, a symlink)
    naming an open group is committed only after that group's COMMIT is
    durable; if the group cannot be sealed the pointer's commit fails (EIO).
G7  A torn group (never sealed; its writers gone) is moved out of the
    namespace into ``.ckptfs/quarantine`` by a journaled operation, so the
    path shows what it held before the group was opened: nothing.  It leaves
    the group table for a row of the quarantine table (keyed by where it is
    kept, engine/quarantine.py Q1-Q4), so saving the name again hides nothing.
G9  Deleting files of a sealed group moves them into ``.ckptfs/trash/<id>``
    by journaled renames; the trash is deleted once the directory is removed,
    unless a sibling group is still open (the rotation trap: then only when a
    newer sibling seals).  A deletion abandoned half-way is finished if a newer
    sibling is sealed and undone otherwise (live sweep and recovery).
G8  Retention runs only after a seal, only when no group in that directory is
    open, always keeps the newest sealed group, and moves a retired group out
    of the namespace by one journaled rename before deleting it.
G10 A sealed group reopened only by *new* files (``late``) is resealed, with
    them, as soon as nothing in it is being written; its sealed files were not
    touched, so neither a killed late writer nor a crash makes it torn (the
    late file is dropped, or recovery reseals over the committed records).
    A temporary file (``TEMP_FILE_RE``: a re-save by tmp + rename) does not
    reseal it: renamed over a sealed file it makes the change a re-save; left
    behind, its writers' exit (or the idle time) reseals the group.  A
    rewrite of a sealed file reopens it for good: it needs its completion
    event again and is torn if it never comes.
G11 A torn re-save of a sealed group is rolled back to its last seal when
    every file it replaced was kept as a generation (rollback.py); the re-save's
    files are kept in quarantine.  Otherwise it is quarantined whole (G7).
G12 A group's first seal costs one sync: its manifest, COMMIT and anchor are
    written and renamed unsynced, then the ``group_seal`` entry (the manifest's
    digest, the lineage, the COMMIT's time) is appended with ``fdatasync``.
    Until a compaction fsyncs those files (``Journal.defer_durable``, before the
    snapshot that drops the entry), recovery rewrites any of them that does not
    verify from the replayed journal, byte-identical (seals.rebuild_seal); a
    power loss alone never leaves a seal for issue 25's rebuild from the files.
    A reseal first makes deferred files durable and writes as before (manifest,
    COMMIT: each fsynced, renamed, ``groups`` fsynced).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptfs import crashpoints, events, exits, procinfo
from ckptfs.engine import quarantine as qt
from ckptfs.engine import staged
from ckptfs.engine.replay import apply_group_entry
from ckptfs.engine.rollback import apply_rollback, apply_rollback_state, make_durable, rollback_plan
from ckptfs.engine.seals import (
    CORRUPT,
    NEXT_SAVE_EVENT,
    OPEN,
    QUARANTINE,
    SEALED,
    TORN,
    TRASHED,
    GroupState,
    build_manifest,
    keep_anchor,
    lineage,
    new_group_id,
    quarantine_target,
    remove_seal,
    seal_names,
    write_seal,
    write_seal_lazy,
)
from ckptfs.layout import (
    GROUPS,
    TRASH,
    copy_owner_mode,
    drop_prefix,
    move_group,
    move_prefix,
    move_tree_back,
    parent,
    rmtree,
)
from ckptfs.rules import (
    CHECKPOINT_FILES,
    SIGNATURE_DEPTH,
    TEMP_FILE_RE,
    TMP_DIR_RE,
    Rule,
    parent_and_base,
    step_of,
)

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore
    from ckptfs.engine.generations import Generations
    from ckptfs.engine.staged import Version
    from ckptfs.events import Events
    from ckptfs.log.journal import Journal
    from ckptfs.records import FileRecord
    from ckptfs.rules import RuleSet

log = logging.getLogger("ckptfs.groups")

EXPLICIT = Rule("explicit", idle_seal=False)
CHECKPOINT_RE = re.compile(CHECKPOINT_FILES)
LATE = "file added after the seal:"


def _err(code: int, msg: str = "") -> OSError:
    return OSError(code, msg or os.strerror(code))


class GroupEngine:
    """The groups of one filesystem.  Lock order as everywhere (I5): ``commit_lock`` before ``lock``;
    methods that change groups durably say "caller holds commit_lock" or take it themselves."""

    def __init__(self, *, store: BackingStore, journal: Journal, rules: RuleSet,
                 records: dict[str, FileRecord], groups: dict[str, GroupState],
                 pending: dict[str, Version], queued: dict[str, Version], aborts: collections.deque[dict],
                 lock: threading.RLock, commit_lock: threading.RLock, stats: collections.Counter[str],
                 gens: Generations, events: Events, barrier: Callable[[], None],
                 ns_op: Callable[[dict, Callable[[], None], list[str]], None],
                 children_pending: Callable[[str], bool], lexists: Callable[[str], bool],
                 quarantine: qt.Table | None = None) -> None:
        self.store = store
        self.journal = journal
        self.rules = rules
        self.records = records  # path -> committed record (shared with the commit path)
        self.groups = groups  # group path -> GroupState: live groups (open, sealed, being deleted)
        # what was moved out of sight (torn/corrupt groups, torn re-saves' files), by where it is kept:
        # never by path, so a group saved again at the same name never replaces it (engine/quarantine.py)
        self.quarantine: qt.Table = quarantine if quarantine is not None else {}
        self.gc_reports: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self.pending = pending  # staged versions open for writing (read only here)
        self.queued = queued  # sealed versions awaiting install (read only here)
        self.aborts = aborts
        self.lock = lock
        self.commit_lock = commit_lock
        self.stats = stats
        self._exit_known: dict[int, str] = {}  # tgid -> how it ended ("" clean or unknown): _writer_failed
        self.gens = gens
        self.events = events
        self.barrier = barrier  # order after every earlier commit (async mode)
        self.ns_op = ns_op  # journal + do + fsync dirs, one namespace change
        self.children_pending = children_pending
        self.lexists = lexists
        # whether retention may delete a sealed group now (the mirror pins one whose remote COMMIT
        # is not confirmed yet: M4 in ckptfs/mirror); a pinned group is kept and counted
        self.may_retire: Callable[[GroupState], bool] = lambda g: True
        self.lazy_seals = True  # G12 (the model checker's known-bad variants turn parts of it off)

    # ---------------------------------------------------------------- lookup
    def group_of(self, path: str) -> GroupState | None:
        """The live (open/sealed) group strictly containing ``path``: its outermost group ancestor.
        Tentative groups (no evidence yet) are not groups for this purpose."""
        parts = path.split("/")
        for i in range(1, len(parts)):
            g = self.groups.get("/".join(parts[:i]))
            if g is not None and g.state in (OPEN, SEALED) and not g.tentative:
                return g
        return None

    def live_group(self, path: str) -> GroupState | None:
        g = self.groups.get(path)
        return g if g is not None and g.state in (OPEN, SEALED) and not g.tentative else None

    def _tentative_group(self, path: str) -> GroupState | None:
        g = self.groups.get(path)
        return g if g is not None and g.state == OPEN and g.tentative else None

    def _rule_of(self, g: GroupState) -> Rule:
        return self.rules.rule(g.rule) or EXPLICIT

    def _busy(self, g: GroupState) -> list[str]:
        """Paths under g with a version not yet installed (G5)."""
        pre = g.path + "/"
        with self.lock:
            return [p for t in (self.pending, self.queued) for p, v in t.items()
                    if p.startswith(pre) and not v.unlinked
                    and v.state in (staged.OPEN, staged.QUEUED, staged.COMMITTING)]

    def groupable(self, d: str) -> bool:
        """A directory may become a group unless it holds files ckptfs never committed (legacy data)."""
        try:
            names = self.store.listdir(d)
        except OSError:
            return False
        for name in names:
            p = f"{d}/{name}" if d else name
            try:
                st = self.store.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and p not in self.records:
                return False
        return True

    # ------------------------------------------------------------- opening
    def _open_group(self, d: str, rule: Rule, pid: int, tentative: bool = False) -> GroupState:
        """Journal and register an open group at ``d``.  Caller holds commit_lock (G4)."""
        now = time.time()
        step = step_of(os.path.basename(d))
        gid = new_group_id()
        entry: dict[str, Any] = {"op": "group_open", "path": d, "rule": rule.name, "id": gid, "time": now,
                                 "step": step}
        if tentative:
            entry["tentative"] = True
        self.journal.append(entry, sync=False)
        g = GroupState(path=d, rule=rule.name, id=gid, state=OPEN, created_at=now, step=step, tentative=tentative)
        if pid:
            me = procinfo.tgid(pid)
            self._add_writer(g, me)
            d_parent = parent(d)
            for s in self.groups.values():  # its writer is done with the older saves it made here
                if s.state == OPEN and me in s.pids and parent(s.path) == d_parent and s.path != d:
                    s.moved_on = True
        g.last_activity = now
        self.groups[d] = g
        self.stats["groups_opened"] += 1
        self.events.emit(events.OPENED, d, reason=rule.name)
        return g

    def _candidate(self, path: str) -> tuple[str, Rule] | None:
        """(directory, rule) that a new file at ``path`` is evidence of a checkpoint for: a rule's
        signature file in a directory (or up to SIGNATURE_DEPTH levels below one) whose name the
        rule's pattern matches, or a content-rule file (DCP shard) in any directory."""
        d, base = parent_and_base(path)
        if not d:
            return None
        rule = self.rules.content_rule(base)
        if rule is not None:
            return d, rule
        cur = d
        for _ in range(SIGNATURE_DEPTH + 1):
            if not cur:
                return None
            rule = self.rules.evidence_rule(os.path.basename(cur), base)
            if rule is not None:
                return cur, rule
            cur = parent(cur)
        return None

    def note_write(self, path: str, pid: int) -> None:
        """A version of file ``path`` is about to be created: open its group if this file is evidence
        of a checkpoint (``_candidate``), or reopen the sealed group it changes."""
        if pid:
            self._moved_on(path, procinfo.tgid(pid))
        g = self.group_of(path)
        if g is None:
            cand = self._candidate(path)
            if cand is None:
                return  # not evidence of a checkpoint: an ordinary file in an ordinary directory
            d, rule = cand
            with self.commit_lock:
                g = self.group_of(path)
                if g is None:
                    g = self.live_group(d)
                if g is None:
                    t = self._tentative_group(d)
                    if t is not None:
                        g = self._promote(t, rule, pid)
                    elif not self.groupable(d):
                        return
                    else:
                        g = self._open_group(d, rule, pid)
        if self._rule_of(g).idle_seal and os.path.dirname(path) == g.path:
            crule = self.rules.content_rule(os.path.basename(path))
            if crule is not None and crule.has_completion_event and not crule.idle_seal:
                g.rule = crule.name  # e.g. DCP shards in a step_N dir: wait for .metadata, never idle-seal
            else:
                erule = self.rules.evidence_rule(os.path.basename(g.path), os.path.basename(path))
                if erule is not None and erule.has_completion_event and not erule.idle_seal:
                    g.rule = erule.name  # HF files in a checkpoint-N first opened by a generic .pt
        if g.state == SEALED or (g.late and path in self.records):
            with self.commit_lock:
                self._reopen(g, path, replaces=path in self.records and self._member_evidence(g, path))
        elif g.late and not g.seal_requested and not TEMP_FILE_RE.fullmatch(os.path.basename(path)):
            g.seal_requested = f"{LATE} {path}"  # late by a tmp file so far: this addition reseals (G10)
        if pid:
            t = procinfo.tgid(pid)
            if t not in g.pids:
                self._add_writer(g, t)
        g.last_activity = time.time()
        g.written = True

    def _promote(self, g: GroupState, rule: Rule, pid: int) -> GroupState:
        """Evidence arrived in a tentative group: it is a group now (journaled, so recovery knows).
        Caller holds commit_lock."""
        if not g.made_by_writer:  # else keep the sibling's layout (dcp for a torchtitan step-N)
            g.rule = rule.name
        g.tentative, g.made_by_writer = False, False
        self.journal.append({"op": "group_open", "path": g.path, "rule": g.rule, "id": g.id, "time": time.time(),
                             "step": g.step}, sync=False)
        if pid and procinfo.tgid(pid) not in g.pids:
            self._add_writer(g, procinfo.tgid(pid))
        return g

    def _member_evidence(self, g: GroupState, path: str) -> bool:
        """Whether ``path`` in g is a checkpoint file of its layout (its rewrite is a re-save that
        needs the completion event again); a note, log or README rewritten in a sealed group only
        makes it reseal (G10)."""
        base = os.path.basename(path)
        return self._rule_of(g).signs(base) or CHECKPOINT_RE.fullmatch(base) is not None

    def note_link(self, new: str, pid: int) -> None:
        """A hard link ``new`` is about to be made (commit_lock held): an addition to its group (G10)."""
        g = self.group_of(new)
        if g is not None and g.state == SEALED:
            self._reopen(g, new, replaces=new in self.records)

    def write_refused(self, path: str, reason: str) -> None:
        """An incomplete known-format file was refused at close: evidence its group's save was cut."""
        g = self.group_of(path)
        if g is not None and g.state == OPEN:
            g.refused[path] = reason

    def _sibling_writer(self, path: str, rule: Rule, pid: int) -> GroupState | None:
        """A group of the same layout beside ``path`` (same parent, a name the same rule matches)
        that process ``pid`` wrote files into: the maker of ``path`` is a trainer starting its
        next save."""
        if not pid:
            return None
        t = procinfo.tgid(pid)
        d = parent(path)
        with self.lock:
            sibs = list(self.groups.values())
        for s in sibs:
            if (s.state in (OPEN, SEALED) and not s.tentative and t in s.pids and parent(s.path) == d
                    and self.rules.dir_rule(os.path.basename(s.path)) is rule):
                return s
        return None

    def _reopen(self, g: GroupState, path: str, replaces: bool) -> None:
        """G10: a change at ``path`` inside g after its seal (commit_lock held).  ``replaces``: it
        replaces or removes a file g holds (a re-save), else it only adds one (HF's rng_state.pth
        after trainer_state.json in older transformers; a note someone adds)."""
        if g.state == SEALED:
            late = not replaces
            log.info("group %s reopened by %s %s", g.path, "a file added at" if late else "a change of", path)
        elif g.state == OPEN and g.late and replaces:
            late = False
        elif g.state == OPEN and g.late and not TEMP_FILE_RE.fullmatch(os.path.basename(path)):
            if not g.seal_requested:  # a late tmp file renamed to a new final name: reseal once quiet
                g.seal_requested = f"{LATE} {path}"
            return
        else:
            return
        self.journal.append({"op": "group_open", "path": g.path, "rule": g.rule, "id": g.id,
                             "time": time.time(), "step": g.step, "late": late}, sync=False)
        if g.state == SEALED:
            g.pids, g.reason = [], ""  # a writer killed in an earlier change says nothing about this one
        g.state, g.late = OPEN, late
        if late and TEMP_FILE_RE.fullmatch(os.path.basename(path)) and not g.seal_requested:
            # a temporary file (a re-save by tmp + rename): not resealed with it; its rename over a
            # sealed file makes this a re-save (below), else its writers' exit reseals (check_torn)
            pass
        elif late:
            g.seal_requested = f"{LATE} {path}"  # reseals once nothing in it is being written
        elif g.seal_requested.startswith(LATE):
            g.seal_requested = ""

    def note_rename(self, old: str, new: str, pid: int = 0, is_dir: bool = False) -> None:
        """A rename from/into a group (commit_lock held, before it is journaled): renaming onto a file
        the group holds, or out of the group, is a change; into a new name an addition (G10).  The
        renaming process becomes a writer of the group (G7 waits for it).  A file renamed to a name
        that is evidence of a checkpoint opens its group as a create does (issue 25: the already-
        atomic writer's tmp + fsync + rename into ``epoch_N/model.bin`` never formed a group)."""
        if not is_dir and self.group_of(new) is None:
            cand = self._candidate(new)
            if cand is not None:
                d, rule = cand
                if self.live_group(d) is None:
                    t = self._tentative_group(d)
                    if t is not None:
                        self._promote(t, rule, pid)
                    elif self.groupable(d):
                        self._open_group(d, rule, pid)
        go, gn = self.group_of(old), self.group_of(new)
        if gn is not None:
            self._reopen(gn, new, replaces=new in self.records or go is not gn)
        if go is not None and go is not gn:
            self._reopen(go, old, replaces=True)
        for g in (gn, go):
            if g is not None and g.state == OPEN and pid and procinfo.tgid(pid) not in g.pids:
                self._add_writer(g, procinfo.tgid(pid))

    def note_unlink(self, path: str) -> None:
        """An unlink inside a late-reopened group (commit_lock held): a sealed group's deletions go
        through its trash (G9); a late group's stops being late if a file it holds goes."""
        g = self.group_of(path)
        if g is not None and g.state == OPEN and g.late and path in self.records:
            self._reopen(g, path, replaces=True)

    def note_mkdir(self, path: str, pid: int) -> None:
        """A directory was created (commit_lock held).  Its name alone never makes a group: one a
        rule names becomes a *tentative* group (journaled, so a daemon crash is judged too; hidden
        from the committed view; no status change of the directory itself).  Evidence (a file of
        its layout) promotes it; once its maker is gone it is torn only if still empty and its maker
        was killed or failed (or, without exit events, had written a sibling group of the same
        layout), and released otherwise (``_judge_tentative``)."""
        if self.group_of(path) is not None:
            return
        rule = self.rules.dir_rule(os.path.basename(path))
        if rule is None or not rule.on_mkdir:
            return
        sib = self._sibling_writer(path, rule, pid)
        g = self._open_group(path, self._rule_of(sib) if sib is not None else rule, pid, tentative=True)
        g.made_by_writer = sib is not None
        if sib is not None:
            self._seal_finished_siblings(path, rule, procinfo.tgid(pid))

    def _seal_finished_siblings(self, path: str, rule: Rule, tgid: int) -> None:
        """Process ``tgid`` made ``path``, the next save of a layout it wrote before: every open
        sibling group of that layout it wrote into, sealed only on idle otherwise, is finished.
        That is a completion event as good as the idle timeout, which never came while a loop saved
        more often than it (another job never listed any of its checkpoints, issue 25).  A file
        still being written in one defers its seal to that file's close (G5); one with evidence of
        an interruption, or waiting for a marker, is left to its rules.  Commit lock held."""
        d = parent(path)
        with self.lock:
            sibs = [s for s in self.groups.values()
                    if s.state == OPEN and not s.tentative and tgid in s.pids and parent(s.path) == d
                    and s.path != path and self.rules.dir_rule(os.path.basename(s.path)) is rule]
        for s in sibs:
            if (self._rule_of(s).idle_seal and not self._expects_marker(s) and self._has_files(s)
                    and not self._interrupted(s)):
                self.seal_group(s, f"{NEXT_SAVE_EVENT} ({os.path.basename(path)})", tgid)

    def _judge_tentative(self, g: GroupState) -> bool:
        """A tentative group whose maker may be gone: tear it (True) or release it.  Caller holds no
        lock."""
        if any(procinfo.is_alive(p) for p in g.pids) or self.children_pending(g.path):
            return False
        try:
            empty = self._no_checkpoint_yet(g.path)
        except OSError:
            empty = False
        why = ""
        if empty:
            w = exits.watcher()
            if w.available and g.pids:
                why = exits.interrupted(w.wait_status(g.pids[0]))
                if why:
                    why = f"its maker (pid {g.pids[0]}) {why} before writing a file into it"
            elif g.made_by_writer:
                why = "its maker, a writer of a sibling group, exited before writing a file into it"
        if not why:
            self._release(g)
            return False
        self.barrier()
        with self.commit_lock:
            if self.groups.get(g.path) is not g or g.state != OPEN or not g.tentative:
                return False
            try:
                if not self._no_checkpoint_yet(g.path) or self.children_pending(g.path):
                    return False  # something arrived meanwhile (a file being written counts)
            except OSError:
                return False
            g.reason, g.tentative = f"writer killed: {why}", False
            self._tear(g, g.reason)
        return True

    def _no_checkpoint_yet(self, d: str) -> bool:
        """Whether directory ``d`` is empty or holds only temporary files (``TEMP_FILE_RE``: the
        already-atomic writer's ``model.bin.tmp`` killed before its rename; natively, and before
        this rule, a directory with a partial temporary and no checkpoint stayed listed)."""
        return all(TEMP_FILE_RE.fullmatch(n) for n in self.store.listdir(d))

    # -------------------------------------------------------------- sealing
    def seal_group(self, g: GroupState, event: str, pid: int = 0) -> bool:
        """Seal ``g`` now, or remember the request if files in it are still being written (G5).

        Caller holds commit_lock.  Returns True once g is sealed."""
        if g.state == SEALED:
            return True
        if g.state != OPEN:
            return False
        if self._busy(g):
            g.seal_requested = event
            return False
        pre = g.path + "/"
        files = {k[len(pre):]: r for k, r in self.records.items() if k.startswith(pre)}
        prev = self._previous_sealed(g)
        lin = lineage(g.step, prev.path if prev else None, pid or (g.pids[0] if g.pids else 0),
                      g.created_at)
        lin["event"] = event
        manifest = build_manifest(g.id, g.path, g.rule, files, lin)
        now = time.time()
        anchor = not g.late  # sealed by a completion event (or explicitly), not a reseal for added files
        first = self.lazy_seals and not self.store.exists(f"{GROUPS}/{g.id}.commit")
        if first:  # G12: one sync, the journal's
            digest = write_seal_lazy(self.store, g.id, manifest, now, anchor)
        else:
            self.journal.make_deferred_durable()  # the previous seal's files: linked as .prev below
            digest = write_seal(self.store, g.id, manifest)
        crashpoints.hit("group_commit_written")
        nbytes = sum(r.size for r in files.values())
        seal_entry: dict[str, Any] = {"op": "group_seal", "path": g.path, "manifest": digest, "time": now,
                                      "files": len(files), "bytes": nbytes}
        if event.startswith("marker "):
            g.marker = seal_entry["marker"] = event.split()[1]
        if first:
            seal_entry.update(lineage=lin, anchor=anchor, rule=g.rule)  # (the rule can change unjournaled)
        self.journal.append(seal_entry)
        if first:
            self.journal.defer_durable(seal_names(g.id, anchor), GROUPS)
        elif anchor:
            keep_anchor(self.store, g.id)
        g.state, g.manifest_blake3, g.sealed_at = SEALED, digest, now
        g.files, g.bytes, g.seal_requested, g.late, g.reason = len(files), nbytes, "", False, ""
        g.refused.clear()
        self.stats["groups_sealed"] += 1
        self.events.emit(events.SEALED, g.path, reason=event)
        log.info("sealed group %s (%d files, %d bytes) on %s", g.path, len(files), nbytes, event)
        self._purge_trashed(parent(g.path), g)
        self.apply_retention(parent(g.path))
        return True

    def _previous_sealed(self, g: GroupState) -> GroupState | None:
        d = parent(g.path)
        sibs = [s for s in self.groups.values() if s is not g and s.state == SEALED and parent(s.path) == d]
        return max(sibs, key=lambda s: s.order, default=None)

    def poke(self, path: str) -> None:
        """Re-check a deferred seal after a version under ``path`` was installed or dropped."""
        g = self.group_of(path)
        if g is not None and g.state == OPEN and g.seal_requested and not self._busy(g):
            with self.commit_lock:
                if g.state == OPEN and g.seal_requested:
                    self.seal_group(g, g.seal_requested)

    def after_install(self, path: str) -> None:
        """A file was installed at ``path`` (commit_lock held): a marker seals its group."""
        g = self.group_of(path)
        if g is None or g.state != OPEN:
            return
        g.last_activity = time.time()
        g.refused.pop(path, None)  # rewritten complete after a refusal: no longer evidence
        d, base = parent_and_base(path)
        if d == g.path and base in self._rule_of(g).markers and not self._marked_unfinished(g):
            self.seal_group(g, f"marker {base}")
        elif g.seal_requested:
            self.seal_group(g, g.seal_requested)

    def _marked_unfinished(self, g: GroupState) -> bool:
        """NeMo: while ``<group>-unfinished`` exists the framework itself says the save is not done,
        so an inner marker (DCP's ``.metadata``, followed by ``metadata.json``) does not seal."""
        suffix = self._rule_of(g).unfinished_suffix
        return bool(suffix) and self.lexists(g.path + suffix)

    def seal_named_by_pointer(self, pointer_path: str, content: bytes) -> None:
        """G6: seal the open group(s) a pointer names before the pointer is committed."""
        d, base = parent_and_base(pointer_path)
        for name in self.rules.pointer_target(base, content):
            gp = f"{d}/{name}" if d else name
            self.seal_before_reference(gp, f"pointer {pointer_path}", pointer_path)

    def seal_before_reference(self, target: str, event: str, referrer: str) -> None:
        g = self.live_group(target) or self.group_of(target)
        if g is None or g.state != OPEN:
            return
        if not self.seal_group(g, event):
            g.seal_requested = ""
            raise _err(errno.EIO, f"ckptfs: {referrer} names group {g.path}, which still has files being "
                                  f"written ({', '.join(self._busy(g)[:3])}); the pointer is not committed "
                                  "before the group is complete")

    def is_pointer(self, path: str) -> bool:
        return os.path.basename(path) in self.rules.pointer_names()

    def seal(self, path: str, pid: int = 0) -> GroupState:
        """Explicit seal (``ckptfs seal`` / ``user.ckptfs.seal``): any directory becomes a sealed group."""
        path = path.strip("/")
        st = self.store.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise _err(errno.ENOTDIR, f"ckptfs: {path} is not a directory")
        self.barrier()
        with self.commit_lock:
            g = self.live_group(path)
            if g is None:
                if self.group_of(path) is not None:
                    raise _err(errno.EINVAL, f"ckptfs: {path} is inside group {self.group_of(path).path}")
                g = self._open_group(path, self.rules.dir_rule(os.path.basename(path)) or EXPLICIT, pid)
            if not self.seal_group(g, "explicit seal", pid):
                g.seal_requested = "explicit seal"  # seals when the open files close
            return g

    # ------------------------------------------------------- torn and gone
    def _interrupted(self, g: GroupState) -> str:
        """Evidence that g's save was interrupted: a writer killed in it, or a refused incomplete file."""
        if g.reason.startswith("writer killed"):
            return g.reason
        if g.refused:
            p, why = next(iter(g.refused.items()))
            return f"incomplete file refused: {p}: {why}"
        return ""

    def _writer_failed(self, g: GroupState) -> str:
        """Evidence from how g's writers ended (the kernel's exit events, ``exits.py``): one that was
        killed by a signal or exited non-zero before g sealed left it torn, whether or not a file was
        open at that moment (killed between two files of a step directory, issue 25: sealed on idle
        and resumed into FileNotFoundError).  Empty when every writer exited 0 or nothing is known
        (no exit events: the idle rule decides, as before)."""
        w = exits.watcher()
        if not w.available:
            return ""
        for p in g.pids:
            if p in self._exit_known:
                why = self._exit_known[p]
            else:  # (its event may trail its reaping a little; asked once per process)
                why = exits.interrupted(w.wait_status(p, timeout=0.3))
                self._exit_known[p] = why
                while len(self._exit_known) > 4096:
                    self._exit_known.pop(next(iter(self._exit_known)))
            if why:
                return f"writer killed: pid {p} {why} before the group was sealed"
        return ""

    def _expects_marker(self, g: GroupState) -> str:
        """A layout whose siblings were sealed by a completion marker: the marker this one waits for
        too, even where its own rule would idle-seal (the seed paper's COMMIT.json writer; a run whose
        ``checkpoint-N`` were sealed by HF's trainer_state.json).  Empty if none was seen."""
        d, base = parent_and_base(g.path)
        with self.lock:
            sibs = list(self.groups.values())
        mine = self._owner(g.path)
        for s in sibs:
            if (s is not g and s.marker and parent(s.path) == d
                    and (s.rule == g.rule or self._rule_of(s).matches_dir(base))
                    and self._owner(s.path) == mine):  # another user's saves say nothing of this one's
                return s.marker
        return ""

    def _moved_on(self, path: str, tgid: int) -> None:
        """Process ``tgid`` writes ``path``: every open group it wrote into that does not hold
        ``path`` is one it had finished (a ``latest`` pointer written after the step directory, the
        next step's directory, a log): a later kill says nothing about it (``_writer_failed``)."""
        for g in list(self.groups.values()):
            if g.state == OPEN and not g.moved_on and tgid in g.pids and not path.startswith(g.path + "/"):
                g.moved_on = True

    def _add_writer(self, g: GroupState, tgid: int) -> None:
        """``tgid`` writes into g: a writer (G7 waits for it), and its process session is g's job
        (``sees``).  A live process: whatever an earlier process of that pid left is forgotten."""
        self._exit_known.pop(tgid, None)
        if tgid not in g.pids:
            g.pids.append(tgid)
        try:
            g.sids.add(os.getsid(tgid))
        except OSError:
            pass

    def sees(self, g: GroupState, pid: int) -> bool:
        """Whether the process of thread ``pid`` sees open group g in listings: the daemon, and the
        processes of its writers' job, i.e. their process sessions (every rank of one ``torchrun``
        or ``mp.spawn``, the shell that started them).  Another job (an evaluation started with
        ``setsid``, a cron job, another login) lists it only once it is sealed, as if the framework
        had written it in a temporary directory and renamed it into place (issue 25)."""
        if g.state != OPEN or pid <= 0:
            return True
        try:
            sid = os.getsid(pid)
        except OSError:
            return True
        if not g.sids:
            for p in g.pids:
                try:
                    g.sids.add(os.getsid(p))
                except OSError:
                    pass
        return sid in g.sids or not g.sids and not g.pids

    def _owner(self, path: str) -> int | None:
        """The uid owning directory ``path`` in the backing store (None if gone)."""
        try:
            return self.store.lstat(path).st_uid
        except OSError:
            return None

    def check_torn(self, g: GroupState) -> bool:
        """Quarantine g if it can never complete (G7).  Torn needs evidence of an interrupted write:
        a writer killed in it, a refused incomplete file, or, once every writer has exited, a
        completion event that never came after checkpoint files were written.  Tentative groups
        are judged by ``_judge_tentative``.  A group without files, never sealed and without such
        evidence is released: its directory stays, ordinary.  True if quarantined."""
        if g.state != OPEN or g.seal_requested:
            return False
        if g.tentative:
            return self._judge_tentative(g)
        interrupted = self._interrupted(g)
        if interrupted and not g.reason.startswith("writer killed") and any(procinfo.is_alive(p) for p in g.pids):
            return False  # a refused file's writer is alive: it may save again (its close got EIO)
        if not interrupted:
            if not g.pids or any(procinfo.is_alive(p) for p in g.pids):
                return False
            has_files = self._has_files(g)
            interrupted = "" if g.moved_on else self._writer_failed(g)
            # (moved on: its writer began a newer sibling after it, so this save had finished; the
            # kill came later, in the newer one)
            if interrupted:
                g.reason = interrupted
            elif self._rule_of(g).idle_seal and not self._expects_marker(g) and (has_files or g.written):
                return False  # idle-seal layouts: every writer exited 0 (or no exit events): sealed on idle
            if not interrupted and not has_files and not (g.late or g.manifest_blake3):
                self._release(g)
                return False
            if not interrupted and g.late:  # only files added, its writers done (a tmp never renamed): G10
                self.barrier()
                with self.commit_lock:
                    if g.state == OPEN and g.late and not self._busy(g):
                        self.seal_group(g, f"{LATE} (its writers exited)")
                return False
            # (a sealed group whose re-save removed every file goes back to its seal or is torn below)
        pre = g.path + "/"
        with self.lock:
            if any(p.startswith(pre) and not v.unlinked and v.state == staged.OPEN for p, v in self.pending.items()):
                return False  # a file is still being written
        self.barrier()  # async: let versions closed before the kill install first (queue order)
        with self.commit_lock:
            if g.state != OPEN or self._busy(g):
                return False
            if interrupted:
                reason = interrupted
            elif self._expects_marker(g):
                reason = f"every writer exited before {self._expects_marker(g)} (its siblings' marker) landed"
            else:
                reason = "every writer exited before the group was sealed"
            self._tear(g, reason)
        return True

    def _release(self, g: GroupState) -> None:
        """g turned out to hold nothing of a checkpoint (its only files were removed, or never
        installed, with no evidence of an interruption): it stops being a group; the directory
        stays as it is."""
        self.barrier()
        with self.commit_lock:
            if g.state != OPEN or self.groups.get(g.path) is not g or self._busy(g):
                return
            if self._has_files(g) and not g.tentative:
                return
            if g.late or g.manifest_blake3:
                return  # a sealed group emptied by a change: its seal decides (reseal / rollback)
            self.journal.append({"op": "group_forget", "path": g.path}, sync=False)
            with self.lock:
                del self.groups[g.path]
            try:
                remove_seal(self.store, g.id)
            except OSError:
                pass
            self.stats["groups_released"] += 1
            self.events.emit(events.RELEASED, g.path, reason="no checkpoint file and no interrupted save")
            log.info("group %s released: no checkpoint file in it and no sign of an interrupted save", g.path)

    def _tear(self, g: GroupState, reason: str) -> None:
        """g can never complete (caller holds commit_lock): a torn re-save of a sealed group goes
        back to its seal when every replaced file was kept (G11, rollback.py); else quarantine."""
        plan = rollback_plan(self.store, self.records, self.gens.table, g, reason=f"re-save torn: {reason}")
        if plan is None:
            self._quarantine(g, TORN, reason)
            return
        self.journal.make_deferred_durable()  # an anchor this plan links back (G12)
        make_durable(self.store)
        mark = self.journal.append(plan)
        crashpoints.hit("rollback_logged")
        if not apply_rollback(self.store, plan):  # cannot happen live (generations are on disk)
            self.journal.retract(mark)
            self._quarantine(g, TORN, reason)
            return
        with self.lock:
            for p in plan["remove"]:
                self.gens.on_unlink(p)  # generations of a file moved aside go with it
            apply_rollback_state(self.records, self.groups, plan, self.gens.table, self.quarantine)
        self.gens.collect()
        g.pids = []
        self.stats["groups_rolled_back"] += 1
        self.events.emit(events.ROLLED_BACK, g.path, dst=plan["to"], reason=reason)
        log.warning("group %s: re-save torn (%s); rolled back to its seal, %d files restored, the re-save "
                    "kept at %s", g.path, reason, len(plan["restore"]), plan["to"])

    def _has_files(self, g: GroupState) -> bool:
        pre = g.path + "/"
        return any(k.startswith(pre) for k in self.records)

    def _quarantine(self, g: GroupState, state: str, reason: str) -> None:
        """Move g into .ckptfs/quarantine by a journaled op.  Caller holds commit_lock."""
        to = quarantine_target(g)
        entry = {"op": "group_quarantine", "path": g.path, "to": to, "state": state, "reason": reason,
                 "time": time.time()}
        mark = self.journal.append(entry)
        try:
            move_group(self.store, g.path, to)
        except OSError:
            self.journal.retract(mark)
            raise
        with self.lock:  # the replay's own state change: g leaves the group table for a quarantine row
            apply_group_entry(self.records, self.groups, entry, self.quarantine)
        self.stats["groups_quarantined"] += 1
        self.events.emit(events.QUARANTINED, g.path, dst=to, reason=reason)
        log.warning("group %s is %s (%s); moved to %s", g.path, state, reason, to)

    def writer_killed(self, path: str, why: str) -> None:
        g = self.group_of(path)
        if g is not None and g.state == OPEN:
            g.reason = f"writer killed: {why}"

    def note_corrupt(self, path: str, detail: str) -> None:
        """A committed file failed verification (integrity/reads.py).  Never blocks: the sealed group holding
        it is marked and quarantined by the next sweep (listing its parent, looking it up, or the
        housekeeper within a second), so resume logic falls back to the newest good group."""
        g = self.group_of(path)
        if g is not None and g.state == SEALED and not g.corrupt:
            g.corrupt = f"{path[len(g.path) + 1:]}: {detail}"
            log.error("group %s is corrupt (%s); it will be quarantined", g.path, g.corrupt)
        self.events.emit(events.CORRUPT, path, reason=detail)

    def quarantine_corrupt(self, g: GroupState) -> bool:
        self.barrier()
        with self.commit_lock:
            if g.state != SEALED or self.groups.get(g.path) is not g:
                return False
            self._quarantine(g, CORRUPT, f"file failed verification: {g.corrupt}")
        return True

    def sweep_children(self, d: str) -> None:
        """Before listing ``d``: quarantine torn/corrupt groups and settle abandoned deletions in it."""
        pre = d + "/" if d else ""
        with self.lock:
            everyone = list(self.groups.values())
        for g in [g for g in everyone if g.state in (OPEN, TRASHED, SEALED) and g.path.startswith(pre)
                  and "/" not in g.path[len(pre):]]:
            if g.state == SEALED:
                if g.corrupt:
                    self.quarantine_corrupt(g)
            elif g.state == OPEN:
                self.check_torn(g)
            else:
                self._check_abandoned_delete(g)

    def _check_abandoned_delete(self, g: GroupState) -> None:
        if not g.pids or any(procinfo.is_alive(p) for p in g.pids) or not self.store.exists(g.path):
            return
        self.barrier()
        with self.commit_lock:
            if g.state == TRASHED and self.groups.get(g.path) is g:
                self._settle_deleting(g)

    def housekeeping(self) -> None:
        """Periodic: idle-seal groups whose rule allows it, quarantine torn ones."""
        now = time.time()
        for g in [g for g in self.groups.values() if g.state == TRASHED]:
            self._check_abandoned_delete(g)
        for g in [g for g in self.groups.values() if g.state == SEALED and g.corrupt]:
            self.quarantine_corrupt(g)
        for g in [g for g in self.groups.values() if g.state == OPEN]:
            if self.check_torn(g) or g.tentative:
                continue
            rule = self._rule_of(g)
            idle = now - (g.last_activity or g.created_at)
            if g.late and idle >= self.rules.idle_seconds and not self._busy(g):
                with self.commit_lock:  # only files added (a tmp file left by a live writer): G10
                    if g.state == OPEN and g.late:
                        self.seal_group(g, f"{LATE} (idle for {idle:.0f}s)")
            elif (rule.idle_seal and idle >= self.rules.idle_seconds and not self._busy(g) and self._has_files(g)
                    and not self._expects_marker(g)):
                with self.commit_lock:
                    if g.state == OPEN:
                        self.seal_group(g, f"idle for {idle:.0f}s")

    def settle_open_groups(self) -> None:
        """At unmount nothing can complete an open group any more: seal those whose rule allows
        idle sealing, quarantine the rest as torn (so the unmounted directory shows only
        sealed groups).  Caller holds commit_lock; no file is open."""
        for g in [g for g in self.groups.values() if g.state == OPEN]:
            interrupted = self._interrupted(g)
            if g.tentative:
                self.journal.append({"op": "group_forget", "path": g.path}, sync=False)
                del self.groups[g.path]  # no checkpoint file came: an ordinary directory
            elif g.late and not interrupted:
                self.seal_group(g, "unmount (files added after the seal)")
            elif (self._rule_of(g).idle_seal and not interrupted and self._has_files(g)
                  and not self._expects_marker(g)):
                self.seal_group(g, "unmount (idle)")
            elif not interrupted and not self._has_files(g) and not g.manifest_blake3:
                self.journal.append({"op": "group_forget", "path": g.path}, sync=False)
                del self.groups[g.path]  # nothing of a checkpoint in it: an ordinary directory
            else:
                self._tear(g, interrupted or "not sealed when the filesystem was unmounted")

    # ------------------------------------------------------- deferred delete
    def _newer_open_sibling(self, g: GroupState) -> bool:
        d = parent(g.path)
        return any(s.state == OPEN and s is not g and parent(s.path) == d for s in self.groups.values())

    def deleting_group(self, path: str) -> GroupState | None:
        """The sealed (or already being deleted) group that ``path`` belongs to: its deletion goes
        through the group's trash (G9)."""
        parts = path.split("/")
        for i in range(1, len(parts)):
            g = self.groups.get("/".join(parts[:i]))
            if g is None:
                continue
            if g.state == TRASHED and not g.moved_to.startswith(QUARANTINE):
                return g
            if g.state == SEALED:
                return g
            if g.state in (OPEN, SEALED):
                return None
        return None

    def defer_delete(self, g: GroupState, path: str, pid: int = 0) -> None:
        """Move ``path`` (a file in sealed group g) into g's trash instead of deleting it.

        The first deletion inside a sealed group starts the deletion of the whole group: a
        rotation killed half-way is finished by recovery (or the live sweep) once a newer
        sibling is sealed, and undone if none is.  Caller holds commit_lock."""
        to = f"{TRASH}/{g.id}"
        if g.state != TRASHED:
            if pid:
                # a writer deleting an older checkpoint (rotation, after its save returned) is done
                # with the groups it wrote: a later kill says nothing about them (issue 25: a loop
                # killed after ``shutil.rmtree`` of an old ckpt_N hid the save it had just finished)
                self._moved_on(path, procinfo.tgid(pid))
            self.journal.append({"op": "group_trash", "path": g.path, "to": to}, sync=False)
            g.state, g.moved_to = TRASHED, to
            g.pids = [procinfo.tgid(pid)] if pid else []
            g.reason = "being deleted"
            log.info("deletion of group %s started", g.path)
        dst = f"{to}/{path[len(g.path) + 1:]}"
        missing = []
        p = parent(dst)
        while p and not self.store.exists(p):
            missing.append(p)
            p = parent(p)
        for d in reversed(missing):
            self.store.mkdir(d, 0o700)
            if d == to or d.startswith(to + "/"):  # the user's directory it stands for: its owner and
                copy_owner_mode(self.store, g.path + d[len(to):], d)  # mode, for an undo (issue 26)
            self.store.fsync_dir(parent(d))
        self.ns_op({"op": "rename", "src": path, "dst": dst, "ino": self.store.lstat(path).st_ino},
                   lambda: self.store.rename(path, dst),
                    [parent(path), parent(dst)])
        with self.lock:
            move_prefix(self.records, path, dst)
        self.stats["deferred_deletes"] += 1

    def _has_newer_sealed(self, g: GroupState) -> bool:
        key = g.order
        d = parent(g.path)
        return any(s.state == SEALED and parent(s.path) == d
                   and s.order > key for s in self.groups.values())

    def deletion_done(self, path: str) -> None:
        """rmdir of a group being deleted (commit_lock held): purge now unless a newer sibling is open."""
        g = self.groups.get(path)
        if g is not None and g.state == TRASHED and not self._newer_open_sibling(g):
            self._purge(g)

    def _settle_deleting(self, g: GroupState) -> None:
        """Live sweep: the process deleting g died half-way.  Finish the deletion if a newer sibling
        is sealed, else put the group back (G9).  Caller holds commit_lock."""
        if self._newer_open_sibling(g):
            return
        if self._has_newer_sealed(g):
            rmtree(self.store, g.path)
            self._purge(g)
            self.events.emit(events.REMOVED, g.path, reason="abandoned deletion finished")
        else:
            move_tree_back(self.store, g.moved_to, g.path)
            self.journal.append({"op": "group_restore", "path": g.path})
            with self.lock:
                move_prefix(self.records, g.moved_to, g.path)
            g.state, g.moved_to, g.reason = SEALED, "", ""
            self.events.emit(events.RESTORED, g.path, reason="abandoned deletion undone")
            log.warning("group %s restored: its deletion stopped half-way and no newer group is sealed", g.path)

    def _purge(self, g: GroupState) -> None:
        self.journal.append({"op": "group_forget", "path": g.path})
        with self.lock:
            drop_prefix(self.records, g.moved_to)
            if self.groups.get(g.path) is g:
                del self.groups[g.path]
        try:
            remove_seal(self.store, g.id)
            rmtree(self.store, g.moved_to)
        except OSError as e:
            log.warning("could not delete %s (recovery/gc will): %s", g.moved_to, e)
        self.stats["deferred_deletes_done"] += 1

    def _purge_trashed(self, d: str, newer: GroupState) -> None:
        """A group sealed in ``d``: deletions of older siblings that waited for it happen now (G9)."""
        key = newer.order
        for g in [g for g in self.groups.values() if g.state == TRASHED and parent(g.path) == d
                  and g.moved_to.startswith(TRASH)]:
            if g.order > key or self.store.exists(g.path):
                continue  # newer than the sealed one, or still being deleted
            self._purge(g)

    # ------------------------------------------------------------- retention
    def apply_retention(self, d: str) -> None:
        """G8.  Caller holds commit_lock."""
        keep_last, keep_every = self.rules.keep_last, self.rules.keep_every
        if keep_last <= 0:
            return
        sibs = [g for g in self.groups.values() if parent(g.path) == d and g.state in (OPEN, SEALED)]
        if any(g.state == OPEN for g in sibs):
            return
        by_owner: dict[int, list[GroupState]] = {}
        for g in sibs:
            if g.step is None:
                continue
            try:
                uid = self.store.lstat(g.path).st_uid
            except OSError:
                continue
            by_owner.setdefault(uid, []).append(g)
        for owned in by_owner.values():  # (issue 26: one user's checkpoint-1000 retired another's)
            self._retain(sorted(owned, key=lambda g: g.order), keep_last, keep_every)

    def _retain(self, sealed: list[GroupState], keep_last: int, keep_every: int) -> None:
        """Retention among one owner's sealed groups of one directory, oldest first: the newest
        ``keep_last`` by step, every ``keep_every``-th step, and the one sealed last, whatever its
        step (issue 25: a lower step saved again after higher ones, a rollback's re-run, was retired
        the moment it sealed, before any upload: the only copy)."""
        keep = {g.path for g in sealed[-keep_last:]}
        if sealed:
            keep.add(max(sealed, key=lambda g: g.sealed_at).path)
        if keep_every > 0:
            keep |= {g.path for g in sealed if g.step is not None and g.step % keep_every == 0}
        for g in sealed:
            if g.path not in keep:
                if self.may_retire(g):
                    self._retire(g)
                else:
                    self.stats["retention_pinned"] += 1
                    log.info("retention: kept %s: its remote COMMIT is not confirmed yet (mirror)", g.path)

    def _retire(self, g: GroupState) -> None:
        to = f"{TRASH}/{g.id}"
        mark = self.journal.append({"op": "group_retire", "path": g.path, "to": to})
        try:
            move_group(self.store, g.path, to)
        except OSError:
            self.journal.retract(mark)
            raise
        crashpoints.hit("retire_moved")
        with self.lock:
            drop_prefix(self.records, g.path)
            self.groups.pop(g.path, None)
        self.stats["groups_retired"] += 1
        self.events.emit(events.REMOVED, g.path, reason="retention")
        log.info("retention: retired %s", g.path)
        try:
            remove_seal(self.store, g.id)
            rmtree(self.store, to)
        except OSError as e:
            log.warning("could not delete retired group %s (gc will): %s", to, e)

    def gc(self, dry_run: bool = False, pid: int = 0) -> dict[str, Any]:
        """Delete what was moved out of sight (every row of the quarantine table: torn and corrupt
        groups, torn re-saves' files), what lies in quarantine without a row, and retired groups'
        debris; never the trash of a deletion in progress (G9 may put it back).  ``dry_run``: only
        say what would go.  Returns the report (engine/quarantine.py ``report``), also kept for
        ``user.ckptfs.gc_report`` (the last one of process ``pid``)."""
        self.barrier()
        with self.commit_lock:
            with self.lock:
                live = dict(self.groups)
            items = qt.gc_plan(self.store, self.quarantine, live)
            if not dry_run:
                live_ids = {g.id for g in live.values()}
                for it in items:
                    if it["recorded"]:  # intent first: recovery finishes a deletion cut short
                        self.journal.append({"op": qt.FORGET, "to": it["kept_at"]})
                        with self.lock:
                            self.quarantine.pop(it["kept_at"], None)
                    rmtree(self.store, it["kept_at"])
                    if it["state"] != qt.DEBRIS and it["id"] and it["id"] not in live_ids:
                        remove_seal(self.store, it["id"])  # a group that is gone: its seal files too
                    log.info("gc: removed %s (%s, %s: %s; %d files, %d bytes)", it["kept_at"], it["path"] or "?",
                             it["state"], it["reason"], it["files"], it["bytes"])
                self.journal.compact(self.records, list(self.aborts), self.to_json())
        rep = qt.report(items, dry_run, pid)
        if not dry_run:
            self.stats["groups_gc"] += len(items)
            self.stats["gc_bytes_freed"] += rep["bytes_freed"]
        with self.lock:
            self.gc_reports.pop(pid, None)
            self.gc_reports[pid] = rep
            while len(self.gc_reports) > 16:
                self.gc_reports.popitem(last=False)
        return rep

    def gc_report_json(self, pid: int | None = None) -> str:
        """The last gc report of process ``pid`` (the one that set ``user.ckptfs.gc``), else the last
        one ("{}" before any); trimmed to fit an xattr (the daemon log lists every item)."""
        with self.lock:
            rep = self.gc_reports.get(pid) if pid is not None else None
            if rep is None and self.gc_reports:
                rep = next(reversed(self.gc_reports.values()))
        return json.dumps(qt.fit_report(rep or {}), sort_keys=True)

    # ------------------------------------------------------------ namespace
    def renamed(self, old: str, new: str) -> None:
        """Groups at or under ``old`` now live under ``new`` (ids, and so COMMITs, are unchanged)."""
        with self.lock:
            apply_group_entry({}, self.groups, {"op": "rename", "src": old, "dst": new})

    def exchanged(self, a: str, b: str) -> None:
        """Groups at or under ``a`` and ``b`` swapped places (``RENAME_EXCHANGE``)."""
        with self.lock:
            apply_group_entry({}, self.groups, {"op": "exchange", "src": a, "dst": b})

    def after_rename(self, old: str, new: str, is_dir: bool, pid: int) -> None:
        """Completion events carried by a rename (commit_lock held)."""
        if is_dir:
            g = self.live_group(new)
            if g is None and self.group_of(new) is None:
                rule = self.rules.dir_rule(os.path.basename(new))
                if rule is None or not self.groupable(new) or not self._renamed_checkpoint(old, new, rule):
                    return
                g = self._open_group(new, rule, pid)  # Orbax: a step directory renamed into place
            if g is not None and g.state == OPEN:
                self.seal_group(g, f"renamed into place from {old}", pid)
            return
        g = self.group_of(new)
        if g is not None and g.state == OPEN:
            d, base = parent_and_base(new)
            if d == g.path and base in self._rule_of(g).markers and not self._marked_unfinished(g):
                self.seal_group(g, f"marker {base} renamed into place", pid)  # DCP's .metadata
            elif g.seal_requested:
                self.seal_group(g, g.seal_requested)

    def _renamed_checkpoint(self, old: str, new: str, rule: Rule) -> bool:
        """Evidence that a directory renamed to ``new`` is a finished checkpoint: it comes from a
        temporary checkpoint name (Orbax's ``<step>.orbax-checkpoint-tmp-<ts>``) or holds files of
        its layout.  ``mv logs_tmp 2024`` stays an ordinary directory."""
        if TMP_DIR_RE.fullmatch(os.path.basename(old)):
            return True
        try:
            return any(rule.signs(n) for n in self.store.listdir(new))
        except OSError:
            return False

    def forget_dir(self, path: str) -> None:
        """A group directory was removed (its rmdir is journaled): drop its state and seal files."""
        with self.lock:
            g = self.groups.get(path)
            if g is None or g.state not in (OPEN, SEALED):
                return  # a TRASHED group stays known until purged or restored (G9)
            del self.groups[path]
        try:
            remove_seal(self.store, g.id)
        except OSError as e:
            log.warning("could not remove seal files of deleted group %s: %s", path, e)

    # ------------------------------------------------------------- reporting
    def to_json(self) -> dict[str, dict[str, Any]]:
        return {p: g.to_json() for p, g in self.groups.items()}

    def group_summary(self, g: GroupState) -> dict[str, Any]:
        d = g.to_json()
        if g.state == OPEN:
            d["busy"] = len(self._busy(g))
            pre = g.path + "/"
            recs = [r for k, r in self.records.items() if k.startswith(pre)]
            d["files"], d["bytes"] = len(recs), sum(r.size for r in recs)
        return d

    def groups_in(self, d: str) -> list[dict[str, Any]]:
        """Groups directly inside directory ``d`` (any state), oldest step first."""
        out = [self.group_summary(g) for g in self.groups.values() if parent(g.path) == d and not g.tentative]
        return sorted(out, key=lambda x: (x["step"] if x["step"] is not None else -1, x["created_at"]))

    def groups_json_attr(self, d: str) -> str:
        return json.dumps(self.groups_in(d), sort_keys=True)

    def quarantine_in(self, d: str) -> list[dict[str, Any]]:
        """What was moved out of sight from directory ``d`` (engine/quarantine.py ``rows_in``)."""
        with self.lock:
            table, live = dict(self.quarantine), dict(self.groups)
        return qt.rows_in(self.store, table, live, d)

    def quarantine_json_attr(self, d: str) -> str:
        return json.dumps(qt.fit_rows(self.quarantine_in(d)), sort_keys=True)

    def quarantine_json(self) -> dict[str, dict[str, Any]]:
        """The table as the snapshot holds it (compactions, journal.extra_state)."""
        with self.lock:
            return qt.to_json(self.quarantine)
