"""Verify-on-read, rollback to kept generations, and the background scrubber.

Used by :class:`ckptfs.fs.CkptFS` through a handful of hooks (open, read,
release, getattr, xattrs, clone); all logic lives here.

Read path (committed files only; staged versions are the writer's own bytes):

* **open**: ``fstat`` of the opened file vs its record: another inode (file
  replaced or swapped) or another size (truncated / extended) fails the open
  with EIO at once; no byte is served.  A version already known corrupt fails
  too.
* **read**: before a read returns, every 1 MiB chunk it touches that is not yet
  verified for this *version* is read whole, hashed (blake3) and compared with
  its recorded digest; bytes of a freshly verified chunk are served from the
  very buffer that was hashed.  A mismatch fails the read with EIO.  Reads
  past the committed size return nothing.
* **cache**: verification state is kept per version, keyed by (inode, size,
  mtime, ctime, record digest, generation); any change to the file (even an
  mtime reset by ``touch``, which moves ctime) gives a new key and a
  re-verification.  A second open of a verified file hashes nothing
  (``verify_bytes_hashed`` in the root ``user.ckptfs.stats`` stays put).
  Changes that leave no trace in the inode (bit rot below the filesystem) are
  caught by the scrubber, which re-hashes every committed file periodically.
* **on mismatch**: EIO, ``user.ckptfs.status=corrupt``, ``user.ckptfs.error``
  (which chunk, expected vs actual digest), an ``ERROR integrity:`` line in
  ``.ckptfs/daemon.log`` and an entry in the root ``user.ckptfs.corrupt`` list.
  A corrupt verdict sticks to the version until the file changes.

Policy ``--on-corrupt``:

* ``eio`` (default): corrupt files fail with EIO; verification is lazy (chunk
  by chunk, so a multi-GB file needs no up-front pass).
* ``rollback``: for a path that has kept generations, the current version is
  verified *completely* the first time it is looked up or opened (a decision
  must be made before the first byte or size is served); if it is corrupt the
  newest kept generation that verifies completely is served instead (stat,
  open and read), and ``user.ckptfs.rollback`` says so.  Paths without kept
  generations behave as ``eio``.

Invariant: no read through the mount returns a byte of a committed file that
was not hashed and matched against the record of the version being served.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptfs.backing import BackingStore
from ckptfs.engine.generations import GenEntry, Generations
from ckptfs.hashing import hasher_pool
from ckptfs.integrity.verify import Finding, RateLimiter, check_chunk, check_identity, chunk_count, verify_fd
from ckptfs.records import FileRecord
from ckptfs.xattrs import (
    X_CORRUPT,
    X_ERROR,
    X_KEEP_GENERATIONS,
    X_KEPT_GENERATIONS,
    X_METADATA,
    X_ON_CORRUPT,
    X_ROLLBACK,
    X_SCRUB,
    X_STATUS,
    X_VERIFIED,
)

log = logging.getLogger("ckptfs.integrity")

MAX_STATES = 100_000
PARALLEL_VERIFY_MIN = 8  # chunks: below this a second thread costs more than it saves


def _eio(path: str, f: Finding) -> OSError:
    return OSError(errno.EIO, f"ckptfs: {path} is corrupt: {f.detail}")


@dataclass(eq=False)
class VState:
    """Verification state of one version of one file."""

    rec: FileRecord
    verified: bytearray
    bad: Finding | None = None
    rollback: GenEntry | None = None  # rollback policy: generation served instead
    full_checked: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: dict[int, threading.Event] = field(default_factory=dict)  # chunks being hashed now

    @property
    def n_verified(self) -> int:
        return sum(self.verified)


@dataclass(eq=False)
class Check:
    """Per open backing fd of a committed file: what it is verified against."""

    path: str
    state: VState
    key: tuple
    generation: GenEntry | None = None  # set when serving a kept generation


def version_key(st: os.stat_result, rec: FileRecord) -> tuple:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, rec.blake3, rec.generation)


class Integrity:
    """Verification of committed files on read, on demand and in the background.

    Explicit dependencies, no reference to the filesystem object: ``records`` (the committed
    records, read only here), ``gens`` (kept generations, owned by the commit path: read here for
    ``--on-corrupt rollback``), ``commit_lock`` (taken only to read a record consistently while a
    commit may be installing the path), ``stats`` (counters), and ``on_corrupt_found(path, detail)``,
    the callback that hides the group holding a corrupt file (engine groups)."""

    def __init__(self, store: BackingStore, records: dict[str, FileRecord], gens: Generations,
                 commit_lock: threading.RLock, stats: collections.Counter[str],
                 on_corrupt_found: Callable[[str, str], None], *, on_corrupt: str = "eio",
                 scrub_interval: float = 0.0, scrub_rate_mb: float = 64.0,
                 metadata_problems: list[str] | None = None) -> None:
        if on_corrupt not in ("eio", "rollback"):
            raise ValueError("on_corrupt must be 'eio' or 'rollback'")
        self.store = store
        self.records = records
        self.gens = gens
        self.commit_lock = commit_lock
        self.stats = stats
        self.on_corrupt_found = on_corrupt_found
        self.on_corrupt = on_corrupt
        self.states: collections.OrderedDict[tuple, VState] = collections.OrderedDict()
        self.checks: dict[int, Check] = {}
        self.lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.events: collections.deque[dict] = collections.deque(maxlen=100)
        self.metadata_problems = list(metadata_problems or [])
        self.scrub_interval = scrub_interval
        self.scrub_rate = scrub_rate_mb * 1e6 if scrub_rate_mb > 0 else None
        self.scrub_info: dict = {"state": "idle", "interval_s": scrub_interval, "rate_mb_s": scrub_rate_mb}
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._scrub_thread: threading.Thread | None = None
        if scrub_interval > 0:
            self._start_scrubber()

    # ------------------------------------------------------------ states
    def state_for(self, st: os.stat_result, rec: FileRecord) -> tuple[tuple, VState]:
        key = version_key(st, rec)
        with self.lock:
            s = self.states.get(key)
            if s is None:
                s = VState(rec=rec, verified=bytearray(chunk_count(rec)))
                self.states[key] = s
                while len(self.states) > MAX_STATES:
                    self.states.popitem(last=False)
            else:
                self.states.move_to_end(key)
            return key, s

    def _owner(self, ino: int) -> str | None:
        for p, r in list(self.records.items()):
            if r.ino == ino:
                return p
        return None

    def _corrupt(self, path: str, s: VState, f: Finding) -> None:
        with s.lock:
            if s.bad is not None:
                return
            s.bad = f
        self.stats["corrupt_detected"] += 1
        ev = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "path": path, "kind": f.kind,
              "mechanism": f.mechanism, "detail": f.detail}
        if f.chunk is not None:
            ev["chunk"] = f.chunk
        self.events.append(ev)
        log.error("integrity: %s corrupt (%s, caught by %s): %s", path, f.kind, f.mechanism, f.detail)
        self.on_corrupt_found(path, f"{f.kind}: {f.detail}")  # its group is hidden (engine/groups.py)

    def _hash_chunk(self, path: str, fd: int, s: VState, i: int) -> bytes:
        """Read, hash and check chunk i; mark it verified or the state corrupt (EIO)."""
        rec = s.rec
        off = i * rec.chunk_size
        data = self.store.pread(fd, min(rec.chunk_size, rec.size - off), off)
        with self._count_lock:  # (two threads hash one file: _verify_all)
            self.stats["verify_bytes_hashed"] += len(data)
            self.stats["verify_chunks_hashed"] += 1
        bad = check_chunk(path, rec, i, data)
        if bad is not None:
            self._corrupt(path, s, bad)
            raise _eio(path, bad)
        s.verified[i] = 1
        return data

    def _verify_all(self, path: str, fd: int, s: VState) -> Finding | None:
        """Hash every chunk not yet verified (cache-aware).  The Finding if corrupt."""
        if s.bad is None and not s.full_checked:
            todo = [i for i in range(len(s.verified)) if not s.verified[i]]
            # two threads (reading and hashing overlap; blake3 releases the GIL): a whole-file
            # verify at open is on the opener's path (passthrough).  The helper is always waited
            # for, so it never reads ``fd`` after the caller closed it.
            half = todo[len(todo) // 2:] if len(todo) >= PARALLEL_VERIFY_MIN else []
            helper = hasher_pool().submit(self._hash_chunks, path, fd, s, half) if half else None
            try:
                self._hash_chunks(path, fd, s, todo[:len(todo) - len(half)])
            except OSError:
                if s.bad is None:
                    raise
            finally:
                if helper is not None:
                    try:
                        helper.result()
                    except OSError:
                        if s.bad is None:
                            raise
            s.full_checked = s.bad is None
        return s.bad

    def _hash_chunks(self, path: str, fd: int, s: VState, chunks: list[int]) -> None:
        for i in chunks:
            if s.bad is not None:
                return
            if not s.verified[i]:
                self._hash_chunk(path, fd, s, i)

    def keep_plan(self, path: str, prev: FileRecord | None) -> dict | None:
        """Journal fragment to keep ``prev`` as a generation of ``path`` (commit lock held)."""
        if prev is None or self.gens.keep <= 0:
            return None
        try:
            st = self.store.lstat(path)
        except OSError:
            return None
        if st.st_ino != prev.ino or st.st_size != prev.size:
            # the path does not hold the recorded version (another file; or this one written in
            # place since, through a passthrough writer's open file: fs.CkptFS._after_bypass)
            return None
        if st.st_nlink > 1:
            # a hard link names it elsewhere (cp -al, rsync --link-dest): it stays there, and a kept
            # link would show as an extra st_nlink on that name (pjdfstest rename/23)
            return None
        s = self.states.get(version_key(st, prev))
        if s is not None and s.bad is not None:
            return None  # known corrupt: never a rollback target
        return self.gens.plan(prev)

    # ---------------------------------------------------------- open/read
    def open_committed(self, path: str, fd: int, expect: FileRecord | None = None) -> tuple[int, Check | None]:
        """Check a just-opened committed file; return the fd to serve and its Check.

        Takes ownership of ``fd``: on EIO (corrupt, no rollback applies) it is
        closed; the returned fd may be another one (a kept generation, or the
        path reopened after a concurrent install) and ``fd`` is then closed.
        ``expect``: the record ``fd``'s file is checked against where ``fd`` is that record's
        inode (RS1: a sealed view serves the sealed file even where a commit has installed another
        at the path since); otherwise, and without it, the path's record now.
        """
        rec = expect if expect is not None else self.records.get(path)
        if rec is None:
            return fd, None  # untracked: written without ckptfs
        self.store.readahead_hint(fd)
        try:
            st = self.store.fstat(fd)
        except BaseException:
            self.store.close(fd)
            raise
        if rec.ino and st.st_ino != rec.ino:
            # a commit may be installing this path right now: decide under the commit lock
            with self.commit_lock:
                rec = self.records.get(path)
                self.store.close(fd)
                fd = self.store.open(path, os.O_RDONLY)
                try:
                    st = self.store.fstat(fd)
                except BaseException:
                    self.store.close(fd)
                    raise
                if rec is None:
                    return fd, None
        try:
            serve, chk = self._admit(path, fd, st, rec)
        except BaseException:
            self.store.close(fd)
            raise
        if serve != fd:
            self.store.close(fd)
        return serve, chk

    def open_kept(self, path: str, fd: int, rec: FileRecord) -> Check:
        """Check ``fd``, a kept generation of ``path`` served as the file's sealed version (RS1,
        engine/sealedview.py), against its own record ``rec``; reads are verified like any
        committed read.  Takes ownership of ``fd``: closed on EIO (known corrupt, or not the file
        the record names)."""
        try:
            st = self.store.fstat(fd)
            key, s = self.state_for(st, rec)
            if s.bad is None:
                bad = check_identity(f"{path} (kept generation {rec.generation})", st, rec)
                if bad is not None:
                    self._corrupt(f"{path} (kept generation {rec.generation})", s, bad)
            if s.bad is not None:
                raise _eio(path, s.bad)
        except BaseException:
            self.store.close(fd)
            raise
        return Check(path, s, key)

    def _admit(self, path: str, fd: int, st: os.stat_result, rec: FileRecord) -> tuple[int, Check | None]:
        key, s = self.state_for(st, rec)
        if s.bad is None:
            bad = check_identity(path, st, rec, self._owner)
            if bad is not None:
                self._corrupt(path, s, bad)
        if s.bad is None and self.on_corrupt == "rollback" and self.gens.of(path):
            self._verify_all(path, fd, s)
        if s.bad is not None:
            if self.on_corrupt == "rollback":
                got = self._rollback_target(path, s)
                if got is not None:
                    g, gfd, gkey, gs = got
                    self.stats["rollback_opens"] += 1
                    return gfd, Check(path, gs, gkey, generation=g)
            raise _eio(path, s.bad)
        return fd, Check(path, s, key)

    def _rollback_target(self, path: str, s: VState) -> tuple[GenEntry, int, tuple, VState] | None:
        """Newest kept generation of ``path`` that verifies completely (opened)."""
        for g in self.gens.of(path):
            try:
                gfd = self.store.open(g.name, os.O_RDONLY)
            except OSError:
                continue
            try:
                st = self.store.fstat(gfd)
                gkey, gs = self.state_for(st, g.rec)
                if gs.bad is None:
                    bad = check_identity(g.name, st, g.rec)
                    if bad is not None:
                        self._corrupt(f"{path} (kept generation {g.rec.generation})", gs, bad)
                    else:
                        self._verify_all(f"{path} (kept generation {g.rec.generation})", gfd, gs)
            except OSError:
                self.store.close(gfd)
                continue
            if gs.bad is None:
                s.rollback = g
                return g, gfd, gkey, gs
            self.store.close(gfd)
        return None

    def verify_whole(self, fd: int) -> None:
        """Verify every byte of the committed file open as ``fd`` now (passthrough: the kernel will
        serve its reads without asking us).  Once per version (``VState.full_checked``), so
        re-opens cost nothing; raises EIO if it is corrupt (recorded as a read would)."""
        chk = self.checks.get(fd)
        if chk is None:
            return  # untracked: nothing recorded to verify against (reads are not checked either)
        bad = self._verify_all(chk.path, fd, chk.state)
        if bad is not None:
            raise _eio(chk.path, bad)

    def bind(self, fd: int, chk: Check | None) -> None:
        if chk is not None:
            with self.lock:
                self.checks[fd] = chk

    def forget(self, fd: int | None) -> None:
        if fd is not None:
            with self.lock:
                self.checks.pop(fd, None)

    def read(self, fd: int, size: int, offset: int) -> bytes:
        """pread that serves only verified bytes of a committed file."""
        buf = bytearray(size)
        n = self.read_into(fd, memoryview(buf), offset)
        return bytes(buf[:n]) if n < size else bytes(buf)

    def read_into(self, fd: int, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` from ``offset`` with verified bytes only; the count filled.

        A chunk not yet verified is read whole, hashed once (a concurrent read
        of the same chunk waits for that hash instead of hashing it again) and
        its bytes are copied from the hashed buffer; verified chunks are read
        straight into ``buf``."""
        chk = self.checks.get(fd)
        if chk is None:
            return self.store.preadinto(fd, buf, offset)
        s = chk.state
        st = self.store.fstat(fd)
        if version_key(st, s.rec) != chk.key:
            # changed while open (behind ckptfs' back): a new version to verify
            key, s2 = self.state_for(st, s.rec)
            bad = check_identity(chk.path, st, s.rec) if s2.bad is None else None
            if bad is not None:
                self._corrupt(chk.path, s2, bad)
            chk.key, chk.state, s = key, s2, s2
        if s.bad is not None:
            raise _eio(chk.path, s.bad)
        rec = s.rec
        end = min(offset + len(buf), rec.size)
        if offset >= end:
            return 0
        cs = rec.chunk_size
        cached = True
        for i in range(offset // cs, (end - 1) // cs + 1):
            lo, hi = max(offset, i * cs), min(end, (i + 1) * cs)
            data = self._ensure_chunk(chk.path, fd, s, i)
            if data is not None:
                cached = False
                buf[lo - offset:hi - offset] = memoryview(data)[lo - i * cs:hi - i * cs]
                continue
            got = self.store.preadinto(fd, buf[lo - offset:hi - offset], lo)
            if got < hi - lo:
                return lo - offset + got  # shorter than committed: the next read sees the change
        if cached:
            self.stats["verify_cached_reads"] += 1
        return end - offset

    def _ensure_chunk(self, path: str, fd: int, s: VState, i: int) -> bytes | None:
        """Make chunk i verified: its bytes if this call hashed it, None if it
        already was (or another read just verified it).  EIO if corrupt."""
        while True:
            with s.lock:
                if s.bad is not None:
                    raise _eio(path, s.bad)
                if s.verified[i]:
                    return None
                ev = s.busy.get(i)
                if ev is None:
                    ev = s.busy[i] = threading.Event()
                    break
            ev.wait()
        try:
            return self._hash_chunk(path, fd, s, i)
        finally:
            with s.lock:
                s.busy.pop(i, None)
            ev.set()

    def before_clone(self, fd: int | None) -> None:
        """A write clones the committed file: verify all of it first (no laundering)."""
        if fd is not None:
            self.verify_whole(fd)

    # ------------------------------------------------------------ getattr
    def stat_override(self, path: str) -> os.stat_result | None:
        """rollback policy: the stat of the generation served instead of ``path``."""
        if self.on_corrupt != "rollback" or not self.gens.table.get(path):
            return None
        rec = self.records.get(path)
        if rec is None:
            return None
        try:
            fd = self.store.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                gfd, chk = self._admit(path, fd, self.store.fstat(fd), rec)
            except OSError:
                return None  # corrupt, nothing to roll back to: stat shows the file as is
            if gfd == fd:
                return None
            try:
                return self.store.fstat(gfd)
            finally:
                self.store.close(gfd)
        finally:
            self.store.close(fd)

    # ------------------------------------------------------------- xattrs
    def file_attrs(self, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        gens = self.gens.of(path)
        if gens:
            out[X_KEPT_GENERATIONS] = ",".join(str(g.rec.generation) for g in gens)
        rec = self.records.get(path)
        if rec is None:
            return out
        try:
            st = self.store.lstat(path)
        except OSError:
            return out
        s = self.states.get(version_key(st, rec))
        if s is None:
            out[X_VERIFIED] = f"0/{chunk_count(rec)} chunks"
            return out
        if s.bad is not None:
            out[X_STATUS] = "corrupt"
            out[X_ERROR] = s.bad.detail
            out[X_VERIFIED] = "corrupt"
            if s.rollback is not None:
                out[X_ROLLBACK] = (
                    f"serving kept generation {s.rollback.rec.generation} "
                    f"(committed {s.rollback.rec.committed_iso()}) because generation {rec.generation} is corrupt")
        else:
            out[X_VERIFIED] = f"{s.n_verified}/{len(s.verified)} chunks"
        return out

    def root_attrs(self) -> dict[str, str]:
        return {
            X_CORRUPT: json.dumps(list(self.events)[-20:]),
            X_METADATA: json.dumps(
                {"status": "corrupt" if self.metadata_problems else "ok", "problems": self.metadata_problems[-20:]}),
            X_SCRUB: json.dumps(self.scrub_info, sort_keys=True),
            X_ON_CORRUPT: self.on_corrupt,
            X_KEEP_GENERATIONS: (str(self.gens.keep) if self.gens.everywhere
                                 else f"{self.gens.keep} (checkpoint groups)"),
        }

    def control(self, path: str, value: bytes) -> None:
        """``setxattr user.ckptfs.control``: ``verify`` (file or subtree, synchronous,
        EIO if anything is corrupt) or ``scrub`` (root: start a background scrub now)."""
        cmd = value.decode(errors="replace").strip()
        if cmd == "scrub":
            self.request_scrub()
            return
        if cmd != "verify":
            raise OSError(errno.EINVAL, f"ckptfs: unknown control {cmd!r} (verify | scrub)")
        bad = [f for f in self.verify_now(path) if not f.ok]
        if bad:
            raise _eio(bad[0].path, bad[0])

    # ------------------------------------------------------- forced verify
    def verify_now(self, prefix: str, limiter: RateLimiter | None = None,
                   stop: threading.Event | None = None, track: bool = False) -> list[Finding]:
        """Re-hash every committed file at/under ``prefix`` (ignoring the cache); ``track``: the
        scrub's progress in bytes goes to ``scrub_info`` (bytes_total, bytes_done)."""
        pre = prefix.strip("/")
        out = []
        todo = [(p, r) for p, r in sorted(self.records.items()) if not pre or p == pre or p.startswith(pre + "/")]
        progress = {"bytes_total": sum(r.size for _, r in todo) + sum(g.rec.size for p, _ in todo
                                                                       for g in self.gens.of(p)), "bytes_done": 0}
        info = self.scrub_info if track else {}
        info.update(progress)  # (read by ckptfs status and the metrics: scrub progress)
        for path, rec in todo:
            if stop is not None and stop.is_set():
                break
            f = self._verify_one(path, rec, limiter, stop)
            if f is not None:
                out.append(f)
            progress["bytes_done"] += rec.size
            for g in self.gens.of(path):
                self._verify_one(g.name, g.rec, limiter, stop, label=f"{path} (kept generation {g.rec.generation})")
                progress["bytes_done"] += g.rec.size
            info["bytes_done"] = progress["bytes_done"]
        return out

    def _verify_one(self, path: str, rec: FileRecord, limiter: RateLimiter | None,
                    stop: threading.Event | None, label: str | None = None) -> Finding | None:
        try:
            fd = self.store.open(path, os.O_RDONLY)
        except OSError:
            return None  # unlinked/renamed meanwhile
        try:
            st = self.store.fstat(fd)
            if self.records.get(path, rec) is not rec and label is None:
                return None  # a new version was committed meanwhile
            key, s = self.state_for(st, rec)
            f = verify_fd(self.store, fd, label or path, rec, limiter=limiter, stop=stop, inode_owner=self._owner)
            self.stats["scrub_bytes_hashed"] += f.bytes_hashed
            if f.ok:
                s.verified[:] = b"\x01" * len(s.verified)
                s.full_checked = True
            elif f.kind == "unreadable" and not f.mechanism:
                return None  # interrupted
            else:
                self._corrupt(label or path, s, f)
            return f
        finally:
            self.store.close(fd)

    # ------------------------------------------------------------- scrub
    def _start_scrubber(self) -> None:
        self._scrub_thread = threading.Thread(target=self._scrub_loop, name="ckptfs-scrub", daemon=True)
        self._scrub_thread.start()

    def request_scrub(self) -> None:
        if self._scrub_thread is None:
            self._start_scrubber()
        self._kick.set()

    def _scrub_loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.scrub_interval if self.scrub_interval > 0 else None)
            if self._stop.is_set():
                return
            self._kick.clear()
            self.scrub_once()

    def scrub_once(self) -> list[Finding]:
        self.scrub_info.update(state="running", started=time.time())
        self.stats["scrub_runs"] += 1
        t0 = time.monotonic()
        try:
            found = self.verify_now("", RateLimiter(self.scrub_rate), self._stop, track=True)
        except Exception as e:  # never let the scrubber kill the daemon
            log.exception("scrub failed")
            self.scrub_info.update(state="failed", error=str(e))
            return []
        bad = [f.path for f in found if not f.ok]
        self.scrub_info.update(state="idle", finished=time.time(), files=len(found), corrupt=bad[:20],
                               seconds=round(time.monotonic() - t0, 3))
        log.info("scrub: %d files verified, %d corrupt", len(found), len(bad))
        return found

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._scrub_thread is not None:
            self._scrub_thread.join(timeout=30)
