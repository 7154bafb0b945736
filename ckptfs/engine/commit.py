"""The commit path: seal a staged version, install it durably, namespace operations, the async
committer.  Owns ``commit_lock``, the journal and the kept generations' writes.

Install protocol (docs/design.md, "Commit protocol"), one version at a time under ``commit_lock``:

1. record on the staged inode      ``user.ckptfs.rec`` (records.XATTR): the record travels with the file
2. ``fsync(staged)``               the new bytes, and that record, are durable before any name points at them
3. journal intent + ``fdatasync``  only where recovery needs it before the rename: a kept previous
                                   generation (its link is made first), or a record that could not
                                   travel (too large for one xattr, or no user xattrs on the backing fs);
                                   else ``Journal.settle``: entries appended unsynced before (a group
                                   opened) are made durable, as that intent's fdatasync made them
4. ``rename(staged, path)``        atomic replace: readers see old or new, never a mix
5. ``fsync(parent dir)``           the new name is durable; the install is complete
6. journal record, not synced      (where 3 did not run) the install as done; if a power loss drops it,
                                   recovery reads the record back from the file (R1)

So a new file costs two syncs, as an application's own tmp + fsync + rename + dir fsync does.

Async mode (:class:`Committer`): the flush seals (format check, digest) and queues; the committer
installs in close order.  C4: a digest that needs the whole file read back (writer passthrough)
is made on the committer's thread before the install, outside ``commit_lock``
(:meth:`CommitEngine.finish_seal`): the close returns after the format check.

Async group commit (:meth:`CommitEngine.install_batch`, C5): versions queued behind each other
are installed together, in close order, at a fraction of a sync each:

1. each record on its staged inode, then every staged file fsynced (concurrently: the device,
   and a journaling file system, serve them together), then ``staging/``: recovery finds each
   staged file by its name
2. one journal intent naming them all (``install_batch``) + ``fdatasync``: from here recovery
   finishes every rename of the batch (roll forward), so a power loss leaves a prefix of the
   closes installed, never a later file without an earlier one
3. the renames, in close order
4. ``fsync`` of each directory they landed in, and of ``staging/``: the names are durable, and no
   staging name a later unlink could see resurrected by recovery's roll forward survives

So n files in k directories cost n data syncs (concurrent), two of ``staging/``, one of the
journal and k of directories: n + 3 + k, fewer than the 2n in sequence of one install at a time
once n > k + 3 (a smaller batch trades syncs for their concurrency).  A version that journals an intent of its own
(a kept generation, a record too large to travel), a pointer (G6), an unlinked one, and a second
version of a path already in the batch end the batch; they install alone, in order.

Each step is its own method (:meth:`CommitEngine.sync_data` ... :meth:`CommitEngine.sync_name`), so
the model checker's known-bad variants (ckptfs_testing/mc_workloads.py) override one step instead of
copying the sequence.

Invariants: I1 (old or new after any crash) and I2 (prefix order: one journal intent in flight,
``commit_lock``); I5 (lock order ``commit_lock`` before ``lock``; the journal and the disk are never
touched while holding ``lock`` alone); E3 (an install or unpublish emits its event).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ckptfs import crashpoints, events, formats
from ckptfs.backing import BackingStore
from ckptfs.engine.staged import COMMITTING, DISCARDED, INSTALLED, OPEN, QUEUED, Version
from ckptfs.hashing import digest_fd
from ckptfs.inodes import InodeMap
from ckptfs.latency import CommitTimes, SlowLog
from ckptfs.layout import parent
from ckptfs.log.journal import Journal
from ckptfs.records import XATTR, FileRecord, to_xattr

if TYPE_CHECKING:
    from ckptfs.engine.generations import Generations
    from ckptfs.engine.groups import GroupEngine

log = logging.getLogger("ckptfs")

#: a record with more chunk digests than this is journaled before the rename instead of carried
#: (64 hex characters per MiB: 32 MiB -> ~2.3 KB, inside one ext4 xattr block beside others)
CARRY_MAX_CHUNKS = 32
WRITEBACK_AHEAD = 1 << 20  # a bypassed version with more unhinted bytes starts their writeback before it is hashed
#: versions per async group commit (C5); CKPTFS_BATCH_MAX=1: one install at a time, as before C5
#: (the bench's comparison)
def _batch_max() -> int:
    try:
        return max(1, int(os.environ.get("CKPTFS_BATCH_MAX", "64")))
    except ValueError:
        log.warning("CKPTFS_BATCH_MAX=%r is no number: 64", os.environ.get("CKPTFS_BATCH_MAX"))
        return 64


BATCH_MAX = _batch_max()
SYNC_THREADS = 16  # concurrent data fsyncs of one batch
_NO_CARRY = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.E2BIG, errno.ERANGE, errno.ENOSPC, errno.EPERM)


def abort_kind(reason: str, err: int | None = None) -> str:
    """The class of an abort's reason, for counting (``aborts_<kind>`` stats, the metrics' label):
    writer_killed, incomplete, no_space, io_error or other."""
    r = reason.lower()
    if "killed by signal" in r:
        return "writer_killed"
    if "incomplete" in r or "refus" in r:
        return "incomplete"
    if err in (errno.ENOSPC, errno.EDQUOT) or "no space" in r or "filled up" in r:
        return "no_space"
    if err is not None or "error" in r or "failed" in r:
        return "io_error"
    return "other"


def _err(code: int, msg: str = "") -> OSError:
    return OSError(code, msg or os.strerror(code))


def _travels(rec: FileRecord) -> bool:
    """Whether ``rec`` fits on its file (at most CARRY_MAX_CHUNKS chunk digests, 64 hex each)."""
    return len(rec.chunks) <= 64 * CARRY_MAX_CHUNKS


def _own(e: OSError) -> OSError:
    """A copy of ``e`` for one version: a reported failure is matched by identity
    (:meth:`CommitEngine.reported`), so versions failed by one error must not share it."""
    return OSError(e.errno or errno.EIO, e.strerror or str(e))


class CommitEngine:
    """Seal / install / discard of staged versions and journaled namespace operations.

    Shares with the facade the tables it names in its constructor (``records``, ``pending``,
    ``queued``, ``aborts``, ``last_abort``, ``stats``) and ``lock`` (tables only).  ``groups`` is
    attached once the group engine exists (the two call each other: a pointer install seals the
    group it names; a seal waits for the commits before it)."""

    def __init__(self, *, store: BackingStore, journal: Journal, records: dict[str, FileRecord],
                 pending: dict[str, Version], queued: dict[str, Version], aborts: collections.deque[dict],
                 last_abort: dict[str, str], stats: collections.Counter[str], lock: threading.RLock,
                 gens: Generations, inodes: InodeMap, events_hub: events.Events,
                 keep_plan: Callable[[str, FileRecord | None], dict | None], check_formats: bool = True,
                 commit_mode: str = "sync", max_backlog: int = 64, max_backlog_bytes: int = 16 << 30) -> None:
        if commit_mode not in ("sync", "async"):
            raise ValueError("commit_mode must be 'sync' or 'async'")
        self.store = store
        self.journal = journal
        self.records = records
        self.pending = pending
        self.queued = queued
        self.aborts = aborts
        self.last_abort = last_abort
        self.stats = stats
        self.lock = lock
        self.commit_lock = threading.RLock()
        self.gens = gens
        self.inodes = inodes
        self.events = events_hub
        self.keep_plan = keep_plan  # journal fragment keeping the previous generation (integrity decides)
        self.check_formats = check_formats
        self.async_failures: list[tuple[str, OSError]] = []  # reported by the next fsync / fsyncdir
        self.groups: GroupEngine | None = None
        self._syncers: ThreadPoolExecutor | None = None  # the batch's fsync threads (C5), made at the first
        self.committer = Committer(self, max_backlog, max_backlog_bytes) if commit_mode == "async" else None
        if self.committer is not None and os.environ.get("CKPTFS_HOLD_COMMITS") == "1":
            self.committer.held = True  # tests: the closes before a sync point form one group commit (C5)
        # records travel on the staged inode (False once the backing fs refused user xattrs;
        # CKPTFS_CARRY_RECORDS=0: never, for tests of the journaled path, crashpoints.POINT_ENV)
        self.carry = os.environ.get("CKPTFS_CARRY_RECORDS", "1") != "0"
        self.times = CommitTimes()  # seal + install durations, the slow-persist alert (latency.py)
        self.slow_log = SlowLog()  # what the log says of them (latency.py)

    # ------------------------------------------------------------ tables
    def unlist(self, v: Version) -> bool:
        """(``lock`` held) Remove v from the tables readers look in; whether it was there."""
        listed = False
        for table in (self.pending, self.queued):
            if table.get(v.path) is v:
                del table[v.path]
                listed = True
        return listed

    def unpublish(self, v: Version) -> None:
        """v will never be installed: readers of its path see the committed version again at once."""
        with self.lock:
            if self.unlist(v):
                self.events.emit(events.UNPUBLISHED, v.path, reason=v.doomed or "")

    def take_fd(self, v: Version) -> int | None:
        """(``lock`` held) v's fd, to close outside the lock, once no handle uses v and it is
        finished; marks v closed."""
        if v.refs <= 0 and v.state in (INSTALLED, DISCARDED) and v.fd >= 0:
            fd, v.fd = v.fd, -1
            return fd
        return None

    def retire(self, v: Version) -> bool:
        """(``lock`` held) v will never be installed: unlist it and mark it discarded.  Whether its
        staging file is still to be removed (by :meth:`dispose`, outside the lock)."""
        if self.unlist(v):
            self.events.emit(events.UNPUBLISHED, v.path, reason=v.doomed or "discarded")
        if v.state in (INSTALLED, DISCARDED):
            return False
        v.state = DISCARDED
        v.done.set()
        self.inodes.drop(v.ino)
        return True

    def dispose(self, staged: Version | None, fd: int | None) -> None:
        """Disk half of retiring a version: remove ``staged``'s staging file, close ``fd``."""
        if staged is not None:
            try:
                self.store.unlink(staged.staging)
            except OSError:
                pass
        self.close_quiet(fd)

    def close_quiet(self, fd: int | None) -> None:
        if fd is not None:
            try:
                self.store.close(fd)
            except OSError:
                pass

    def discard(self, v: Version, reason: str | None) -> None:
        """Drop a version that will never be installed: unlisted, its staging file removed.  Takes
        ``lock`` for the tables only; the journal and the disk are touched outside it (I5)."""
        if reason:
            self.abort(v, reason)
        with self.lock:
            drop = self.retire(v)
            fd = self.take_fd(v)
        self.dispose(v if drop else None, fd)

    def abort(self, v: Version, reason: str) -> None:
        """Record (tables, under ``lock``) and log (journal, unsynced, outside it) that v is not
        committed, and why."""
        with self.lock:
            entry = self.note_abort(v, reason)
        self.log_abort(entry)

    def note_abort(self, v: Version, reason: str) -> dict:
        """(``lock`` held) The tables say v is not committed; the entry for :meth:`log_abort`."""
        entry = {"op": "abort", "path": v.path, "reason": reason, "time": time.time()}
        self.aborts.append(entry)
        self.last_abort[v.path] = reason
        self.stats["aborts"] += 1
        self.stats["aborts_" + abort_kind(reason, v.doomed_errno)] += 1
        return entry

    def log_abort(self, entry: dict) -> None:
        log.warning("not committing %s: %s", entry["path"], entry["reason"])
        try:
            self.journal.append(entry, sync=False)
        except OSError as e:
            log.warning("could not log abort: %s", e)

    # ------------------------------------------------------------ sealing
    def seal(self, v: Version, at_fsync: bool = False) -> bool:
        """Freeze v and fill in its record; raise EIO if incomplete.  Holds v.lock.

        ``at_fsync``: an incomplete file is not refused but left open (returns False): the
        application fsyncs a file it has not finished (its close decides, once, with one error and
        one log entry)."""
        t0 = time.monotonic()
        st = self.store.fstat(v.fd)
        size = v.size = st.st_size
        if self.check_formats:
            reason = formats.check(self.store, v.fd, size, os.path.basename(v.path))
            if reason and at_fsync:
                return False
            if reason:
                self.abort(v, reason)
                if self.groups is not None:
                    self.groups.write_refused(v.path, reason)
                raise _err(errno.EIO, f"ckptfs: refusing to commit incomplete {v.path}: {reason}")
        if v.bypassed:
            v.sealed_key = (size, st.st_mtime_ns)  # a later write changes it (fs.CkptFS._after_bypass)
            self.stats["bytes_passed_through"] += size  # written by the kernel (bytes_written: by us)
        got = v.digest.finish(size)
        if got is None and self.committer is not None and not at_fsync:
            # C4: async mode hashes the whole file on the committer's thread, before its install;
            # the close returns now, as an unsafe write's does (it stalled for the 1 GiB read-back)
            v.digest_due = st
            v.seal_seconds = time.monotonic() - t0
            self.stats["digests_deferred"] += 1
        else:
            self._make_record(v, st, got, t0)
        with self.lock:  # (retire() decides under lock too: a version is never both discarded and sealed)
            if v.state != OPEN:
                raise _err(errno.EIO, f"ckptfs: {v.path} not committed: {v.doomed or 'discarded'}")
            if self.committer:
                v.state = QUEUED
                if self.pending.get(v.path) is v:
                    del self.pending[v.path]
                self.queued[v.path] = v
            else:
                v.state = COMMITTING
        return True

    def finish_seal(self, v: Version) -> None:
        """C4: the digest and record of a version sealed with its digest due (async mode), on the
        committer's thread before its install (outside ``commit_lock``: a 1 GiB read-back never
        holds up another commit's install)."""
        st = v.digest_due
        if st is None or v.record is not None or v.unlinked:
            return  # (an unlinked version is discarded by its install, unhashed)
        self._make_record(v, st, None, time.monotonic())
        v.digest_due = None

    def _make_record(self, v: Version, st: os.stat_result, got: tuple[str, str] | None, t0: float) -> None:
        """Hash v's ``st.st_size`` bytes where ``got`` (the streamed digest) is None, and fill in its
        record (generation assigned at install)."""
        size = st.st_size
        flusher = None
        if v.bypassed:
            if size - v.hinted > WRITEBACK_AHEAD:
                # the kernel wrote its bytes without us: start the writeback of those the pacer has
                # not started yet (fs.CkptFS._pace_writeback) while they are hashed
                flusher = threading.Thread(target=self.store.writeback_hint, args=(v.fd, v.hinted, size - v.hinted),
                                           name="ckptfs-writeback", daemon=True)
                flusher.start()
        try:
            if got is None:
                self.stats["rehashes"] += 1
                got = digest_fd(self.store, v.fd, size, parallel=v.bypassed)
        finally:
            if flusher is not None:
                flusher.join()
        v.seal_seconds += time.monotonic() - t0
        v.record = FileRecord(  # generation is assigned at install, in commit order
            size=size, blake3=got[0], chunks=got[1], generation=0,
            committed_at=time.time(), ino=st.st_ino,
        )

    def commit(self, v: Version, wait: bool, at_fsync: bool = False) -> bool:
        """Seal and commit v (sync: inline; async: queued, optionally waited).

        Returns False only for ``at_fsync`` when v is an incomplete known-format file: it stays
        open (staged), nothing is logged, and the caller makes its staged bytes durable."""
        with v.lock:
            if v.state != OPEN or not v.dirty:
                sealed = False
            else:
                if not self.seal(v, at_fsync):
                    return False
                sealed = True
        if sealed and self.committer is None:
            try:
                with self.commit_lock:
                    self.install(v)
            except OSError as e:
                self.failed(v, e)
                raise
        elif sealed:
            assert self.committer is not None
            self.committer.submit(v)
        if wait and self.committer is not None and v.state in (QUEUED, COMMITTING):
            self.wait_done(v)
            if v.error is not None:
                self.reported(v)
                raise _err(v.error.errno or errno.EIO, str(v.error))
        return True

    # ------------------------------------------------------------ install
    def install(self, v: Version) -> None:
        """Make v durable and install it at v.path (the four steps of the module doc).  Caller holds
        commit_lock."""
        if v.unlinked:
            self.discard(v, None)
            return
        rec = v.record
        assert rec is not None
        t0 = time.monotonic()
        prev = self.records.get(v.path)
        rec = dataclasses.replace(rec, generation=prev.generation + 1 if prev else 1)
        if self.groups is not None and self.groups.is_pointer(v.path) and rec.size <= 4096:
            self.groups.seal_named_by_pointer(v.path, self.store.pread(v.fd, rec.size, 0))  # G6
        carried = self.carry_record(v, rec)
        self.sync_data(v)
        crashpoints.hit("stage_synced")
        keep = self.keep_plan(v.path, prev) if v.keep_prev else None  # previous generation kept (generations.py)
        entry: dict[str, Any] = {"op": "install", "path": v.path, "staging": v.staging, "rec": rec.to_json()}
        if keep:
            entry["keep"] = keep
        mark = None
        if keep or not carried:
            mark = self.log_intent(v, entry)
            crashpoints.hit("intent_logged")
        elif self.journal.settle():  # a group opened just before, say: durable before this rename
            self.stats["journal_settles"] += 1
        try:
            replaced = self.store.lstat(v.path)
        except OSError:
            replaced = None
        try:
            if keep:
                self.gens.link(v.path, keep)
            self.put_in_place(v)
        except OSError:
            if keep:
                self.gens.unlink_quiet(keep)
            if mark is not None:
                self.journal.retract(mark)
            raise
        crashpoints.hit("installed")
        if replaced is not None and replaced.st_ino != v.ino:
            if replaced.st_nlink == 1:
                self.inodes.drop(replaced.st_ino)
            else:
                self.inodes.drop(v.ino)  # linked since the version began: the write breaks the link (N2, N3)
        try:
            self.sync_name(v)
        except OSError as e:
            # The new version is in place but its durability is unknown: keep
            # the in-memory state truthful and fail the caller (never re-fsync).
            self.installed(v, rec, keep)
            v.error = e
            raise
        crashpoints.hit("dir_synced")
        took = v.seal_seconds + time.monotonic() - t0
        if self.times.observe(took, rec.size):
            self.stats["slow_commits"] += 1
            said = self.slow_log.note(v.path, rec.size, took)
            if said is not None:
                (log.warning if said[0] == "warning" else log.info)("%s", said[1])
        if mark is None:
            self.log_done(dict(entry, done=True))
        self.installed(v, rec, keep)
        if self.groups is not None:
            self.groups.after_install(v.path)
        self.maybe_compact()

    def batchable(self, v: Version, paths: set[str]) -> bool:
        """Whether v may join an async group commit (C5) whose versions so far are at ``paths``:
        its record can travel with it (one chunk digest per MiB, at most CARRY_MAX_CHUNKS; a
        digest still due is made before the batch installs), it is no pointer (G6 seals a group
        before it) and its path is not in the batch.  (Whether it keeps a generation, which journals an
        intent of its own, is known under ``commit_lock``: :meth:`install_batch` ends there.)"""
        rec = v.record
        if rec is not None:
            fits = _travels(rec)
        else:  # its digest is due (C4): made by finish_seal before the batch installs
            fits = v.digest_due is not None and v.size <= CARRY_MAX_CHUNKS << 20
        return (self.carry and fits and not v.unlinked and v.path not in paths
                and not (self.groups is not None and self.groups.is_pointer(v.path)))

    def install_batch(self, vs: list[Version]) -> list[Version]:
        """Install ``vs`` (close order, each :meth:`batchable`) as one group commit (C5, the
        module doc).  Caller holds commit_lock.  Returns the versions not installed here, in order
        (a record that could not travel after all): the caller installs them one at a time.

        Invariant (I1, I2 with C5): the batch's intent is durable before its first rename and
        names every file of it; each staged file is durable before the intent.  A power loss
        therefore leaves a prefix of the batch's renames, which recovery completes, and nothing
        before the batch unsettled (the intent's fdatasync settles the journal)."""
        t0 = time.monotonic()
        batch: list[tuple[Version, FileRecord]] = []
        rest: list[Version] = []
        paths: set[str] = set()
        for i, v in enumerate(vs):
            if v.unlinked or v.record is None or v.path in paths:  # (a rename may have moved a queued
                # version's path since _take; a record too large to travel ends it below)
                rest = vs[i:]
                break
            paths.add(v.path)
            prev = self.records.get(v.path)
            rec = dataclasses.replace(v.record, generation=prev.generation + 1 if prev else 1)
            if (v.keep_prev and self.keep_plan(v.path, prev)) or not self.carry_record(v, rec):
                rest = vs[i:]
                break
            batch.append((v, rec))
        if len(batch) <= 1:
            return vs  # nothing to share: the single-file install (with its own two syncs)
        self.sync_batch([v for v, _ in batch])
        self._hit_each("stage_synced", batch)
        entry = {"op": "install_batch",
                 "items": [{"op": "install", "path": v.path, "staging": v.staging, "rec": rec.to_json()}
                           for v, rec in batch]}
        mark = self.log_batch(entry)
        self._hit_each("intent_logged", batch)
        for n, (v, _rec) in enumerate(batch):
            try:
                replaced = self.store.lstat(v.path)
            except OSError:
                replaced = None
            try:
                self.put_in_place(v)
            except OSError as e:
                # the intent names files never installed: take it back and restate it as what
                # happened (both synced, so recovery never finishes their renames), and fail them
                # and those behind them
                try:
                    self.journal.retract(mark)
                    if n:
                        self.journal.append(dict(entry, items=entry["items"][:n]))
                except OSError as e2:  # (their staging files are removed below: nothing to finish)
                    log.warning("could not restate the group commit after a failed rename: %s", e2)
                for w in [w for w, _ in batch[n:]] + rest:
                    self.failed(w, _own(e))
                    w.done.set()
                batch, rest = batch[:n], []
                break
            if replaced is not None and replaced.st_ino != v.ino:
                self.inodes.drop(replaced.st_ino if replaced.st_nlink == 1 else v.ino)  # (as install: N2, N3)
        self._hit_each("installed", batch)
        if not batch:
            return []  # (the first rename failed: nothing is in place, nothing to sync)
        try:
            self.sync_batch_names([v for v, _ in batch])
        except OSError as e:
            for v, rec in batch:  # in place, durability unknown: the tables say so, the caller fails them
                self.installed(v, rec)
                v.error = e
            raise
        self._hit_each("dir_synced", batch)
        took = time.monotonic() - t0
        self.stats["batches"] += 1
        self.stats["batched_installs"] += len(batch)
        for v, rec in batch:  # all in place and durable: the tables say so before any hook runs
            if self.times.observe(v.seal_seconds + took, rec.size):
                self.stats["slow_commits"] += 1
            self.installed(v, rec)
        for v, _rec in batch:
            if self.groups is not None:
                try:
                    self.groups.after_install(v.path)  # (a seal can fail: reported for this file)
                except OSError as e:
                    self.failed(v, _own(e))
        self.maybe_compact()
        return rest

    @staticmethod
    def _hit_each(point: str, batch: list) -> None:
        """A crash point of the batch, hit once per file in it (a point's N-th hit is the same
        file's step with or without group commits)."""
        for _ in batch:
            crashpoints.hit(point)

    def sync_batch(self, vs: list[Version]) -> None:
        """C5 step 1: every staged file of the batch durable, with the record it carries
        (concurrent fsyncs; the first error is raised once all have returned: never retried), and
        its name in ``staging/`` (the intent names it; the weak model loses an unsynced entry)."""
        if self._syncers is None:
            self._syncers = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="ckptfs-sync")
        errs = [f.exception() for f in [self._syncers.submit(self.sync_data, v) for v in vs]]
        for e in errs:
            if e is not None:
                raise e
        self.store.fsync_dir(parent(vs[0].staging))  # their staging names too: recovery renames by name

    def log_batch(self, entry: dict) -> int:
        """C5 step 2: the batch's intent, durable (also settles what was appended unsynced); its
        mark (to retract)."""
        return self.journal.append(entry)

    def sync_batch_names(self, vs: list[Version]) -> None:
        """C5 step 4: the directories the batch's names landed in, then ``staging/`` (no staging
        name of the batch can come back for recovery's roll forward)."""
        for d in dict.fromkeys(parent(v.path) for v in vs):
            self.store.fsync_dir(d)
        self.store.fsync_dir(parent(vs[0].staging))

    def carry_record(self, v: Version, rec: FileRecord) -> bool:
        """Step 1: ``rec`` set on the staged inode (records.XATTR), made durable by step 2.  False
        where it cannot travel there (a record of more than CARRY_MAX_CHUNKS chunks; no user xattrs
        on the backing fs): then step 3 journals it before the rename, as every install once did."""
        if not self.carry or not _travels(rec):
            return False
        try:
            self.store.fsetxattr(v.fd, XATTR, to_xattr(rec))
            return True
        except OSError as e:
            if e.errno not in _NO_CARRY:
                raise
            if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                self.carry = False
                log.warning("the backing filesystem keeps no user xattrs (%s): every install journals its "
                            "record before the rename (one sync more per file)", e)
            return False

    def sync_data(self, v: Version) -> None:
        """Step 2: the staged bytes (and the record they carry) are durable."""
        self.store.fsync(v.fd)

    def log_intent(self, v: Version, entry: dict) -> Any:
        """Step 3: the install intent is durable in the journal; its mark (to retract)."""
        return self.journal.append(entry)

    def put_in_place(self, v: Version) -> None:
        """Step 4: the atomic rename over the path."""
        self.store.rename(v.staging, v.path)

    def sync_name(self, v: Version) -> None:
        """Step 5: the rename is durable."""
        self.store.fsync_dir(parent(v.path))

    def log_done(self, entry: dict) -> None:
        """Step 6: the finished install in the journal, unsynced (the next synced append or
        compaction makes it durable; until then the file itself carries its record)."""
        try:
            self.journal.append(entry, sync=False)
        except OSError as e:
            log.warning("could not journal the install of %s (its file carries the record): %s", entry["path"], e)

    def installed(self, v: Version, rec: FileRecord, keep: dict | None = None) -> None:
        """The tables say v is installed (its fd closed if no handle uses it)."""
        with self.lock:
            self.gens.installed(v.path, keep)
            self.records[v.path] = rec
            v.record = rec
            v.state = INSTALLED
            v.dirty = False
            self.unlist(v)
            self.last_abort.pop(v.path, None)
            self.stats["commits"] += 1
            self.stats["bytes_committed"] += rec.size
            self.events.emit(events.PUBLISHED, v.path)
            fd = self.take_fd(v)
        self.gens.collect()
        self.close_quiet(fd)

    def maybe_compact(self) -> None:
        if self.journal.entries_since_snapshot >= self.journal.compact_every:
            self.compact()

    def compact(self, clean: bool = False) -> None:
        """Write the whole state as the journal's snapshot (records, aborts, groups, generations);
        ``clean``: at a clean shutdown, nothing appended after it (recovery then skips R1's walk)."""
        self.journal.compact(self.records, list(self.aborts), self.groups.to_json() if self.groups else {},
                             clean=clean)

    def failed(self, v: Version, e: OSError) -> None:
        """A commit hit an I/O error: the data is treated as lost (never re-fsync)."""
        log.error("commit of %s failed: %s", v.path, e)
        v.error = e
        self.abort(v, f"I/O error during commit: {e}")
        if self.committer:
            with self.lock:
                self.async_failures.append((v.path, e))
        if v.state != INSTALLED:  # (its install attempt is over: nothing else changes v now)
            self.discard(v, None)

    def reported(self, v: Version) -> None:
        """v's async commit failure reached the application (fsync): no longer pending."""
        with self.lock:
            self.async_failures = [f for f in self.async_failures if f[1] is not v.error]

    def take_failures(self, path: str) -> list[tuple[str, OSError]]:
        """Async commit failures at or under ``path``, each reported once."""
        pre = path + "/" if path else ""
        with self.lock:
            failed = [f for f in self.async_failures if f[0].startswith(pre)]
            for f in failed:
                self.async_failures.remove(f)
        return failed

    # --------------------------------------------------------- namespace
    def ns_op(self, entry: dict, do: Callable[[], None], dirs: list[str], after: bool = False) -> None:
        """Journal ``entry``, perform ``do()``, fsync ``dirs``.  Holds commit_lock.

        ``after`` (I8 in fs.py: an operation whose effect recovery reads from the disk alone, e.g.
        an unlink of a file outside groups and kept generations): one sync, not two.  Entries owed are settled
        first (as an install without intent does), then ``do()``, the directories fsynced, and the
        entry appended afterwards as done and unsynced: a power loss that drops it leaves a disk on
        which the operation is complete or never happened, and recovery drops the record of a file
        that is gone (step 5)."""
        if after:
            if self.journal.settle():
                self.stats["journal_settles"] += 1
            do()
            crashpoints.hit("ns_done")
            for d in dict.fromkeys(dirs):
                self.store.fsync_dir(d)
            self.journal.append(dict(entry, done=True), sync=False)
            self.stats["ns_ops"] += 1
            self.stats["ns_ops_one_sync"] += 1
            return
        mark = self.journal.append(entry)
        crashpoints.hit("ns_intent_logged")
        try:
            do()
        except OSError:
            self.journal.retract(mark)
            raise
        crashpoints.hit("ns_done")
        for d in dict.fromkeys(dirs):
            self.store.fsync_dir(d)
        self.stats["ns_ops"] += 1

    def wait_done(self, v: Version) -> None:
        """Until v's install is over (async mode: the committer takes it even when held)."""
        if self.committer is not None:
            self.committer.wait(v)
        else:
            v.done.wait()

    def barrier(self) -> None:
        """Order a namespace op after every earlier commit (async mode)."""
        if self.committer:
            self.committer.drain()

    def stop(self) -> None:
        if self.committer:
            self.committer.stop()
        if self._syncers is not None:
            self._syncers.shutdown()


class Committer:
    """Background committer for ``--commit=async``: installs sealed versions in submission (=
    close) order; bounded backlog.  Versions waiting behind each other are installed as one group
    commit (:meth:`CommitEngine.install_batch`, C5).

    ``held`` (the model checker's async workloads): the committer takes nothing until someone
    waits (an fsync of a queued version, :meth:`drain`) or the backlog is full, so the closes
    before a sync point form one batch deterministically."""

    def __init__(self, engine: CommitEngine, max_items: int, max_bytes: int) -> None:
        self.engine = engine
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.queue: collections.deque[Version] = collections.deque()
        self.queued_bytes = 0
        self.busy = False
        self.stopping = False
        self.held = False
        self.waiters = 0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="ckptfs-committer", daemon=True)
        self.thread.start()

    def submit(self, v: Version) -> None:
        with self.cond:
            while self.queue and (len(self.queue) >= self.max_items
                                  or self.queued_bytes + v.size > self.max_bytes):
                self.engine.stats["backpressure_waits"] += 1
                self.waiters += 1
                self.cond.notify_all()
                self.cond.wait()
                self.waiters -= 1
            self.queue.append(v)
            self.queued_bytes += v.size
            self.cond.notify_all()

    def wait(self, v: Version) -> None:
        """Until v's commit is over (installed or failed)."""
        with self.cond:
            self.waiters += 1
            self.cond.notify_all()
        try:
            v.done.wait()
        finally:
            with self.cond:
                self.waiters -= 1

    def drain(self) -> None:
        with self.cond:
            self.waiters += 1
            self.cond.notify_all()
            while self.queue or self.busy:
                self.cond.wait()
            self.waiters -= 1

    def stop(self) -> None:
        self.drain()
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()

    def _take(self) -> list[Version]:
        """(``cond`` held) The next version, and those behind it that may share its commit (C5)."""
        v = self.queue.popleft()
        batch = [v]
        eng = self.engine
        paths = {v.path}
        try:
            if eng.batchable(v, set()):
                while self.queue and len(batch) < BATCH_MAX and eng.batchable(self.queue[0], paths):
                    w = self.queue.popleft()
                    batch.append(w)
                    paths.add(w.path)
        except Exception:  # never the committer's death: what was taken installs as it is
            log.exception("committer: choosing a group commit")
        return batch

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and (not self.queue or (self.held and not self.waiters)):
                    self.cond.wait()
                if not self.queue:
                    return
                batch = self._take()
                self.busy = True
            try:
                self._commit(batch)
            finally:
                with self.cond:
                    self.busy = False
                    self.queued_bytes -= sum(v.size for v in batch)
                    self.cond.notify_all()

    def _commit(self, batch: list[Version]) -> None:
        """Install ``batch`` (one version, or a group commit), each failed version failed."""
        eng = self.engine
        todo = batch
        try:
            for v in batch:
                eng.finish_seal(v)  # C4: its digest, if its close left it due
            with eng.commit_lock:
                with eng.lock:
                    unreported = eng.async_failures[:1]
                if unreported:
                    # An earlier commit failed and the application has not been
                    # told yet (fsync/fsyncdir): installing later versions would
                    # make a partial save visible (a step's .metadata without one
                    # of its shards), so they fail too until it has been reported.
                    p, e = unreported[0]
                    raise OSError(errno.EIO, f"ckptfs: not committed: the earlier commit of {p} failed: {e}")
                for v in batch:
                    v.state = COMMITTING
                if len(batch) > 1:
                    todo = eng.install_batch(batch)
                while todo:
                    v = todo[0]
                    eng.install(v)
                    v.done.set()
                    todo = todo[1:]
        except Exception as exc:
            # every version of ``todo`` not failed already is failed now, each with its own error
            # (installed ones too: the error after their install is reported at the next fsync,
            # as before C5).  Not the disk (a bug): EIO, and the committer lives on (a dead
            # committer hangs every later fsync).
            if isinstance(exc, OSError):
                e = exc
            else:
                log.exception("committer: unexpected error")
                e = OSError(errno.EIO, f"ckptfs: internal error during commit: {exc!r}")
            for v in todo:
                if v.state != DISCARDED:
                    try:
                        eng.failed(v, _own(e))
                    except Exception:
                        log.exception("committer: failing %s", v.path)
        finally:
            for v in batch:
                v.done.set()
