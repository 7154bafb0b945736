"""The facade: the filesystem's requests, independent of FUSE (adapter -> facade -> engine -> store).

:class:`CkptFS` checks paths (``.ckptfs`` invisible, the committed view read-only), keeps the open
handles, and dispatches to the engine: :class:`~ckptfs.engine.staged.Staging` (new versions, staged
bytes), :class:`~ckptfs.engine.commit.CommitEngine` (seal, install, namespace operations),
:class:`~ckptfs.engine.groups.GroupEngine` (checkpoint groups),
:class:`~ckptfs.integrity.reads.Integrity` (verified reads).  It announces what changed through
``self.events`` (events.py).

Paths are mount-relative without a leading slash ("" is the root).  Every
method raises ``OSError`` with an errno on failure; the FUSE adapter only
translates calls.

Invariants kept here (see docs/design.md):

I1  A path shows, after any crash, either its previous committed version or a
    complete new one; never a torn, empty-instead-of-old, or missing file.
I2  Committed state is the result of a prefix of the application's completed
    operations: commits and namespace changes become durable one at a time, in
    the order they completed (``commit_lock`` + the single in-flight journal).
I3  A version closed by a process dying of a signal, unlinked while open, or
    failing its format check is never installed.
I4  Internal metadata (``.ckptfs``) is invisible and unreachable via the mount.
I5  Lock order: ``commit_lock`` before ``lock``; never block on disk while
    holding ``lock`` (it guards the in-memory tables only; tests/test_arch_defects.py).
I8  A namespace change that is one change of one name, and that recovery reads from the
    disk alone, costs one sync: an unlink of a file outside groups and kept generations, a
    mkdir, an rmdir of a directory that is no group.  Entries owed are settled, the change
    made, its directory fsynced, then its entry appended done and unsynced
    (``CommitEngine.ns_op(after=True)``).  A power loss before the fsync leaves the name as
    it was or as changed (the operation was not acknowledged); after it, the change is on
    disk, and recovery drops the record of a file that is gone.  I2 holds: the change is
    durable before anything after it is journaled.  A rename is two changes: a power loss
    can leave the file under both names, which recovery must undo.  Only a rename of a
    temporary name over the name it stands for, in one directory, outside kept generations and
    outside groups or in an open group never sealed (``model.pt.tmp`` -> ``model.pt``,
    ``latest.tmp`` -> ``latest``, ``step_5/COMMIT.tmp`` -> ``step_5/COMMIT``) is I8:
    recovery recognizes that pair on the disk (R2, ``recovery.finish_temp_renames``).  Any
    other rename keeps its synced intent (without it the model checker's
    ``pointer_rotation`` under *weak* finds a left-over ``latest.tmp``).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptfs import META_DIR, __version__, acl, events, exits, procinfo, xattrs
from ckptfs.backing import BackingStore
from ckptfs.engine import staged
from ckptfs.engine.commit import CommitEngine
from ckptfs.engine.generations import Generations
from ckptfs.engine.groups import GroupEngine
from ckptfs.engine.pool import StagingPool
from ckptfs.engine.sealedview import SealedView
from ckptfs.engine.seals import CORRUPT, OPEN, SEALED, GroupState, SealError, read_seal
from ckptfs.engine.staged import NOBODY, Caller, Handle, Staging, Version
from ckptfs.engine.visibility import Visibility
from ckptfs.inodes import InodeMap
from ckptfs.integrity.reads import Integrity
from ckptfs.layout import COMMITTED_VIEW, move_prefix, parent, space_held, swap_prefix
from ckptfs.log.journal import COMPACT_EVERY, Journal
from ckptfs.records import FileRecord
from ckptfs.recovery import recover
from ckptfs.rules import TEMP_OF_RE, RuleSet
from ckptfs.xattrs import (
    PREFIX,
    VALUE_MAX,
    X_ABORTS,
    X_ATTRS,
    X_BACKING,
    X_BLAKE3,
    X_COMMIT_MODE,
    X_COMMITTED_AT,
    X_CONTROL,
    X_ERROR,
    X_GC,
    X_GC_REPORT,
    X_GENERATION,
    X_GROUP,
    X_GROUPS,
    X_LAST_ABORT,
    X_LINEAGE,
    X_MANIFEST_FILES,
    X_PID,
    X_QUARANTINE,
    X_RULES,
    X_SEAL,
    X_SIZE,
    X_SPACE,
    X_STATS,
    X_STATUS,
    X_VERSION,
)

log = logging.getLogger("ckptfs")

ENODATA = getattr(errno, "ENODATA", getattr(errno, "ENOATTR", 61))
WRITEBACK_WINDOW = 8 << 20  # staged data is pushed to disk in windows of this size while written
# writer passthrough (W3): granted only with at least this much free (or a quarter of the filesystem);
# a version it wrote is refused with ENOSPC if less than DISK_FULL_MARGIN (or 5 %) is free at its seal
PASSTHROUGH_WRITE_MIN_FREE = 1 << 30
DISK_FULL_MARGIN = 64 << 20
PACE_SECONDS = 0.02  # how often passthrough writers' filled windows start their writeback




def _err(code: int, msg: str = "") -> OSError:
    return OSError(code, msg or os.strerror(code))


def is_meta(path: str) -> bool:
    return path == META_DIR or path.startswith(META_DIR + "/")


def is_view(path: str) -> bool:
    return path == COMMITTED_VIEW or path.startswith(COMMITTED_VIEW + "/")


HIDDEN_RE = re.compile(r"\.fuse_hidden[0-9a-f]{16}")


def is_hidden_name(path: str) -> bool:
    """libfuse's name for an open file that was unlinked or replaced (``hard_remove`` off)."""
    return HIDDEN_RE.fullmatch(os.path.basename(path)) is not None


def reserved(path: str) -> bool:
    return is_meta(path) or is_view(path)


RENAME_EXCHANGE = 2
REPLACED_KEPT = 1024  # T6: how many renamed-over hidden names keep their attributes
READER_DRAIN_SECONDS = 2.0  # how long an O_TRUNC rewrite of a checkpoint file waits for cached readers


class CkptFS:
    """Crash-consistent checkpoint filesystem over a BackingStore: the facade (path checks and
    dispatch to the engine: engine/commit.py, engine/groups.py, integrity/reads.py)."""

    commit_engine: type[CommitEngine] = CommitEngine  # (the model checker's known-bad variants subclass it)

    def __init__(
        self,
        store: BackingStore,
        *,
        commit_mode: str = "sync",
        check_formats: bool = True,
        max_backlog: int = 64,
        max_backlog_bytes: int = 16 << 30,
        backing_label: str = "",
        rules: RuleSet | None = None,
        housekeeping_interval: float = 1.0,
        on_corrupt: str = "eio",
        keep_generations: int | None = None,
        scrub_interval: float = 0.0,
        scrub_rate_mb: float = 64.0,
        compact_every: int = COMPACT_EVERY,
        seal_parts: bool = False,
    ) -> None:
        if commit_mode not in ("sync", "async"):
            raise ValueError("commit_mode must be 'sync' or 'async'")  # before recovery touches the store
        self.store = store
        self.commit_mode = commit_mode
        self.rules = rules or RuleSet()
        self.check_formats = check_formats
        self.backing_label = backing_label
        self.lock = threading.RLock()  # the in-memory tables only (I5)
        self.journal = Journal(store, compact_every=compact_every)
        # seal_parts (mount --node-part): a node's part of a multi-node save left open by a crash is
        # sealed at recovery, not torn (recovery.settle_groups; docs/mirror.md)
        self.recovery = recover(store, self.journal, seal_parts=seal_parts)
        self.records: dict[str, FileRecord] = self.recovery.files
        self.groups = self.recovery.groups
        self.aborts: collections.deque[dict] = collections.deque(self.recovery.aborts, maxlen=100)
        self.last_abort: dict[str, str] = {}
        self.pending: dict[str, Version] = {}  # path -> version open for writing
        self.queued: dict[str, Version] = {}  # path -> newest sealed version awaiting install (async)
        self.in_place: dict[str, Version] = {}  # path -> its in-place version, until readers follow it (I7)
        self.handles: dict[int, Handle] = {}
        self.inodes = InodeMap()  # the st_ino the mount reports (stable across versions)
        self.hidden: dict[str, str] = {}  # libfuse's .fuse_hidden name of an open, unlinked file -> its old path
        # the committed view (.ckptfs-committed) never shadows a real directory of that name (issue 26:
        # the user's files in it were hidden behind the view)
        self.view_enabled = not store.exists(COMMITTED_VIEW)
        if not self.view_enabled:
            log.warning("%s exists in the directory: the committed view is off for this mount", COMMITTED_VIEW)
        self.mountpoint: str | None = None  # where it is mounted (absolute), set by the mount command
        # T6: hidden names of files renamed over -> their attributes then (bounded; oldest dropped).
        # A request still arriving on one after its last handle closed (the kernel's walk began before
        # the rename) is answered as natively: stat gets the file it was, open ESTALE (look again)
        self.replaced: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._next_fh = 1
        self.ns_seq = 0  # completed unlinks and renames (under lock): _publish_new re-checks across one
        self.stats: collections.Counter[str] = collections.Counter()
        self.events = events.Events()  # what changed, for adapters (cache invalidation) and the mirror
        # more status attributes of a path, from components above the core that subscribe to its
        # events (the mirror's upload state): path -> {name: value}; they must not block
        self.attr_sources: list[Callable[[str], dict[str, str]]] = []
        self.on_shutdown: list[Callable[[], None]] = []  # run first at unmount (the mirror stops its uploads)
        self.shut_down = False
        # kept previous versions (G11, --on-corrupt rollback): written by the commit path
        # kept previous versions: ``keep_generations`` None (the default) keeps one where it serves,
        # for files in checkpoint groups (G11 rolls a torn re-save back to them) and, with
        # --on-corrupt rollback, for every file (its rollback target); a number keeps that many for
        # every overwritten file (issue 25: an in-place model.pt doubled the disk out of sight)
        self.gens = Generations(store, 1 if keep_generations is None else keep_generations,
                                self.recovery.generations,
                                everywhere=keep_generations is not None or on_corrupt == "rollback")
        self.journal.extra_state = lambda: {"generations": self.gens.to_json(),
                                            "quarantine": self.grp.quarantine_json()}
        # the commit path (engine/commit.py): seal, install, namespace ops, the async committer
        self.commit = self.commit_engine(
            store=store, journal=self.journal, records=self.records, pending=self.pending, queued=self.queued,
            aborts=self.aborts, last_abort=self.last_abort, stats=self.stats, lock=self.lock, gens=self.gens,
            inodes=self.inodes, events_hub=self.events, keep_plan=self._keep_plan,
            check_formats=check_formats, commit_mode=commit_mode, max_backlog=max_backlog,
            max_backlog_bytes=max_backlog_bytes)
        self.commit_lock = self.commit.commit_lock
        self.committer = self.commit.committer
        self.staging = Staging(store, self.inodes, self.lock, self._visible, self.commit.unpublish, self._unref)
        self.grp = GroupEngine(  # checkpoint groups (engine/groups.py)
            store=store, journal=self.journal, rules=self.rules, records=self.records, groups=self.groups,
            pending=self.pending, queued=self.queued, aborts=self.aborts, lock=self.lock,
            commit_lock=self.commit_lock, stats=self.stats, gens=self.gens, events=self.events,
            barrier=self.commit.barrier, ns_op=self.commit.ns_op, children_pending=self._children_pending,
            lexists=self._lexists, quarantine=self.recovery.quarantine)
        self.commit.groups = self.grp
        # what other processes see of a file being written; what a killed writer leaves (V1, V2)
        self.vis = Visibility(self.rules, lambda p: self.grp.group_of(p) is not None)
        self.isolate_writers = os.environ.get("CKPTFS_WRITER_DIRECT_IO", "1") != "0"
        # passthrough (the kernel reads and writes backing files without the daemon) only where the
        # store need not see every byte; writers only if CKPTFS_WRITE_PASSTHROUGH is not 0 (W1)
        self.bypass_ok = bool(getattr(store, "bypassable", False))
        self.write_passthrough = self.bypass_ok and os.environ.get("CKPTFS_WRITE_PASSTHROUGH", "1") != "0"
        # empty staging files made ahead, off the request path (engine/pool.py), on a real backing
        # directory only: a recording or fault-injecting store sees every file made when it is needed
        if self.bypass_ok and os.environ.get("CKPTFS_STAGING_POOL", "1") != "0":
            self.staging.pool = StagingPool(store)
        # is a closing process dying (signal), or exiting non-zero with its files open? (a seam for the model checker)
        self.exit_state = procinfo.exit_state
        # checkpoint paths an O_TRUNC rewrite is about to start at -> the processes (tgids) starting them
        self.arriving: dict[str, list[int]] = {}
        # versions whose writer's handle is released but whose W2 check (_after_bypass) has not
        # compared yet: id -> [version, releases in progress] (a utime meanwhile is not a write)
        self._w2_checks: dict[int, list] = {}
        self._w2_lock = threading.Lock()
        # verify-on-read, on demand and in the background (integrity/reads.py)
        # what another job sees of a sealed group being saved again: its last seal (RS1)
        self.sealed = SealedView(store, self.records, self.gens.of)
        self.integrity = Integrity(store, self.records, self.gens, self.commit_lock, self.stats, self.grp.note_corrupt,
                                   on_corrupt=on_corrupt, scrub_interval=scrub_interval,
                                   scrub_rate_mb=scrub_rate_mb, metadata_problems=self.recovery.problems)
        self._stop = threading.Event()
        self._housekeeper: threading.Thread | None = None
        if housekeeping_interval > 0:
            exits.watcher()  # process exit events from now on (engine/groups.py _judge_tentative)
            self._housekeeper = threading.Thread(target=self._housekeep, args=(housekeeping_interval,),
                                                 name="ckptfs-housekeeper", daemon=True)
            self._housekeeper.start()
        self._writeback = getattr(store, "writeback_hint", None) or (lambda fd, off, n: None)
        self._paced: dict[int, Version] = {}  # open passthrough writers' versions (the pacer's work list)
        self._paced_lock = threading.Lock()
        self._pacer: threading.Thread | None = None
        log.info("recovery: %s", self.recovery.summary())

    def _housekeep(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.grp.housekeeping()
            except Exception:  # never let a background check kill the daemon
                log.exception("housekeeping failed")

    # ------------------------------------------------------------------ util
    @staticmethod
    def norm(path: str) -> str:
        return path.strip("/")

    def _is_view(self, path: str) -> bool:
        return self.view_enabled and is_view(path)

    def _check_visible(self, path: str) -> None:
        if is_meta(path):
            raise _err(errno.ENOENT)
        if self._is_view(path):
            raise _err(errno.EROFS)

    def _view_real(self, path: str) -> str:
        """The real path a committed-view path shows; ENOENT where the view hides it.

        The view shows only sealed groups and installed file versions (the
        backing path's content), never open, torn or corrupt groups."""
        real = path[len(COMMITTED_VIEW):].strip("/")
        if is_meta(real) or self._is_view(real):
            raise _err(errno.ENOENT)
        g = self.groups.get(real)
        if g is not None and g.state != SEALED:
            raise _err(errno.ENOENT)
        g = self.grp.group_of(real)
        if g is not None and g.state != SEALED:
            raise _err(errno.ENOENT)
        return real

    def _lexists(self, path: str) -> bool:
        return self._visible(path) is not None or self.store.exists(path)

    def _visible(self, path: str) -> Version | None:
        """The staged version of ``path`` its writers see (read-your-writes), if any."""
        with self.lock:
            return self.pending.get(path) or self.queued.get(path)

    def _seen_by(self, path: str, caller: Caller) -> Version | None:
        """The staged version of ``path`` that ``caller`` sees, if any: None while it is a checkpoint
        file being written by another process (V1, engine/visibility.py; /proc reads: never under
        ``lock``)."""
        v = self._visible(path)
        if v is not None and self.vis.isolated(v, caller):
            self.stats["isolated_lookups"] += 1
            return None
        return v

    def _resaving(self, path: str) -> GroupState | None:
        """The sealed group being saved again (RS1) that is or contains ``path``, if any."""
        g = self.groups.get(path)
        if not SealedView.applies(g) or g.tentative:  # type: ignore[union-attr]
            g = self.grp.group_of(path)
        return g if SealedView.applies(g) else None

    def _sealed_view(self, path: str, caller: Caller) -> tuple[GroupState, dict] | None:
        """RS1 (engine/sealedview.py): the group being saved again that is or contains ``path`` and
        the files of its last seal, where ``caller`` is outside its writers' job and such a view
        exists; None: ``caller`` sees ``path`` as it is."""
        if caller.pid <= 0:
            return None
        g = self._resaving(path)
        if g is None or self.grp.sees(g, caller.pid):
            return None
        files = self.sealed.files(g)
        return None if files is None else (g, files)

    def _sealed_lstat(self, path: str, caller: Caller) -> os.stat_result | None:
        """RS1: the stat ``caller`` gets of ``path`` in the last seal of a group being saved again
        (ENOENT: not in it); None where no such view applies (or ``path`` is a directory of it)."""
        got = self._sealed_file(path, caller, self.store.lstat)
        return None if got is None else got[0]

    def _sealed_file(self, path: str, caller: Caller, get: Callable[[str], Any]) -> tuple[Any, str, Any] | None:
        """RS1: ``(get(backing), backing, record)`` for the file ``path`` shows ``caller`` in the last
        seal of the group being saved again that contains it (``get``: lstat, or open returning an
        fd); ENOENT where the seal has no such file; None where no view applies or ``path`` is a
        directory of the group.  The view and the store agree: a commit installing a file of the
        group meanwhile (its rename lands before its record) is waited for under the commit lock."""
        for locked in (False, True):
            with self.commit_lock if locked else contextlib.nullcontext():
                r = self._sealed_view(path, caller)
                if r is None:
                    return None
                g, files = r
                if path == g.path:
                    return None
                hit = files.get(path)
                if hit is None:
                    if path in self._sealed_dirs(g, files):
                        return None
                    self.stats["sealed_view_hidden"] += 1
                    raise _err(errno.ENOENT, f"{path}: not in the last seal of {g.path}, being saved again")
                b, rec = hit
                try:
                    obj = get(b)
                except FileNotFoundError:
                    if locked:
                        raise
                    continue
                ino = obj.st_ino if isinstance(obj, os.stat_result) else self.store.fstat(obj).st_ino
                if not rec.ino or ino == rec.ino or locked:
                    return obj, b, rec
                if not isinstance(obj, os.stat_result):
                    self.store.close(obj)
        raise AssertionError("unreachable")

    @staticmethod
    def _sealed_dirs(g: GroupState, files: dict) -> set[str]:
        out = set()
        for p in files:
            d = parent(p)
            while d.startswith(g.path + "/"):
                out.add(d)
                d = parent(d)
        return out

    def _open_sealed(self, path: str, caller: Caller) -> int | None:
        """RS1: a read-only handle on ``path`` as in the last seal of the group being saved again
        that contains it, for ``caller`` outside its writers' job; None where no such view applies."""
        r = self._sealed_view(path, caller)
        if r is None:
            return None
        if path == r[0].path or path in self._sealed_dirs(*r):
            raise _err(errno.EISDIR)
        got = self._sealed_file(path, caller, lambda b: self.store.open(b, os.O_RDONLY))
        if got is None:
            return None
        fd, b, rec = got
        if b == path:
            # the sealed file itself: checked against the sealed record, not the path's record
            # now, which a commit installing the re-save's file may have changed since (checked
            # against that one, the path was reopened: the new file, served to another job as
            # sealed; the re-save race campaign's rare mixed pass)
            fd, chk = self.integrity.open_committed(path, fd, rec if rec.ino else None)
        else:
            chk = self.integrity.open_kept(path, fd, rec)
        self.integrity.bind(fd, chk)
        self.stats["sealed_view_opens"] += 1
        return self._new_fh(Handle(path=path, writable=False, fd=fd, pid=caller.pid))

    def isolated(self, path: str, caller: Caller) -> bool:
        """Whether ``caller`` sees the committed version of ``path`` while another process writes
        a new one (V1): the native transport then hands it the path's reader node (fuse/nodes.py T5).
        The same from the moment an O_TRUNC rewrite starts draining readers (``arriving``) until
        its version is published: the committed version is what everyone but the writer sees, and
        the writer's truncation is about to reach the kernel inode the path's lookups returned."""
        if caller.pid > 0 and self._resaving(path) is not None:
            r = self._sealed_view(path, caller)
            if r is not None and path != r[0].path and path not in self._sealed_dirs(*r):
                return True  # RS1: the last seal's file (or none), not the writers' node
        v = self._visible(path)
        if v is not None:
            return self.vis.isolated(v, caller)
        if caller.pid <= 0 or path not in self.arriving:  # unlocked peek: the common case
            return False
        with self.lock:
            by = set(self.arriving.get(path, ()))
        return bool(by) and Visibility.family(by, caller.pid) == "other"

    def rewriting(self, path: str) -> bool:
        """Whether a version of ``path`` is open (or an O_TRUNC rewrite is starting) that some
        callers are isolated from (V1)."""
        if path in self.arriving or self._resaving(path) is not None:
            return True  # (RS1: another job sees the last seal)
        v = self._visible(path)
        return (v is not None and v.state == staged.OPEN and not v.appending and not v.in_place
                and self.vis.checkpoint_file(v.path))

    def isolates(self, path: str) -> bool:
        """Whether a rewrite of ``path`` hides from other processes until it is sealed (V1)."""
        return self.isolate_writers and self.vis.checkpoint_file(self.norm(path))

    def volatile(self, path: str, attr: bool = False) -> bool:
        """Whether the kernel must not cache the entry (``attr``: the attributes) of ``path`` (the
        native transport's timeouts, fuse/ops.py): what it shows depends on who asks (an open or
        queued version, V1), or is checked only when it is looked at (an open group's directory:
        torn detection runs on its lookup; a sealed group found corrupt, or anything in one:
        quarantine), or it is a hidden name or the committed view.  Everything else changes only
        through a request for it or with an event naming it (events.py, E3), so a cached answer
        stays exact until invalidated.

        An open group's *entry* is never cached, so every path walk through it looks it up and
        the torn check runs; its attributes and the names inside it are cached: a tear moves the
        group and emits an event, which drops them (C1).  (They were uncached too until the W7
        profile: 77 LOOKUP/GETATTR requests per 5-file group, a third of the daemon's time.)"""
        path = self.norm(path)
        if self._is_view(path) or is_meta(path) or path in self.hidden:
            return True
        if self.isolates(path):
            # only a checkpoint file's version is shown per caller (V1); any other open or queued
            # version is what everyone sees, and the kernel keeps its size itself as the writer
            # writes (its publish, or its discard, is an event that drops the cached answer: C1).
            # Caching those (issue 27) saves two GETATTRs per small file written (fuse/ops.py)
            with self.lock:
                if path in self.pending or path in self.queued:
                    return True
                if attr and any(h.writable and h.path == path for h in self.handles.values()):
                    # open for writing, not written yet: its first write makes a version others are
                    # isolated from (V1), and attributes cached now would outlive that (fsx -c 50 beside
                    # a reader: a stale i_size for the writer's own lseek)
                    return True
        p = path
        while True:
            g = self.groups.get(p)
            if g is not None and (g.corrupt or (p == path and not attr and g.state == OPEN)):
                return True
            if p != path and SealedView.applies(g):
                return True  # inside a group being saved again: what it shows depends on the job (RS1)
            if not p:
                return False
            p = parent(p)

    def listing_stable(self, path: str) -> bool:
        """Whether the kernel may cache the listing of directory ``path`` (the native transport's
        FOPEN_CACHE_DIR): it is the same for every caller (no open or queued version in it: a new
        checkpoint file is listed per caller, V1; no hidden name in it) and nothing in it is judged
        when it is listed (no open, deleting or corrupt group directly in it: ``sweep_children``;
        the directory itself not volatile, e.g. an open group).  Every other change of the
        listing is a request the kernel sees (it drops its cache) or an event
        (fuse/notify.py drops it: C2)."""
        path = self.norm(path)
        if self.volatile(path):
            return False
        pre = path + "/" if path else ""

        def direct(p: str) -> bool:
            return p.startswith(pre) and "/" not in p[len(pre):]

        with self.lock:
            if any(direct(p) for p in (*self.pending, *self.queued, *self.hidden)):
                return False
            return not any(direct(g.path) and (g.state != SEALED or g.corrupt) for g in self.groups.values())

    def _children_pending(self, path: str) -> bool:
        pre = path + "/" if path else ""
        return any(p.startswith(pre) for p in (*self.pending, *self.queued))

    def _new_fh(self, h: Handle, decide: Callable[[Handle], None] | None = None) -> int:
        """Register ``h``; ``decide(h)`` runs under ``lock`` just before, atomically with it."""
        with self.lock:
            if decide is not None:
                decide(h)
            fh = self._next_fh
            self._next_fh += 1
            self.handles[fh] = h
            return fh

    def _handle(self, fh: int) -> Handle:
        try:
            return self.handles[fh]
        except KeyError:
            raise _err(errno.EBADF) from None

    # ------------------------------------------------------- control verbs
    def seal(self, path: str, pid: int = 0) -> GroupState:
        """``ckptfs seal`` / ``user.ckptfs.seal``: the directory at ``path`` becomes a sealed group."""
        return self.grp.seal(path, pid)

    def apply_retention(self, d: str) -> None:
        """Run retention (G8) in directory ``d`` now: the mirror calls it once a group that retention
        had to keep (its remote COMMIT not yet confirmed) is committed remotely."""
        self.commit.barrier()
        with self.commit_lock:
            self.grp.apply_retention(d)

    def _keep_plan(self, path: str, prev: FileRecord | None) -> dict | None:
        """Whether (and how) the committed version an install or a rename replaces at ``path`` is
        kept as a generation: where it serves (``Generations.everywhere``, else in a checkpoint
        group).  Commit lock held."""
        if not self.gens.everywhere and self.grp.group_of(path) is None:
            return None
        return self.integrity.keep_plan(path, prev)

    def gc(self, dry_run: bool = False, pid: int = 0, generations: bool = False) -> dict[str, Any]:
        """``ckptfs gc`` / ``user.ckptfs.gc``: delete quarantined groups and debris, and with
        ``generations`` every kept previous version too; the report."""
        if not generations:
            return self.grp.gc(dry_run, pid)
        self.commit.barrier()
        with self.commit_lock:
            with self.lock:
                kept = self.gens.drop_all(dry_run)
            if not dry_run:
                self.gens.collect()  # (a crash before the compaction: recovery drops the missing ones)
                self.commit.compact()
        rep = self.grp.gc(dry_run, pid)
        rep["generations_removed"] = len(kept)
        rep["generations_bytes"] = sum(size for _, size in kept)
        rep["bytes_freed"] += rep["generations_bytes"]
        if not dry_run:
            self.stats["gc_bytes_freed"] += rep["generations_bytes"]
        with self.lock:
            self.grp.gc_reports[pid] = rep
        return rep

    def served(self, fh: int) -> tuple[str, tuple | None] | None:
        """The path of open handle ``fh`` and the verified version key it reads from (None for a
        writer, a staged version or an unverified file); None if ``fh`` is not open."""
        h = self.handles.get(fh)
        if h is None:
            return None
        if h.writable or h.version is not None or h.fd is None:
            return h.path, None
        chk = self.integrity.checks.get(h.fd)
        return h.path, (chk.key if chk is not None else None)

    def _unref(self, v: Version) -> None:
        """Drop a reference taken on v under ``lock`` (Staging.existing_attrs); close its fd if it
        was the last one of a finished version."""
        with self.lock:
            v.refs -= 1
            fd = self.commit.take_fd(v)
        self.commit.close_quiet(fd)

    def direct_io(self, fh: int) -> bool:
        """Whether the open that returned ``fh`` bypasses the kernel's page cache: a writer (not an
        appender) of a checkpoint file.  The cache belongs to the path's kernel inode, which readers
        of the committed version share; a writer's bytes copied into it would reach them (V1)."""
        h = self.handles.get(fh)
        if h is None:
            return False
        return h.direct or (h.writable and not h.appending and self.isolate_writers
                            and self.vis.checkpoint_file(h.path))

    def passthrough_fd(self, fh: int) -> int | None:
        """The backing fd the kernel may read from directly (FUSE passthrough) for handle ``fh``, or
        None if the daemon must serve its reads: a writer, a staged version (read-your-writes).  (A
        reader isolated from a rewrite in progress qualifies too, but the transport gives it
        passthrough only where no other kind of open shares its kernel inode: P2 in
        fuse/passthrough.py.)  A committed file is verified completely first (once per version):
        the daemon sees none of the reads that follow.  Raises EIO if it is corrupt."""
        h = self.handles.get(fh)
        if h is None or h.writable or h.version is not None or h.fd is None or not self.bypass_ok:
            return None
        self.integrity.verify_whole(h.fd)
        self.stats["passthrough_candidates"] += 1  # the transport counts those it grants (passthrough_opens)
        return h.fd

    def write_passthrough_fd(self, fh: int) -> int | None:
        """The staging fd the kernel may write (and read) directly for writer handle ``fh`` (FUSE
        passthrough), or None.  Only a checkpoint file's new version made by this very open (a
        create or an O_TRUNC rewrite, not an append) that no other handle shares: the bulk writes
        of a save.  A grant must be followed by :meth:`bypass` before the open is answered."""
        if not self.write_passthrough:
            return None
        h = self.handles.get(fh)
        if h is None or not h.writable or h.appending or not h.published:
            return None
        if not self.isolates(h.path) and not self._temp_of_checkpoint(h.path):
            return None
        v = h.version
        with self.lock:
            if (v is None or v.state != staged.OPEN or v.refs != 1 or v.writers != 1 or v.doomed
                    or v.unlinked or v.size):
                return None
        free, total = self._space()
        if free < min(PASSTHROUGH_WRITE_MIN_FREE, total // 4):
            self.stats["passthrough_writers_low_space"] += 1
            return None  # W3: the daemon sees every write (and its ENOSPC) where space is short
        return v.fd

    def _temp_of_checkpoint(self, path: str) -> bool:
        """Whether ``path`` is an already-atomic writer's temporary file of a checkpoint file
        (``model.pt.tmp``, renamed over ``model.pt`` once written): its bulk writes go through
        writer passthrough too (issue 27).  It is not isolated (V1: not a checkpoint name), so other
        processes read its staged bytes through the daemon as it is written, as natively.  Its
        node follows the rename (fuse/nodes.py T9)."""
        m = TEMP_OF_RE.fullmatch(os.path.basename(path))
        if m is None or m.group(1) in self.vis.rules.pointer_names():
            return False  # (a pointer's few bytes: the daemon's WRITE is cheaper than a backing file)
        return self.vis.checkpoint_file(os.path.join(parent(path), m.group(1)))

    @staticmethod
    def _temp_rename(old: str, new: str) -> bool:
        """Whether renaming ``old`` over ``new`` puts a temporary file in place of the name it stands
        for, in one directory (``model.pt.tmp`` -> ``model.pt``, ``latest.tmp`` -> ``latest``): then a
        power loss that leaves the file under both names is recognized by recovery from the disk
        alone (R2, recovery.finish_temp_renames), and the rename needs no synced intent (I8)."""
        if parent(old) != parent(new):
            return False
        m = TEMP_OF_RE.fullmatch(os.path.basename(old))
        return m is not None and m.group(1) == os.path.basename(new)

    def _in_unsealed_group(self, path: str) -> bool:
        """Whether ``path`` lies in an open group that was never sealed (no re-save, no late
        reopening, nothing kept or rolled back to): a temporary name renamed over its name there is
        I8 as outside groups (W7, an already-atomic writer's group: ``model.pt.tmp`` -> ``model.pt``,
        ``COMMIT.tmp`` -> ``COMMIT``), a tentative group's too (the rename promotes it: its entry is
        settled before the rename, as any entry owed).  Nothing of such a group's state is
        journaled by the rename (its members are the records at its seal, its seal follows the
        rename's directory fsync), so recovery reads the rename from the disk alone, R2 included
        (model checker: ``atomic_group``)."""
        g = self.grp.group_of(path)
        if g is None:  # a tentative group (``mkdir step_5``: no checkpoint file yet) the rename may promote
            g = self.groups.get(parent(path))
            if g is None or not g.tentative:
                return False
        # (never sealed: no manifest, so no re-save either, SealedView.applies)
        return g.state == OPEN and not g.late and not g.manifest_blake3 and not g.corrupt and not g.seal_requested

    def _space(self) -> tuple[int, int]:
        """(bytes free, size) of the backing filesystem (as root writes: f_bfree)."""
        try:
            sv = self.store.statvfs()
        except OSError:
            return 0, 0
        return sv.f_bfree * sv.f_frsize, sv.f_blocks * sv.f_frsize

    def _check_space_after_bypass(self, v: Version) -> None:
        """W3: a write the kernel made for a passthrough writer that failed with ENOSPC reached the
        application, never the daemon, and the writer may close the file anyway: a cut-off version
        must not replace the committed one.  If the backing filesystem is (nearly) full when such a
        version is sealed, it is refused with ENOSPC, as a write the daemon saw fail is; a save that
        filled the disk exactly is refused too (it cannot be told from a cut-off one)."""
        if not v.bypassed:
            return
        free, total = self._space()
        if free >= min(DISK_FULL_MARGIN, total // 20):
            return
        v.doomed = "the backing filesystem filled up while it was written (a write may have failed)"
        v.doomed_errno = errno.ENOSPC
        self.stats["passthrough_writers_disk_full"] += 1
        self.commit.unpublish(v)
        raise _err(errno.ENOSPC, f"ckptfs: {v.path} not committed: {v.doomed}")

    def bypass(self, fh: int) -> None:
        """The transport gave ``fh``'s version to the kernel to write (W1): the daemon will see none
        of its writes, so its digest is computed from the staging file when it is sealed."""
        v = self._handle(fh).version
        assert v is not None
        with v.lock:
            v.bypassed = True
            v.digest.stale = True
            v.shows_ino = v.ino
        self.stats["passthrough_writers"] += 1
        with self._paced_lock:
            self._paced[id(v)] = v
            if self._pacer is None:
                self._pacer = threading.Thread(target=self._pace_writeback, name="ckptfs-pacer", daemon=True)
                self._pacer.start()

    def _pace_writeback(self) -> None:
        """W1: the kernel writes a passthrough writer's staging file without us, so the writeback
        hints the WRITE path gives every WRITEBACK_WINDOW (``write``) come from here: every
        PACE_SECONDS, the windows each open bypassed version has filled since start their
        writeback, so the disk works while the application writes and the seal's fsync finds
        little left.  A hint only: it changes no state (it runs under the version's lock, so never
        on a closed fd)."""
        while not self._stop.wait(PACE_SECONDS):
            with self._paced_lock:
                items = list(self._paced.items())
            for key, v in items:
                with v.lock:
                    if v.state != staged.OPEN:
                        with self._paced_lock:
                            self._paced.pop(key, None)
                        continue
                    try:
                        size = self.store.fstat(v.fd).st_size
                    except OSError:
                        continue
                    upto = size // WRITEBACK_WINDOW * WRITEBACK_WINDOW
                    if upto > v.hinted:
                        self._writeback(v.fd, v.hinted, upto - v.hinted)
                        v.hinted = upto  # (the seal starts the rest: CommitEngine.seal)

    def _after_bypass(self, v: Version, wait: bool = False) -> None:
        """W2: the kernel writes a bypassed version's staging file for as long as its handle is open,
        also after the version was sealed and installed (an fsync, then more writes; a forked child
        writing after its parent's close), and nothing stops those writes.  So at every fsync, flush
        and the release of such a handle: if the bytes changed since the seal (size or mtime), they
        are committed again, as a new version of the path that shows them now (``wait``: durably
        before returning, for an fsync)."""
        if v.state == staged.OPEN or not v.sealed_key:
            return
        if v.state in (staged.QUEUED, staged.COMMITTING):
            self.commit.wait_done(v)  # its install first (async mode)
        if v.state != staged.INSTALLED:
            return
        with self._w2_lock:  # (a utime's own change of the mtime is never taken for a write)
            try:
                st = self.store.fstat(v.fd)
            except OSError:
                return
            if (st.st_size, st.st_mtime_ns) == v.sealed_key:
                return
            v.sealed_key = (st.st_size, st.st_mtime_ns)  # (before the copy: a write during it is found next time)
        path = self._path_showing(v.shows_ino)
        if path is None:
            return  # unlinked or replaced since: no path shows these bytes, as natively
        log.warning("%s: written through its open file after it was committed (passthrough): "
                    "committing its bytes again", path)
        self.stats["passthrough_reseals"] += 1
        nv = self.staging.new_version(path, 0, NOBODY, src_fd=v.fd, like=st, xattrs_from=v.fd)
        nv.keep_prev = False  # what it replaces no longer holds its recorded bytes: never a generation
        with self.lock:
            cur = self.pending.get(path)
            newer = cur is not None and cur.state == staged.OPEN
            if not newer:
                self.pending[path] = nv
                nv.refs = nv.writers = 1
        if newer:  # a newer version is being written there: it replaces these bytes anyway
            self.staging.drop_staging(nv)
            return
        fh = self._new_fh(Handle(path=path, writable=True, version=nv, published=True))
        try:
            self.commit.commit(nv, wait=wait)
            v.shows_ino = nv.ino
        except OSError:
            self.commit.unpublish(nv)  # refused or failed: the path shows what it showed
            raise
        finally:
            self.release(fh)

    def _change_bypassed(self, v: Version, fn: Callable[[int], None]) -> bool:
        """W2: a truncate or fallocate through a passthrough writer's handle after its version was
        installed (an fsync, then ``ftruncate``) changes the file the kernel keeps writing for that
        handle, never a copy of it: the kernel's later writes land in that file, so a truncated
        clone would lose them (issue 24: fsync, ftruncate(40000), write at 160000 committed 40000
        bytes).  The handle's next fsync, flush or release commits the result again
        (``_after_bypass``).  False if the version is gone (discarded): the caller makes a new
        version as for any handle."""
        if v.state in (staged.QUEUED, staged.COMMITTING):
            self.commit.wait_done(v)  # its install first (async mode)
        with v.lock:
            if v.state != staged.INSTALLED or v.fd < 0:
                return False
            fn(v.fd)
        self.stats["passthrough_changes_after_commit"] += 1
        return True

    def _path_showing(self, ino: int) -> str | None:
        """The committed path whose backing file is inode ``ino`` (a renamed file moved its record)."""
        with self.lock:
            paths = [p for p, r in self.records.items() if r.ino == ino]
        for p in paths:
            try:
                if self.store.lstat(p).st_ino == ino:
                    return p
            except OSError:
                continue
        return None

    def handles_at(self, path: str) -> list[int]:
        """The open handles at ``path``."""
        with self.lock:
            return [f for f, h in self.handles.items() if h.path == path]

    def _pool_stats(self) -> dict[str, int]:
        p = self.staging.pool
        return {} if p is None else {"staging_pool_taken": p.taken, "staging_pool_misses": p.misses}

    def shutdown(self) -> None:
        """Finish queued commits, discard open versions' staging, close fds."""
        if self.shut_down:
            return
        for fn in self.on_shutdown:
            try:
                fn()
            except Exception:
                log.exception("shutdown hook failed")
        self._stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join()
        self.integrity.stop()
        self.commit.stop()
        if self.staging.pool is not None:
            self.staging.pool.stop()
            self.stats.update(self._pool_stats())
        with self.commit_lock, self.lock:
            for h in list(self.handles.values()):
                for fd in ([h.fd] if h.fd is not None else []) + h.retired:
                    self.store.close(fd)
            self.handles.clear()
            for v in list(self.pending.values()):
                self.commit.discard(v, "filesystem unmounted while file open")
            try:
                self.grp.settle_open_groups()
            except OSError as e:
                log.warning("could not settle open groups at unmount (recovery will): %s", e)
            try:
                self.commit.compact(clean=True)
            except OSError as e:
                log.warning("final compaction failed (recovery will replay the journal): %s", e)
            self.journal.close()
            self.shut_down = True
            log.info("shutdown complete: %s", dict(self.stats))

    # --------------------------------------------------------------- getattr
    def _st(self, st: os.stat_result) -> dict[str, Any]:
        return {
            "st_mode": st.st_mode, "st_ino": self.inodes.reported(st.st_ino), "st_nlink": st.st_nlink,
            "st_uid": st.st_uid, "st_gid": st.st_gid, "st_size": st.st_size,
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns,
            "st_blocks": st.st_blocks, "st_blksize": st.st_blksize, "st_rdev": st.st_rdev,
        }

    def _fstat_handle(self, fh: int) -> dict[str, Any] | None:
        """fstat of an open file answers from its handle: it keeps working after the name is
        unlinked or replaced (the handle keeps the old inode, as natively).  Under ``lock``: a
        release pops the handle under it before closing its fd (an fstat of a closed fd was EBADF
        to a reader racing tmp + rename, issue 24).  None: no such handle (released)."""
        with self.lock:
            h = self.handles.get(fh)
            fd = None if h is None else (h.version.fd if h.version is not None and h.version.fd >= 0
                                         else h.fd)
            if h is not None and fd is not None and (h.version is None or h.version.state != staged.OPEN):
                v = self._in_place(h)
                fd = v.fd if v is not None else fd
            if fd is not None:
                raw = self.store.fstat(fd)
                st = self._st(raw)
                if h.path in self.hidden and raw.st_nlink > 0 and stat.S_ISREG(raw.st_mode):
                    # unlinked or replaced: its kept generation (G11) is ckptfs's name, not the
                    # user's (an fstat said nlink 1 where natively it is 0)
                    st["st_nlink"] = max(0, raw.st_nlink - self.gens.links_to(raw.st_ino))
                return st
        return None

    def fgetattr(self, fh: int) -> dict[str, Any]:
        """The attributes of the file open as handle ``fh``, whatever its name is now; ENOENT once
        the handle is released (never another path's: a node whose name went has only this)."""
        st = self._fstat_handle(fh)
        if st is None:
            raise _err(errno.ENOENT, "released")
        return st

    def getattr(self, path: str, fh: int | None = None, caller: Caller = NOBODY) -> dict[str, Any]:
        path = self.norm(path)
        if self._is_view(path):
            return self._st(self.store.lstat(self._view_real(path)))
        if fh is not None:
            st = self._fstat_handle(fh)
            if st is not None:
                return st
        if path in self.hidden or path in self.replaced:
            try:
                return self._st(self._on_hidden(path, self.store.fstat))
            except FileNotFoundError:
                gone = self.replaced.get(path)
                if gone is None:
                    raise
                return {k: v for k, v in gone.items() if k != "origin"} | {"st_nlink": 0}
        self._check_visible(path)
        sealed = self._sealed_lstat(path, caller)
        if sealed is not None:
            return self._st(sealed) | {"st_nlink": 1}
        v = None if self._sealed_view(path, caller) is not None else self._seen_by(path, caller)
        if v is not None:
            try:
                return self._st(self.store.fstat(v.fd))
            except OSError:
                pass  # installed concurrently: fall through to the backing path
        else:
            ov = self.integrity.stat_override(path)  # rollback policy: the kept generation served
            if ov is not None:
                return self._st(ov)
        g = self.groups.get(path)
        if g is not None and g.state == OPEN:
            self.grp.check_torn(g)
        elif g is not None and g.state == SEALED and g.corrupt:
            self.grp.quarantine_corrupt(g)
        return self._st(self.store.lstat(path))

    def readdir(self, path: str, caller: Caller = NOBODY) -> list[tuple[str, dict[str, int], int]]:
        """Entries of directory ``path``: (name, {st_ino, st_mode type bits}, 0).  The mount reports
        backing inode numbers (``use_ino``: hard links share one), so every entry carries its own."""
        path = self.norm(path)
        if self._is_view(path):
            real = self._view_real(path)
            pre = real + "/" if real else ""
            shown = []
            for n, ino, t in sorted(self.store.scandir(real)):
                if n == META_DIR and not real:
                    continue
                g = self.groups.get(pre + n)
                if g is None or g.state == SEALED:
                    shown.append((n, {"st_ino": self.inodes.reported(ino), "st_mode": t}, 0))
            return [*self._dots(real), *shown]
        self._check_visible(path)
        self.grp.sweep_children(path)
        entries = {n: (ino, t) for n, ino, t in self.store.scandir(path)}
        if path == "":
            entries.pop(META_DIR, None)
        pre = path + "/" if path else ""
        view = self._sealed_view(path, caller)
        if view is not None:  # RS1: the group being saved again as last sealed, for another job
            shown = SealedView.names_in(view[1], path)
            for n in [n for n in entries if n not in shown]:
                del entries[n]
            for n, is_dir in shown.items():
                if n not in entries and not is_dir:
                    try:
                        entries[n] = (self.store.lstat(view[1][pre + n][0]).st_ino, stat.S_IFREG)
                    except OSError:
                        pass
            self.stats["sealed_view_listings"] += 1
            rep = self.inodes.reported
            return [*self._dots(path),
                    *((n, {"st_ino": rep(ino), "st_mode": t}, 0) for n, (ino, t) in sorted(entries.items()))]
        with self.lock:
            new = [(p, v) for p, v in (*self.pending.items(), *self.queued.items())
                   if p.startswith(pre) and "/" not in p[len(pre):] and p[len(pre):] not in entries]
        for p, v in new:  # a new file being written: listed for whoever sees it (V1)
            if self.vis.isolated(v, caller):
                continue
            try:
                entries[p[len(pre):]] = (self.store.fstat(v.fd).st_ino, stat.S_IFREG)
            except OSError:
                pass
        if caller.pid > 0:
            for n in [n for n in entries if (g := self.groups.get(pre + n)) is not None and g.state == OPEN]:
                g = self.groups.get(pre + n)
                if (g is not None and not self.grp.sees(g, caller.pid)
                        and not (SealedView.applies(g) and self.sealed.files(g) is not None)):
                    del entries[n]  # a checkpoint still being written by another job (issue 25)
                    self.stats["open_groups_unlisted"] += 1
        rep = self.inodes.reported
        return [*self._dots(path),
                *((n, {"st_ino": rep(ino), "st_mode": t}, 0) for n, (ino, t) in sorted(entries.items()))]

    def _dots(self, path: str) -> list[tuple[str, dict[str, int], int]]:
        try:
            ino = self.store.lstat(path).st_ino
        except OSError:
            ino = 1
        try:
            pino = self.store.lstat(parent(path)).st_ino if path else ino
        except OSError:
            pino = 1
        return [(".", {"st_ino": self.inodes.reported(ino), "st_mode": stat.S_IFDIR}, 0),
                ("..", {"st_ino": self.inodes.reported(pino), "st_mode": stat.S_IFDIR}, 0)]

    def readlink(self, path: str) -> str:
        path = self.norm(path)
        if self._is_view(path):
            return self.store.readlink(self._view_real(path))
        self._check_visible(path)
        return self.store.readlink(path)

    def statfs(self) -> dict[str, int]:
        sv = self.store.statvfs()
        return {k: getattr(sv, k) for k in (
            "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
            "f_files", "f_ffree", "f_favail", "f_namemax")}

    # ---------------------------------------------------------- open/create
    def _set_new_owner(self, path: str, caller: Caller) -> None:
        """chown a just-created directory, node or symlink at ``path`` to its native owner."""
        if not self.staging.as_root:
            return
        uid, gid = self.staging.new_owner(path, caller)
        st = self.store.lstat(path)
        if (st.st_uid, st.st_gid) != (uid, gid):
            self.store.chown(path, uid, gid)
            if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISGID:
                self.store.chmod(path, stat.S_IMODE(st.st_mode))  # keep the inherited setgid bit

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY, caller: Caller = NOBODY,
               umask: int | None = None) -> int:
        """Create ``path`` and open it for writing.  ``umask``: the creator's, where the transport
        leaves it to us (FUSE_DONT_MASK; None: the kernel applied it), so a directory's default ACL
        is inherited as natively (``acl.py``)."""
        path = self.norm(path)
        if self._is_view(path):
            raise _err(errno.EROFS)
        if is_meta(path) or path == "":
            raise _err(errno.EACCES)
        self.grp.note_write(path, caller.pid)

        def check() -> None:
            if flags & os.O_EXCL and self._lexists(path):
                raise _err(errno.EEXIST)
            if not self.store.exists(parent(path)):
                raise _err(errno.ENOENT)

        app = bool(flags & os.O_APPEND)
        return self._new_fh(Handle(path=path, writable=True, appending=app, published=True,
                                   version=self._publish_new(path, mode, caller, check, app, umask)))

    def _publish_new(self, path: str, mode: int, caller: Caller, check: Callable[[], None],
                     appending: bool = False, umask: int | None = None) -> Version:
        """A new, empty version of ``path`` (create, open with O_TRUNC), made outside ``lock`` (I5:
        it is disk work) and published under it, where readers and writers of ``path`` find it.

        ``check()`` (may raise) runs before.  A namespace change that completed meanwhile (an unlink
        or rename: ``ns_seq``) may have made the check stale or the attributes copied from the
        replaced file wrong: then the version is dropped and made again, so an unlink that
        completed before this publish is never undone by it."""
        while True:
            with self.lock:
                seq = self.ns_seq
            check()
            nv = self.staging.new_version_like(path, mode, caller, umask)
            with self.lock:
                if self.ns_seq == seq:
                    old = self.pending.get(path)
                    if old is not None and old.state == staged.OPEN:
                        old.unlinked = True  # superseded: never installed
                    self.pending[path] = nv
                    nv.refs = nv.writers = 1
                    nv.writer_pids.add(caller.pid)
                    nv.appending = appending
                    return nv
            self.staging.drop_staging(nv)
            self.stats["publish_retries"] += 1

    def open(self, path: str, flags: int, caller: Caller = NOBODY) -> int:
        path = self.norm(path)
        acc = flags & os.O_ACCMODE
        writable = acc in (os.O_WRONLY, os.O_RDWR)
        if self._is_view(path):
            if writable or flags & os.O_TRUNC:
                raise _err(errno.EROFS)
            real = self._view_real(path)
            if stat.S_ISDIR(self.store.lstat(real).st_mode):
                raise _err(errno.EISDIR)
            return self._new_fh(Handle(path=real, writable=False, fd=self.store.open(real, os.O_RDONLY)))
        if path in self.hidden or path in self.replaced:
            try:
                return self._open_hidden(path, flags, caller)
            except FileNotFoundError:
                if path in self.replaced:
                    raise _err(errno.ESTALE, f"{path}: renamed over: look the name up again") from None
                raise
        self._check_visible(path)
        if not writable and not flags & os.O_TRUNC:
            fh = self._open_sealed(path, caller)  # RS1
            if fh is not None:
                return fh
        app = bool(flags & os.O_APPEND)
        if writable and flags & os.O_TRUNC:
            self.grp.note_write(path, caller.pid)
            drain = not app and self.isolate_writers and self.vis.checkpoint_file(path)
            if drain:
                self._drain_readers(path, caller)
            try:
                # (_stat_or_stale is disk work, and with --on-corrupt rollback a hash: never under lock, I5)
                nv = self._publish_new(path, 0, caller, lambda: self._stat_or_stale(path), app)
            finally:
                if drain:
                    with self.lock:
                        self.arriving[path].remove(procinfo.tgid(caller.pid) if caller.pid > 0 else 0)
                        if not self.arriving[path]:
                            del self.arriving[path]
            return self._new_fh(Handle(path=path, writable=True, appending=app, version=nv, pid=caller.pid,
                                       published=True))
        hidden_v = None if writable else self._visible(path)
        if hidden_v is not None and not self.vis.isolated(hidden_v, caller):
            hidden_v = None
        with self.lock:
            v = self._visible(path)
            if v is not None and v is hidden_v and v.state == staged.OPEN:
                v = None  # a checkpoint file another process is writing: the committed one (V1)
                self.stats["isolated_opens"] += 1
            if v is not None:
                v.refs += 1
                if writable:
                    v.writers += 1
                    v.writer_pids.add(caller.pid)
                    v.appending |= app
                return self._new_fh(Handle(path=path, writable=writable, appending=app, version=v, pid=caller.pid))
        st_mode = self._stat_or_stale(path, caller)["st_mode"]
        if stat.S_ISDIR(st_mode):
            raise _err(errno.EISDIR)
        fd, chk = self.integrity.open_committed(path, self.store.open(path, os.O_RDONLY))  # EIO if corrupt
        self.integrity.bind(fd, chk)
        # a reader of a checkpoint file another process is rewriting reads past the kernel's page
        # cache and its size, which belong to the path's inode the writer shares (V1).  Decided
        # atomically with the handle's registration: a rewrite's drain either sees this handle or
        # finds ``arriving`` set here (else a page-cache reader could slip past the drain)
        def decide(h: Handle) -> None:
            h.direct = not writable and (hidden_v is not None or path in self.arriving)

        return self._new_fh(Handle(path=path, writable=writable, appending=app, fd=fd, pid=caller.pid),
                            decide)

    def replaced_origin(self, hidden: str) -> str | None:
        """The name that hidden name ``hidden`` had before a rename replaced it (T6), if known."""
        gone = self.replaced.get(hidden)
        return None if gone is None else gone.get("origin")

    def _open_hidden(self, path: str, flags: int, caller: Caller) -> int:
        """Open of a file libfuse has just hidden (``.fuse_hidden*``): the kernel looked the name up
        before a rename replaced it or an unlink removed it, and opens that file, as natively."""
        writable = flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
        with self.lock:
            for h in self.handles.values():
                if h.path != path:
                    continue
                v = h.version
                if v is not None and v.fd >= 0:
                    v.refs += 1
                    if writable:
                        v.writers += 1
                    return self._new_fh(Handle(path=path, writable=writable, version=v, pid=caller.pid))
                if h.fd is not None:
                    fd = self.store.dup(h.fd)
                    self.integrity.bind(fd, self.integrity.checks.get(h.fd))
                    return self._new_fh(Handle(path=path, writable=writable, fd=fd, pid=caller.pid))
        raise _err(errno.ENOENT)

    def _drain_readers(self, path: str, caller: Caller) -> None:
        """Before an O_TRUNC rewrite of checkpoint file ``path`` by ``caller``: readers that open it
        from now on bypass the page cache (``arriving``); wait, at most READER_DRAIN_SECONDS, for
        other processes' readers that opened it before, through the page cache, to close (their
        cached reads would be cut at the size the kernel learns from the writer, V1)."""
        with self.lock:
            self.arriving.setdefault(path, []).append(procinfo.tgid(caller.pid) if caller.pid > 0 else 0)
        self.events.emit(events.REWRITING, path)  # isolation (V1) starts now, before any truncation
        deadline = time.monotonic() + READER_DRAIN_SECONDS
        me = procinfo.tgid(caller.pid) if caller.pid > 0 else 0
        waited = False
        while True:
            with self.lock:
                pids = {h.pid for h in self.handles.values()
                        if h.path == path and not h.writable and not h.direct and h.pid > 0}
            if me:
                pids = {p for p in pids if procinfo.tgid(p) != me}
            if not pids:
                break
            if time.monotonic() > deadline:
                self.stats["reader_drain_timeouts"] += 1
                log.warning("%s: rewritten while process(es) %s still read it through the page cache "
                            "(waited %.0f s): what they read next may mix versions", path,
                            sorted(pids), READER_DRAIN_SECONDS)
                break
            waited = True
            time.sleep(0.005)
        if waited:
            self.stats["reader_drain_waits"] += 1

    def _stat_or_stale(self, path: str, caller: Caller = NOBODY) -> dict[str, Any]:
        """getattr for open(); a missing path gives ESTALE, not ENOENT.

        The kernel sends OPEN (never CREATE, and without O_CREAT) when it still
        caches a dentry for the name, e.g. of a new file whose dying writer's
        version was just unpublished.  ESTALE makes the VFS look the name up
        again (LOOKUP_REVAL) and then CREATE it, or fail with ENOENT, as the
        application's open flags say.
        """
        try:
            return self.getattr(path, caller=caller)
        except FileNotFoundError:
            raise _err(errno.ESTALE, f"{path}: vanished") from None

    def _writable_version(self, h: Handle, caller: Caller) -> Version:
        """The open version a write through ``h`` goes to (copy-on-write).

        The clone is made outside ``lock`` (it may copy gigabytes)."""
        v = h.version
        if v is not None and v.state == staged.OPEN:
            return v
        if h.path not in self.hidden:  # a write to an unlinked file changes no group
            self.grp.note_write(h.path, caller.pid)
        with h.lock:
            v = h.version
            if v is not None and v.state == staged.OPEN:
                return v
            if v is not None:
                nv = self.staging.new_version(h.path, 0, caller, src=v, like=self.store.fstat(v.fd), xattrs_from=v.fd)
            else:
                assert h.fd is not None
                self.integrity.before_clone(h.fd)  # never launder corrupt bytes into a new commit
                nv = self.staging.new_version(h.path, 0, caller, src_fd=h.fd, like=self.store.fstat(h.fd),
                                       xattrs_from=h.fd)
            with self.lock:
                if v is not None:
                    v.refs -= 1
                    v.writers -= 1
                    old_fd = self.commit.take_fd(v)
                else:
                    self.integrity.forget(h.fd)
                    old_fd, h.fd = h.fd, None
                if h.path in self.hidden:
                    nv.unlinked = True  # written after its name was unlinked: never installed
                else:
                    cur = self.pending.get(h.path)
                    if cur is not None and cur is not v and cur.state == staged.OPEN:
                        cur.unlinked = True
                    self.pending[h.path] = nv
                nv.refs = nv.writers = 1
                nv.writer_pids.add(caller.pid)
                nv.appending = h.appending
                nv.in_place = True
                if len(self.in_place) > 256:
                    self._prune_in_place()
                self.in_place[h.path] = nv  # I7: what the path's other readers read from now on
                h.version = nv
            self.commit.close_quiet(old_fd)
            return nv

    # ------------------------------------------------------------- data I/O
    def _in_place(self, h: Handle) -> Version | None:
        """(``lock`` held) The in-place version of ``h``'s path that a read-only handle of an earlier
        version (the committed file, or a version it joined that is installed since) reads instead
        (``Version.in_place``): natively both are one inode, and on the native transport one kernel
        inode's page cache and size serve both (fsx reopening its file beside a reader read back
        older bytes, "READ BAD DATA", and its size: "Size error", SIGBUS; issue 24).

        I7: from the version's first write until every such handle follows its installed file
        (``_follow_in_place``), in every state between (open, sealed and queued, committing,
        installed with its fd still open), never the older file: a read of it in the window
        between the seal and the follow was short, and the kernel shrank the writer's i_size to it."""
        if not self.in_place or h.writable:
            return None
        v = self.in_place.get(h.path)
        if v is None or v is h.version or v.fd < 0 or v.state == staged.DISCARDED or v.path != h.path:
            return None
        return v

    def _prune_in_place(self) -> None:
        """(``lock`` held) Forget in-place versions no reader can need: discarded, or installed and
        closed with no read-only handle left at their path."""
        readers = {h.path for h in self.handles.values() if not h.writable}
        for p, v in list(self.in_place.items()):
            if v.state == staged.DISCARDED or (v.state == staged.INSTALLED and v.fd < 0 and p not in readers):
                del self.in_place[p]

    def _pin_in_place(self, h: Handle) -> Version | None:
        """``_in_place`` with a reference taken (dropped by ``_unref``): its fd stays open while
        the read uses it.  An in-place version installed and closed makes the handles follow it."""
        if not self.in_place or h.writable:
            return None
        follow = None
        with self.lock:
            v = self._in_place(h)
            if v is not None:
                v.refs += 1
                return v
            w = self.in_place.get(h.path)
            if w is not None and (w.state == staged.DISCARDED or w.path != h.path):
                del self.in_place[h.path]  # never installed: the committed file is the file again
            elif w is not None and w.fd < 0 and w.state == staged.INSTALLED:
                follow = w  # installed (async, or its fd closed): read the installed file from now on
        if follow is not None:
            self._follow_in_place(follow)
        return None

    def _read_in_place(self, h: Handle, fn: Callable[[int], Any]) -> Any:
        """``fn(fd)`` on the in-place version ``h`` reads instead of its own file, or None."""
        iv = self._pin_in_place(h)
        if iv is None:
            return None
        try:
            return fn(iv.fd)
        finally:
            self._unref(iv)

    def read(self, fh: int, size: int, offset: int) -> bytes:
        h = self._handle(fh)
        v = h.version
        if v is not None and (h.writable or v.state == staged.OPEN):
            return self.store.pread(v.fd, size, offset)
        got = self._read_in_place(h, lambda fd: self.store.pread(fd, size, offset))
        if got is not None:
            return got
        v = h.version  # again: ``_follow_in_place`` may have moved the handle just now
        if v is not None:
            return self.store.pread(v.fd, size, offset)
        assert h.fd is not None  # (the follow sets it before it clears the version)
        return self.integrity.read(h.fd, size, offset)  # verified chunks only

    def read_into(self, fh: int, buf: memoryview, offset: int) -> int:
        """``read`` straight into the caller's buffer (the FUSE reply buffer); the count."""
        h = self._handle(fh)
        v = h.version
        if v is not None and (h.writable or v.state == staged.OPEN):
            return self.store.preadinto(v.fd, buf, offset)
        got = self._read_in_place(h, lambda fd: self.store.preadinto(fd, buf, offset))
        if got is not None:
            return got
        v = h.version  # again: ``_follow_in_place`` may have moved the handle just now
        if v is not None:
            return self.store.preadinto(v.fd, buf, offset)
        assert h.fd is not None  # (the follow sets it before it clears the version)
        return self.integrity.read_into(h.fd, buf, offset)  # verified chunks only

    def write(self, fh: int, data: bytes, offset: int, caller: Caller = NOBODY) -> int:
        h = self._handle(fh)
        if not h.writable:
            raise _err(errno.EBADF)
        v0 = h.version
        if v0 is not None and v0.bypassed and v0.state != staged.OPEN:
            # a passthrough writer's write that reaches the daemon (copy_file_range) after an fsync
            # installed its version: to the file the kernel writes, as a truncate (W2)
            got: list[int] = []
            if self._change_bypassed(v0, lambda fd: got.append(self.store.pwrite(fd, data, offset))):
                self.stats["bytes_written"] += got[0]
                return got[0]
        written = 0

        def change(v: Version) -> None:
            nonlocal written
            if offset < v.base:
                v.extends = False  # committed bytes rewritten: all-or-nothing if its writer dies (V2)
            v.writer_pids.add(caller.pid)
            written = n = self.store.pwrite(v.fd, data, offset)
            v.digest.update(data, offset)
            end = offset + n
            if end // WRITEBACK_WINDOW != offset // WRITEBACK_WINDOW:
                # a window filled up: start its writeback now, so the fsync
                # at commit finds little left to write (a hint only)
                self._writeback(v.fd, (end // WRITEBACK_WINDOW - 1) * WRITEBACK_WINDOW, WRITEBACK_WINDOW)
            v.size = max(v.size, end)

        while not self.staging.change(self._writable_version(h, caller), change, "write"):
            pass  # frozen by a concurrent commit: clone and retry
        self.stats["bytes_written"] += written
        return written

    def truncate(self, path: str, length: int, fh: int | None = None, caller: Caller = NOBODY) -> None:
        path = self.norm(path)
        self._check_visible(path)
        if fh is not None and fh in self.handles and self.handles[fh].writable:
            self._truncate_handle(self.handles[fh], length, caller)
            return
        with self.lock:
            v = self.pending.get(path)
        if self.staging.change(v, self.staging.truncated(length), "truncate"):
            return
        # truncate(2) by path of a committed file: a new version, committed now
        fh2 = self.open(path, os.O_WRONLY, caller)
        try:
            self._truncate_handle(self.handles[fh2], length, caller)
            self.flush(fh2, caller)
        finally:
            self.release(fh2)

    def fallocate(self, fh: int, mode: int, offset: int, length: int, caller: Caller = NOBODY) -> None:
        """fallocate(2) through an open handle (every mode the backing filesystem has: preallocate,
        ``KEEP_SIZE``, ``PUNCH_HOLE``, ``ZERO_RANGE``, ``COLLAPSE_RANGE``, ``INSERT_RANGE``), applied to
        the handle's staged version like a write: a copy-on-write version of a committed file, the
        digest recomputed at seal.  A call the backing filesystem refuses (EOPNOTSUPP, EINVAL,
        ENOSPC) changes nothing, so, unlike a failed write, it never dooms the version."""
        h = self._handle(fh)
        if not h.writable:
            raise _err(errno.EBADF)
        v = h.version
        if v is not None and v.bypassed and v.state != staged.OPEN:
            if self._change_bypassed(v, lambda fd: self.store.fallocate(fd, mode, offset, length)):
                return
        refused: list[OSError] = []

        def change(v: Version) -> None:
            try:
                self.store.fallocate(v.fd, mode, offset, length)
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSPC, errno.EFBIG, errno.ENODEV):
                    refused.append(e)  # nothing changed: the version stays good
                    return
                raise
            if offset < v.base:
                v.extends = False  # committed bytes changed: all-or-nothing if its writer dies (V2)
            v.writer_pids.add(caller.pid)
            v.digest.stale = True  # hashed again at seal
            v.size = self.store.fstat(v.fd).st_size

        while not self.staging.change(self._writable_version(h, caller), change, "fallocate"):
            pass
        if refused:
            raise refused[0]
        self.stats["fallocates"] += 1

    def copy_range(self, fh_in: int, off_in: int, fh_out: int, off_out: int, length: int,
                   caller: Caller = NOBODY) -> int:
        """copy_file_range(2) from open handle ``fh_in`` to writable handle ``fh_out``: what
        ``read`` of the source gives, written as ``write`` to the destination (its version,
        copy-on-write), 1 MiB at a time; the count copied (short at the source's end).  At most
        the kernel's 32-bit reply."""
        length = min(length, (1 << 31) - (1 << 20))
        done = 0
        while done < length:
            data = self.read(fh_in, min(1 << 20, length - done), off_in + done)
            if not data:
                break
            n = self.write(fh_out, data, off_out + done, caller)
            done += n
            if n < len(data):
                break
        return done

    def fileattr(self, fh: int | None, cmd: int, size: int, path: str | None = None) -> bytes:
        """The answer of the backing file's own ioctl ``cmd`` (``FS_IOC_GETFLAGS`` or
        ``FS_IOC_FSGETXATTR``: read-only inode flags) for open handle ``fh`` (or directory ``path``),
        ``size`` bytes."""
        import fcntl

        if path is not None:
            path = self.norm(path)
            self._check_visible(path)
            fd = self.store.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                buf = bytearray(max(size, 4))
                fcntl.ioctl(fd, cmd, buf)
                return bytes(buf[:size])
            finally:
                self.store.close(fd)
        with self.lock:
            h = self.handles.get(fh)
            fd = None if h is None else (h.version.fd if h.version is not None and h.version.fd >= 0 else h.fd)
            if fd is None:
                raise _err(errno.EBADF)
            buf = bytearray(max(size, 4))
            fcntl.ioctl(fd, cmd, buf)
        return bytes(buf[:size])

    def _truncate_handle(self, h: Handle, length: int, caller: Caller) -> None:
        v = h.version
        if (h.writable and v is not None and v.bypassed and v.state != staged.OPEN
                and self._change_bypassed(v, lambda fd: self.store.ftruncate(fd, length))):
            return
        while not self.staging.change(self._writable_version(h, caller), self.staging.truncated(length), "truncate"):
            pass

    # ------------------------------------------------------------ committing
    def _staged_size(self, v: Version) -> int:
        """The size of ``v``'s staged bytes: the kernel's writes of a passthrough writer (W1) never
        reach ``v.size``, so its staging file says (a close of a written checkpoint file scanned the
        writer's whole fd table here, issue 27)."""
        if not v.bypassed:
            return v.size
        try:
            return self.store.fstat(v.fd).st_size
        except OSError:
            return v.size

    def _holds_open(self, pid: int, path: str) -> bool:
        """Whether the process of thread ``pid`` still holds ``path`` open (a scan of its fd table)."""
        self.stats["fd_table_scans"] += 1
        return procinfo.holds_open(pid, os.path.join(self.mountpoint, path))

    def flush(self, fh: int, caller: Caller = NOBODY) -> None:
        h = self._handle(fh)
        v = h.version
        if h.writable and v is not None and v.bypassed and v.state != staged.OPEN:
            self._after_bypass(v)
        if not h.writable or v is None or v.state != staged.OPEN or not v.dirty:
            return
        if v.doomed:
            # the errno of the failed write (ENOSPC stays ENOSPC at close), else EIO
            raise _err(v.doomed_errno or errno.EIO, f"ckptfs: {v.path} not committed: {v.doomed}")
        if caller.pid > 0 and caller.pid not in v.writer_pids and self.vis.relation(v, caller.pid) == "descendant":
            # a child closing the copy of the writer's fd it inherited (fork + exec: close-on-exec; or
            # its exit, even by a signal): natively nothing happens to the file; the writer's close decides
            self.stats["inherited_flushes"] += 1
            return
        if (h.published and self.mountpoint and caller.pid > 0 and self._staged_size(v) == 0
                and self._holds_open(caller.pid, v.path)):
            # a FLUSH is not the last close of the file description: a shell's ``echo done > COMMIT``
            # dup2s the new fd to stdout and closes the original before writing (issue 25: an empty
            # COMMIT sealed the group, its bytes came after, and the next mount quarantined it).
            # Nothing written yet and the process still holds the file: its last close commits
            self.stats["flushes_deferred"] += 1
            return
        sig, status = self.exit_state(caller.pid)
        died = f"killed by signal {sig}" if sig else ""
        if status and (self.vis.checkpoint_file(v.path) or self.grp.group_of(v.path) is not None):
            # a checkpoint file or a file of a group still open when its process exits non-zero
            # (C's exit(1), os._exit) is closed by the kernel, not by the writer: as a kill, its
            # save was interrupted (a marker begun, then exit 1: it sealed the torn group)
            died = f"exiting with status {status}"
        if died and self.vis.keeps_prefix(v, self.store.pread(v.fd, 16, 0)):
            # a log extended by a process that died: its bytes are kept, as natively (V2)
            log.warning("writer pid %d of %s %s: committing the %d bytes it had written "
                        "(it only extended the file)", caller.pid, v.path, died, v.size - v.base)
            self.stats["killed_appends_kept"] += 1
        elif died:
            v.doomed = f"writer pid {caller.pid} {died}"
            self.grp.writer_killed(v.path, v.doomed)
            self.commit.unpublish(v)
            return
        if v.unlinked:
            return
        self._check_space_after_bypass(v)
        try:
            self.commit.commit(v, wait=False)
        except OSError:
            # refused (incomplete) or failed: the path shows its committed
            # version again at once, not only after the asynchronous release
            self.commit.unpublish(v)
            raise
        if v.in_place and v.state == staged.INSTALLED:
            self._follow_in_place(v)

    def _follow_in_place(self, v: Version) -> None:
        """An in-place version is installed: read-only handles of the file it changed read the
        installed file from now on, as natively (one inode).  They read it through ``_in_place``
        while it was open; left on the previous backing file they would serve its older bytes
        and size to the kernel inode they share with the writer (fsx beside a reader: a short read
        shrank the writer's i_size, then SIGBUS on its mapping, issue 24).  The old fd stays open
        until the handle's release (a read may be using it now)."""
        def earlier(h: Handle) -> bool:
            if h.path != v.path or h.writable:
                return False
            if h.version is None:
                return h.fd is not None
            return h.version is not v and h.version.state != staged.OPEN

        with self.lock:
            hs = [(fh, h) for fh, h in self.handles.items() if earlier(h)]
        for fh, h in hs:
            try:
                fd, chk = self.integrity.open_committed(v.path, self.store.open(v.path, os.O_RDONLY))
            except OSError:
                continue
            self.integrity.bind(fd, chk)
            with self.lock:
                # a handle released meanwhile is left alone: its release closed (or is closing) its
                # fds, and one more put on it now would be closed twice, or leak (a reader's READ
                # was EBADF: the fd number closed twice had been reused by a version's file)
                if self.handles.get(fh) is not h or not earlier(h):
                    old = fd
                else:
                    # h.fd before h.version: a read takes no lock, and finds either the version
                    # (kept until release) or the new fd, never neither
                    if h.version is not None:
                        h.retired_versions.append(h.version)  # its reference is dropped at release
                        h.fd = fd
                        h.version = None
                    else:
                        h.retired.append(h.fd)
                        h.fd = fd
                    old = -1
            if old >= 0:
                self.integrity.forget(old)
                self.store.close(old)
        with self.lock:
            if self.in_place.get(v.path) is v:
                del self.in_place[v.path]  # I7: every earlier handle reads the installed file now

    def fsync(self, fh: int, caller: Caller = NOBODY) -> None:
        h = self._handle(fh)
        v = h.version
        if v is None:
            return
        if h.writable and v.bypassed and v.state != staged.OPEN:
            self._after_bypass(v, wait=True)  # written since its install: committed again, durably (W2)
        if v.doomed:  # a write failed: never committed, and every fsync says so (never success after EIO)
            raise _err(v.doomed_errno or errno.EIO, f"ckptfs: {v.path} not committed: {v.doomed}")
        if v.state == staged.OPEN and v.dirty and not v.unlinked:
            self._check_space_after_bypass(v)
        if (v.state == staged.OPEN and v.dirty and not v.unlinked) or v.state in (staged.QUEUED, staged.COMMITTING):
            # fsync of a file still open for writing installs it as a committed version, durable, like
            # a close does; a known-format file that is not complete yet (its writer fsyncs half-way)
            # is not refused here: its staged bytes are made durable, the version stays open, and the
            # close decides (one error, one log entry).  docs/design.md, "What fsync promises".
            if not self.commit.commit(v, wait=True, at_fsync=True):
                with v.lock:
                    try:
                        self.store.fdatasync(v.fd)
                    except OSError as e:
                        self.staging.poison(v, f"fsync of the staged bytes failed: {e}", e.errno)
                        raise
                self.stats["fsync_staged"] += 1
        if v.error is not None:
            self.commit.reported(v)
            raise _err(v.error.errno or errno.EIO, str(v.error))

    def fsyncdir(self, path: str = "") -> None:
        """Wait for queued commits; report (once) async commit failures under path."""
        self.commit.barrier()
        failed = self.commit.take_failures(self.norm(path))
        if failed:
            p, e = failed[0]
            raise _err(e.errno or errno.EIO, f"ckptfs: async commit of {p} failed: {e}")

    def abandon(self, fh: int, caller: Caller = NOBODY) -> None:
        """The adapter refused an open the core had accepted (the kernel's rules, fuse/passthrough.py
        P2): the application never had ``fh``.  Release it, and never commit a version that this
        open made and nobody else joined (a create or O_TRUNC that wrote nothing): the committed
        version stays, as if the open had failed before it started.  (A release would commit it:
        an O_TRUNC version is dirty.)"""
        with self.lock:
            h = self.handles.get(fh)
            v = h.version if h is not None else None
            if (h is not None and v is not None and h.published and v.state == staged.OPEN
                    and v.refs == 1 and v.writers == 1):
                v.unlinked = True  # never installed: release retires it (UNPUBLISHED event)
                self.stats["opens_abandoned"] += 1
        self.release(fh, caller)

    def release(self, fh: int, caller: Caller = NOBODY) -> None:
        with self.lock:
            h = self.handles.pop(fh, None)
            if h is not None and h.writable and h.version is not None and h.version.bypassed:
                self._w2_checks.setdefault(id(h.version), [h.version, 0])[1] += 1  # (_utime_is_not_a_write)
        if h is None:
            return
        if h.fd is not None:
            self.integrity.forget(h.fd)
            self.store.close(h.fd)
        for fd in h.retired:
            self.integrity.forget(fd)
            self.store.close(fd)
        for rv in h.retired_versions:
            self._unref(rv)
        v = h.version
        if v is None:
            return
        try:
            if h.writable and v.bypassed and v.state != staged.OPEN:
                try:
                    self._after_bypass(v)  # no write can follow this one (W2)
                except OSError as e:
                    log.error("%s: bytes written after its commit could not be committed: %s", v.path, e)
        finally:
            if h.writable and v.bypassed:
                with self.lock:
                    w = self._w2_checks.get(id(v))
                    if w is not None:
                        w[1] -= 1
                        if w[1] <= 0:
                            del self._w2_checks[id(v)]
        commit_now = drop = False
        abort = None
        with self.lock:  # the decision and the tables only: the journal and the disk after (I5)
            v.refs -= 1
            if h.writable:
                v.writers -= 1
            if v.state == staged.OPEN and v.writers == 0:
                if v.unlinked:
                    drop = self.commit.retire(v)
                elif v.doomed:
                    abort = self.commit.note_abort(v, v.doomed)
                    drop = self.commit.retire(v)
                elif v.dirty and v.path in self.last_abort:
                    drop = self.commit.retire(v)  # refused at flush; already logged
                elif v.dirty:
                    commit_now = True  # written after the last flush (e.g. mmap writeback)
            fd = self.commit.take_fd(v)
        if abort is not None:
            self.commit.log_abort(abort)
        self.commit.dispose(v if drop else None, fd)
        if commit_now:
            try:
                self.commit.commit(v, wait=False)
            except OSError as e:
                log.warning("late commit of %s at release failed: %s", v.path, e)
                self.commit.discard(v, None)
        if h.writable:
            self.grp.poke(v.path)

    # ----------------------------------------------------- namespace changes
    def mkdir(self, path: str, mode: int, caller: Caller = NOBODY, umask: int | None = None) -> None:
        """``umask``: as for :meth:`create`; the backing filesystem inherits a default ACL itself."""
        path = self.norm(path)
        if self._is_view(path):
            raise _err(errno.EROFS)
        if is_meta(path):
            raise _err(errno.EACCES)
        self.commit.barrier()
        with self.commit_lock:
            if self._lexists(path):
                raise _err(errno.EEXIST)
            mode = acl.in_place_mode(self.staging.default_acl(parent(path)), mode, umask)

            def do() -> None:
                self.store.mkdir(path, stat.S_IMODE(mode))
                self._set_new_owner(path, caller)

            self.grp.note_mkdir(path, caller.pid)
            self.commit.ns_op({"op": "mkdir", "path": path, "mode": mode}, do, [parent(path)], after=True)  # I8

    def rmdir(self, path: str) -> None:
        path = self.norm(path)
        self._check_visible(path)
        self.commit.barrier()
        with self.commit_lock:
            if self._children_pending(path):
                raise _err(errno.ENOTEMPTY)
            st = self.store.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise _err(errno.ENOTDIR)
            if self.store.listdir(path):
                raise _err(errno.ENOTEMPTY)
            plain = path not in self.groups and self.grp.group_of(path) is None  # I8
            self.commit.ns_op({"op": "rmdir", "path": path}, lambda: self.store.rmdir(path), [parent(path)],
                              after=plain)
            self.grp.forget_dir(path)
            self.grp.deletion_done(path)

    def symlink(self, target: str, path: str, caller: Caller = NOBODY) -> None:
        path = self.norm(path)
        if self._is_view(path):
            raise _err(errno.EROFS)
        if is_meta(path):
            raise _err(errno.EACCES)
        self.commit.barrier()
        with self.commit_lock:
            if self._lexists(path):
                raise _err(errno.EEXIST)
            if not target.startswith("/"):  # G6: a link naming an open group waits for its seal
                self.grp.seal_before_reference(os.path.normpath(os.path.join(parent(path), target)).lstrip("./"),
                                            f"symlink {path}", path)

            def do() -> None:
                self.store.symlink(target, path)
                self._set_new_owner(path, caller)

            self.commit.ns_op({"op": "symlink", "path": path, "target": target}, do, [parent(path)])
            with self.lock:
                self.records.pop(path, None)

    def unlink(self, path: str, caller: Caller = NOBODY) -> None:
        path = self.norm(path)
        with self.lock:
            if self.hidden.pop(path, None) is not None:
                return  # libfuse removing a hidden name at the last close: the name was already gone
        self._check_visible(path)
        self.commit.barrier()
        with self.commit_lock:
            target = self.rules.unfinished_target(os.path.basename(path))
            if target is not None:  # NeMo: removing "<ckpt>-unfinished" completes <ckpt>
                g = self.grp.live_group(os.path.join(parent(path), target))
                if g is not None and g.state == OPEN:
                    self.grp.seal_group(g, f"unfinished marker {path} removed")
            with self.lock:
                v = self.pending.pop(path, None) or self.queued.pop(path, None)
                if v is not None:
                    v.unlinked = True
            if self.store.exists(path):
                gone = self.store.lstat(path)
                if stat.S_ISDIR(gone.st_mode):
                    raise _err(errno.EISDIR)
                if gone.st_nlink == 1:
                    self.inodes.drop(gone.st_ino)
                g = self.grp.deleting_group(path)
                if g is not None:
                    self.grp.defer_delete(g, path, caller.pid)
                else:
                    self.grp.note_unlink(path)
                    plain = self.grp.group_of(path) is None and not self.gens.of(path)  # I8
                    self.commit.ns_op({"op": "unlink", "path": path, "ino": gone.st_ino},
                                      lambda: self.store.unlink(path), [parent(path)], after=plain)
            elif v is None:
                raise _err(errno.ENOENT)
            with self.lock:
                self.records.pop(path, None)
                self.last_abort.pop(path, None)
                self.gens.on_unlink(path)
                # a new version published for ``path`` while the name was being removed (a truncating
                # open racing this unlink) names a file that is gone: never installed (as natively:
                # it writes the unlinked inode)
                late = self.pending.pop(path, None) or self.queued.pop(path, None)
                if late is not None:
                    late.unlinked = True
                self.ns_seq += 1
            self.gens.collect()

    def mknod(self, path: str, mode: int, dev: int = 0, caller: Caller = NOBODY, umask: int | None = None) -> None:
        """A fifo, socket or device node (as the backing filesystem allows); a regular file made by
        mknod(2) is an empty committed file."""
        path = self.norm(path)
        if self._is_view(path):
            raise _err(errno.EROFS)
        if is_meta(path) or path == "":
            raise _err(errno.EACCES)
        if stat.S_ISREG(mode) or stat.S_IFMT(mode) == 0:
            fh = self.create(path, stat.S_IMODE(mode), os.O_WRONLY | os.O_CREAT | os.O_EXCL, caller, umask)
            try:
                h = self.handles[fh]
                if h.version is not None:
                    h.version.dirty = True
                self.flush(fh, caller)
            finally:
                self.release(fh, caller)
            return
        if stat.S_IFMT(mode) not in (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK):
            raise _err(errno.EINVAL)
        self.commit.barrier()
        with self.commit_lock:
            if self._lexists(path):
                raise _err(errno.EEXIST)
            mode = acl.in_place_mode(self.staging.default_acl(parent(path)), mode, umask)

            def do() -> None:
                self.store.mknod(path, mode, dev)
                self._set_new_owner(path, caller)

            self.commit.ns_op({"op": "mknod", "path": path, "mode": mode, "dev": dev}, do, [parent(path)])
            with self.lock:
                self.records.pop(path, None)

    def link(self, old: str, new: str, caller: Caller = NOBODY) -> None:
        """A hard link: a new name for a committed file (the same inode, so ``st_nlink`` counts both).

        A later write through either name makes a new version of that name only (ckptfs commits
        by staging and renaming, as a tool writing tmp + rename does), so the other name keeps the
        bytes it had: the link is broken by the write.  docs/design.md, "Hard links"."""
        old, new = self.norm(old), self.norm(new)
        self._check_visible(old)
        if self._is_view(new):
            raise _err(errno.EROFS)
        if is_meta(new) or new == "":
            raise _err(errno.EACCES)
        self.commit.barrier()
        with self.commit_lock:
            if self._lexists(new):
                raise _err(errno.EEXIST)
            if not self.store.exists(old):
                # a file created and still open for writing: natively linkable; here its first
                # version is not installed yet, so there is no inode to name
                raise _err(errno.ENOENT if self._visible(old) is None else errno.EBUSY)
            if stat.S_ISDIR(self.store.lstat(old).st_mode):
                raise _err(errno.EPERM)
            self.grp.note_link(new, caller.pid)
            self.commit.ns_op({"op": "link", "src": old, "dst": new}, lambda: self.store.link(old, new),
                        [parent(new)])
            with self.lock:
                if old in self.records:
                    self.records[new] = self.records[old]
                else:
                    self.records.pop(new, None)
            self.grp.after_install(new)

    def _on_hidden(self, path: str, fn):  # type: ignore[no-untyped-def]
        """``fn(fd)`` on a backing fd of the open, unlinked file libfuse calls ``path``
        (.fuse_hidden...), under ``lock`` so no release closes that fd meanwhile (fstat, fchmod and
        fchown are quick inode operations)."""
        with self.lock:
            for h in self.handles.values():
                if h.path == path:
                    if h.version is not None and h.version.fd >= 0:
                        return fn(h.version.fd)
                    if h.fd is not None:
                        return fn(h.fd)
        raise _err(errno.ENOENT)

    def hide(self, old: str, hidden: str, caller: Caller, before: str) -> None:
        """The native transport's hide (fuse/ops.py): it knows whether an ``unlink`` or a
        ``rename`` over ``old`` follows, so nothing is guessed from the caller's system call."""
        self._check_visible(old)
        self._hide(old, hidden, caller, before)

    def _hide(self, old: str, hidden: str, caller: Caller, kind: str | None = None) -> None:
        """libfuse renames an open file to a hidden name instead of removing it (``hard_remove``
        off), so its handles keep a path: fstat, fchmod and reads of an open-then-unlinked or
        open-then-replaced file work until the last close, as natively.  Nothing named
        ``.fuse_hidden*`` is ever made in the backing directory: the handles keep the old inode
        (their fds), the mount lists nothing, and the final unlink of the hidden name is a no-op.

        Before an unlink, the unlink happens now (journaled as usual).  Before a rename over ``old``
        (a reader holds ``latest`` while the trainer replaces it) nothing happens here: the rename
        that follows replaces ``old`` atomically.  Which one is read from the caller's blocked
        system call (procinfo.blocked_in) on libfuse, and given (``kind``) by the native transport;
        unknown counts as an unlink (then a rename over an open file is an unlink followed by the
        rename, not atomic for a crash in between)."""
        if kind is None:
            kind = procinfo.blocked_in(caller.pid)
        self.stats[f"hidden_before_{kind or 'unknown'}"] += 1
        if kind != "rename":
            self.unlink(old, caller)  # also drops a version being written at ``old`` (never installed)
        else:
            try:
                gone = self.getattr(old, caller=caller)
            except OSError:
                gone = None
            if gone is not None:
                with self.lock:
                    self.replaced[hidden] = dict(gone, origin=old)
                    while len(self.replaced) > REPLACED_KEPT:
                        self.replaced.popitem(last=False)
        with self.lock:
            self.hidden[hidden] = old
            for h in self.handles.values():
                if h.path == old:
                    h.path = hidden
            # before a rename, a version being written at ``old`` is left alone: the rename replaces
            # it (rename() unlists it), and if the rename fails it is still the path's next version

    def unhide(self, hidden: str, old: str) -> None:
        """Undo :meth:`hide` before a rename that then failed: the file is still at ``old`` (a
        hide before a rename changes nothing on disk), and so are its handles again."""
        with self.lock:
            if self.hidden.get(hidden) != old:
                return
            del self.hidden[hidden]
            self.replaced.pop(hidden, None)
            for h in self.handles.values():
                if h.path == hidden:
                    h.path = old

    def rename(self, old: str, new: str, flags: int = 0, caller: Caller = NOBODY) -> None:
        old, new = self.norm(old), self.norm(new)
        if is_hidden_name(new) and parent(new) == parent(old) and not flags:
            self._check_visible(old)
            self._hide(old, new, caller)
            return
        self._check_visible(old)
        if self._is_view(new):
            raise _err(errno.EROFS)
        if is_meta(new) or new == "":
            raise _err(errno.EACCES)
        if flags & RENAME_EXCHANGE and not flags & ~RENAME_EXCHANGE:
            return self._exchange(old, new, caller)
        if flags & ~1:  # RENAME_NOREPLACE; RENAME_WHITEOUT is overlayfs's own (docs/design.md)
            raise _err(errno.EINVAL)
        if new == old:
            return
        if new.startswith(old + "/"):
            raise _err(errno.EINVAL)
        self.commit.barrier()
        with self.commit_lock:
            if flags & 1 and self._lexists(new):
                raise _err(errno.EEXIST)
            on_disk = self.store.exists(old)
            if not on_disk and not self._lexists(old) and not self._children_pending(old):
                raise _err(errno.ENOENT)
            if self._children_pending(new):
                raise _err(errno.ENOTEMPTY)
            if on_disk and self.grp.is_pointer(new) and old in self.records and self.records[old].size <= 4096:
                fd = self.store.open(old, os.O_RDONLY)
                try:
                    self.grp.seal_named_by_pointer(new, self.store.pread(fd, 4096, 0))
                finally:
                    self.store.close(fd)
            src_st = self.store.lstat(old) if on_disk else None
            is_dir = src_st is not None and stat.S_ISDIR(src_st.st_mode)
            keep = None
            if on_disk and not is_dir and new in self.records and old in self.records:
                # a committed file replaced by a rename (safetensors' and DCP's tmp + rename): its
                # version is kept as a generation, as an overwrite's is (rollback, G11)
                keep = self._keep_plan(new, self.records[new])
            if on_disk:
                dirs = [parent(new), parent(old)]
                temp = not is_dir and keep is None and self._temp_rename(old, new)  # (one directory)
                # (judged before note_rename, which may reopen a sealed group for a re-save)
                fresh = temp and self._in_unsealed_group(old)
                self.grp.note_rename(old, new, caller.pid, is_dir)
                entry: dict[str, Any] = {"op": "rename", "src": old, "dst": new, "ino": src_st.st_ino}
                if keep is not None:
                    entry["keep"] = keep

                def do() -> None:
                    if keep is not None:
                        self.gens.link(new, keep)
                    try:
                        self.store.rename(old, new)
                    except OSError:
                        if keep is not None:
                            self.gens.unlink_quiet(keep)
                        raise

                plain = (temp and (fresh or self.grp.group_of(old) is None)  # I8 + R2
                         and not self.gens.of(old) and not self.gens.of(new))
                self.commit.ns_op(entry, do, dirs, after=plain)
                if is_dir:  # (a file is never a group nor holds one)
                    self.grp.renamed(old, new)
            with self.lock:
                if on_disk and is_dir:
                    pre = new + "/"
                    for k in [k for k in self.records if k == new or k.startswith(pre)]:
                        del self.records[k]
                    move_prefix(self.records, old, new)
                elif on_disk:  # a file: its own key only (the scans above cost O(records) per rename)
                    self.records.pop(new, None)
                    if old in self.records:
                        self.records[new] = self.records.pop(old)
                if on_disk:
                    self.gens.on_rename(old, new, keep, is_dir)
                displaced = self.pending.get(new)
                if displaced is not None and displaced.state == staged.OPEN:
                    displaced.unlinked = True
                    self.commit.unlist(displaced)  # the renamed file is what the path shows now
                for table in (self.pending, self.queued):
                    moved = [p for p in table if p == old or p.startswith(old + "/")]
                    for p in moved:
                        v = table.pop(p)
                        v.path = new + p[len(old):]
                        table[v.path] = v
                for h in self.handles.values():
                    if h.path == old or h.path.startswith(old + "/"):
                        h.path = new + h.path[len(old):]
                for hp in [hp for hp in self.hidden if hp.startswith(old + "/")]:
                    self.hidden[new + hp[len(old):]] = self.hidden.pop(hp)
                self.ns_seq += 1
            self.gens.collect()
            if on_disk:
                self.events.emit(events.RENAMED, old, dst=new)
                self.grp.after_rename(old, new, is_dir, caller.pid)

    def _exchange(self, a: str, b: str, caller: Caller) -> None:
        """``renameat2(a, b, RENAME_EXCHANGE)``: the two names swap their files (or trees) in one
        atomic step, journaled as ``exchange`` (recovery redoes it only while ``a`` still holds the
        inode it held before).  Records, kept generations, groups, open versions and handles swap
        with them.  A name that exists only as a version being written (never installed) is EBUSY:
        there is nothing on disk to swap yet."""
        if a == b:
            self._check_visible(a)
            if not self._lexists(a):
                raise _err(errno.ENOENT)
            return
        if a.startswith(b + "/") or b.startswith(a + "/"):
            raise _err(errno.EINVAL)
        self.commit.barrier()
        with self.commit_lock:
            for p in (a, b):
                if not self.store.exists(p):
                    raise _err(errno.EBUSY if self._lexists(p) else errno.ENOENT)
            sa = self.store.lstat(a)
            entry = {"op": "exchange", "src": a, "dst": b, "ino": sa.st_ino}
            self.commit.ns_op(entry, lambda: self.store.exchange(a, b), [parent(a), parent(b)])
            self.grp.exchanged(a, b)
            with self.lock:
                swap_prefix(self.records, a, b)
                self.gens.on_exchange(a, b)
                for table in (self.pending, self.queued):
                    swap_prefix(table, a, b)
                    for p, v in table.items():
                        v.path = p
                for h in self.handles.values():
                    for x, y in ((a, b), (b, a)):
                        if h.path == x or h.path.startswith(x + "/"):
                            h.path = y + h.path[len(x):]
                            break
                swap_prefix(self.hidden, a, b)
                self.ns_seq += 1
            self.events.emit(events.RENAMED, a, dst=b)
            self.events.emit(events.RENAMED, b, dst=a)

    # ------------------------------------------------------------ attributes
    def _attr_target(self, path: str) -> str:
        v = self._visible(path)
        return v.staging if v is not None else path

    def _on_attr_target(self, path: str, fn: Callable[[str], Any]) -> Any:
        """``fn(target)`` on the file holding ``path``'s attributes: its staged version's file while
        one is open or queued, else the path.  A queued version the committer installs meanwhile
        is renamed from its staging name to the path (async commit: ``cp -p``'s utime after its
        close raced the install, ENOENT in 9 of 300 copies): then asked again at the path."""
        for _ in range(8):
            target = self._attr_target(path)
            try:
                return fn(target)
            except FileNotFoundError:
                if target == path:
                    raise
            # the staging name is gone: renamed to the path (one atomic rename), whose file is now
            # this version (or a newer one, which the change then reaches, as natively)
            self.stats["attr_target_moved"] += 1
            try:
                return fn(path)
            except FileNotFoundError:
                continue  # (an unlink meanwhile: ask again)
        return fn(self._attr_target(path))

    def chmod(self, path: str, mode: int) -> None:
        path = self.norm(path)
        if path in self.hidden:
            self._on_hidden(path, lambda fd: self.store.fchmod(fd, stat.S_IMODE(mode)))
            return
        self._check_visible(path)
        self._on_attr_target(path, lambda t: self.store.chmod(t, stat.S_IMODE(mode)))

    def chown(self, path: str, uid: int, gid: int) -> None:
        path = self.norm(path)
        if path in self.hidden:
            self._on_hidden(path, lambda fd: self.store.fchown(fd, uid, gid))
            return
        self._check_visible(path)
        self._on_attr_target(path, lambda t: self.store.chown(t, uid, gid))

    def utimens(self, path: str, ns: tuple[int | None, int | None] | None) -> None:
        """Set (atime, mtime) in ns; a None member is left unchanged."""
        path = self.norm(path)
        self._check_visible(path)

        def do(target: str) -> None:
            got = ns
            if got is not None and (got[0] is None or got[1] is None):
                st = self.store.lstat(target)
                got = (st.st_atime_ns if got[0] is None else got[0], st.st_mtime_ns if got[1] is None else got[1])
            self.store.utime(target, got)  # type: ignore[arg-type]

        with self._w2_lock:  # W2 compares under it: never between the utime and its key's update
            self._on_attr_target(path, do)
            self._utime_is_not_a_write(path)

    def _utime_is_not_a_write(self, path: str) -> None:
        """A utime of a file whose passthrough writer's handle is still open (``cp -p``,
        ``shutil.copy2``: the times are set after close, before the asynchronous release) changed
        the mtime W2 compares at that release to find writes after the seal: 190 of 200 copies
        were committed a second time (a full copy of their bytes), and their mtime lost.  The
        times set here are the caller's, not a write: the sealed key follows them (a size change
        still shows a write)."""
        with self.lock:
            vs = {id(h.version): h.version for h in self.handles.values() if h.path == path and h.version is not None}
            qv = self._visible(path)  # a queued version whose release waits for its install (async)
            if qv is not None:
                vs[id(qv)] = qv
            for w, _ in self._w2_checks.values():  # released, its W2 check still to come
                if w.path == path:
                    vs[id(w)] = w
            for v in vs.values():
                if not v.sealed_key or v.fd < 0:
                    continue
                try:
                    st = self.store.fstat(v.fd)
                except OSError:
                    continue
                if st.st_size == v.sealed_key[0]:
                    v.sealed_key = (st.st_size, st.st_mtime_ns)

    # ---------------------------------------------------------------- xattrs
    def _status_attrs(self, path: str) -> dict[str, str]:
        if path == "":
            out = {
                X_VERSION: __version__,
                X_PID: str(os.getpid()),
                X_COMMIT_MODE: self.commit_mode,
                X_BACKING: self.backing_label,
                X_STATS: json.dumps(dict(self.stats, commit_queue_depth=len(self.queued),
                                         open_handles=len(self.handles), **self._pool_stats()), sort_keys=True),
                X_ABORTS: json.dumps(list(self.aborts)[-10:]),
                X_RULES: json.dumps({"source": self.rules.source, "keep_last": self.rules.keep_last,
                                     "keep_every": self.rules.keep_every,
                                     "idle_seal_seconds": self.rules.idle_seconds}),
                X_GROUPS: self.grp.groups_json_attr(path),
                X_QUARANTINE: self.grp.quarantine_json_attr(path),
                X_GC_REPORT: self.grp.gc_report_json(),
                X_SPACE: json.dumps(space_held(self.store), sort_keys=True),
                **self.integrity.root_attrs(),
            }
            for source in self.attr_sources:
                out.update(source(path))
            return out
        out: dict[str, str] = {}
        g = self.groups.get(path)
        if g is not None and g.state in (OPEN, SEALED) and not g.tentative:
            out[X_STATUS] = CORRUPT if g.corrupt else g.state
            out[X_GROUP] = json.dumps(self.grp.group_summary(g), sort_keys=True)
            if g.state == SEALED:
                try:
                    manifest = read_seal(self.store, g.id)[0]
                    out[X_LINEAGE] = json.dumps(manifest.get("lineage"))
                    names = json.dumps(sorted(manifest["files"]))
                    if len(names) < VALUE_MAX:  # else: `ckptfs show` on the unmounted directory
                        out[X_MANIFEST_FILES] = names
                except (SealError, OSError) as e:
                    out[X_ERROR] = f"seal unreadable: {e}"
            for source in self.attr_sources:
                out.update(source(path))
            return out
        if self._visible(path) is None and stat.S_ISDIR(self.store.lstat(path).st_mode):
            out[X_GROUPS] = self.grp.groups_json_attr(path)
            out[X_QUARANTINE] = self.grp.quarantine_json_attr(path)
            if (self.rules.dir_rule(os.path.basename(path)) is not None and self.grp.group_of(path) is None
                    and not self.grp.groupable(path)):
                # named like a checkpoint, never a group, holding files written past ckptfs (while unmounted)
                out[X_STATUS] = xattrs.UNTRACKED
            return out
        v = self._visible(path)
        rec = self.records.get(path)
        if v is not None:
            out[X_STATUS] = xattrs.STAGING
        elif rec is not None:
            out[X_STATUS] = xattrs.COMMITTED
        elif stat.S_ISREG(self.store.lstat(path).st_mode):
            out[X_STATUS] = xattrs.UNTRACKED
        if v is None and rec is not None:
            out.update({
                X_BLAKE3: rec.blake3,
                X_SIZE: str(rec.size),
                X_GENERATION: str(rec.generation),
                X_COMMITTED_AT: rec.committed_iso(),
            })
        if path in self.last_abort:
            out[X_LAST_ABORT] = self.last_abort[path]
        if v is None:
            out.update(self.integrity.file_attrs(path))  # status=corrupt, error, verified, rollback
        return out

    def _visible_attrs(self, path: str, caller: Caller) -> dict[str, str]:
        """Status attributes of ``path`` as ``caller`` may see them (xattrs.for_caller).  The kernel
        (default_permissions) has already checked the caller may read ``path`` itself."""
        attrs = self._status_attrs(path)
        if X_GC_REPORT in attrs and caller.pid:
            attrs[X_GC_REPORT] = self.grp.gc_report_json(caller.pid)  # its own gc's, if it ran one
        privileged = caller.uid == 0 or caller is NOBODY
        if path == "" and not privileged:
            try:
                privileged = self.store.lstat("").st_uid == caller.uid
            except OSError:
                pass
        return xattrs.for_caller(attrs, path, privileged, lambda d: self._may_read_dir(d, caller))

    def _may_read_dir(self, d: str, caller: Caller) -> bool:
        """Whether ``caller`` may list directory ``d`` and search every directory above it."""
        groups = procinfo.groups(caller.pid) | {caller.gid}
        parts = d.split("/") if d else []
        for i in range(len(parts) + 1):
            p = "/".join(parts[:i])
            try:
                st = self.store.lstat(p)
            except OSError:
                return False
            want = 0o5 if i == len(parts) else 0o1  # r-x on d itself, x on the ones above
            if st.st_uid == caller.uid:
                bits = (st.st_mode >> 6) & 7
            elif st.st_gid in groups:
                bits = (st.st_mode >> 3) & 7
            else:
                bits = st.st_mode & 7
            if bits & want != want:
                return False
        return True

    def getxattr(self, path: str, name: str, caller: Caller = NOBODY) -> bytes:
        if name == "security.capability":
            raise _err(ENODATA)
        path = self.norm(path)
        if self._is_view(path):
            path = self._view_real(path)
        self._check_visible(path)
        if name.startswith(PREFIX):
            attrs = self._visible_attrs(path, caller)
            if name == X_ATTRS:
                return xattrs.as_json(attrs)
            if name not in attrs:
                raise _err(ENODATA)
            return attrs[name].encode()
        return self._on_attr_target(path, lambda t: self.store.getxattr(t, name))

    def listxattr(self, path: str) -> list[str]:
        """The stored attributes only.  ``user.ckptfs.*`` status attributes are virtual: readable by
        name (``getfattr -n user.ckptfs.status``, ``ckptfs show``) but never listed, so ``cp -a``,
        ``rsync -aX`` and ``tar --xattrs`` neither copy them nor try to remove them (as CephFS does
        with its ``ceph.*`` attributes)."""
        path = self.norm(path)
        if self._is_view(path):
            path = self._view_real(path)
        self._check_visible(path)
        try:
            return [n for n in self._on_attr_target(path, self.store.listxattr) if not n.startswith(PREFIX)]
        except OSError as e:
            if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                return []
            raise

    def setxattr(self, path: str, name: str, value: bytes, flags: int, caller: Caller = NOBODY) -> None:
        path = self.norm(path)
        self._check_visible(path)
        if name == X_SEAL:
            self.grp.seal(path, caller.pid)
            return
        if name == X_GC and path == "":
            if caller is not NOBODY and caller.uid != 0 and self.store.lstat("").st_uid != caller.uid:
                raise _err(errno.EPERM, "ckptfs: gc deletes quarantined groups anywhere in the mount: "
                                        "root or the mount's owner only")
            words = set(value.strip().split(b","))
            if not words <= {b"1", b"dry-run", b"generations"}:
                raise _err(errno.EINVAL, "ckptfs: user.ckptfs.gc takes 1, dry-run, generations or "
                                         "generations,dry-run")
            self.gc(dry_run=b"dry-run" in words, pid=caller.pid, generations=b"generations" in words)
            return
        if name == X_CONTROL:
            self.integrity.control(path, value)  # verify / scrub on demand (integrity/reads.py)
            return
        if name.startswith(PREFIX):
            raise _err(errno.EPERM, f"ckptfs: {name} is a read-only status attribute")
        self._on_attr_target(path, lambda t: self.store.setxattr(t, name, value, flags))

    def removexattr(self, path: str, name: str) -> None:
        path = self.norm(path)
        self._check_visible(path)
        if name.startswith(PREFIX):
            raise _err(ENODATA)  # virtual: never stored, so nothing to remove
        self._on_attr_target(path, lambda t: self.store.removexattr(t, name))



