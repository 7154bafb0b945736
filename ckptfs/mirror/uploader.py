"""The background uploader: sealed groups (and committed files outside groups) to the object store.

:class:`Mirror` subscribes to the core's events (ckptfs/events.py): ``sealed`` queues a group,
``published`` a file (the worker then uploads it only if it lies outside every group).  One worker
thread takes tasks in order; a group's files go up as whole objects (up to ``part_size``) or
multipart uploads, their parts on a pool of ``threads`` connections, at most ``threads`` parts in
memory.  The write path never waits: the subscriber only enqueues.

Per group (docs/mirror.md has the protocol step by step, with each crash point):

1. if the remote COMMIT exists for a different seal of this path, delete it first (then its
   MANIFEST): no COMMIT ever names an object being replaced;
2. upload each file, reading it through the backing store and checking every 1 MiB chunk against
   its commit record (the bytes sent are the sealed bytes, never a later or corrupt version), with
   its CRC64-NVME so the store rejects a corrupted transfer; data objects are written with
   ``If-None-Match: *`` (a 412 means an earlier attempt wrote it: HEAD confirms size and checksum);
3. put this node's part manifest; 4. publish (publish.py): MANIFEST, then COMMIT with
   ``If-None-Match: *``, once every file the group's completion record names is present.

Invariants (with protocol.py M1-M3, journal.py U1-U3):

M4  Local retention retires a sealed group only after a HEAD of its remote COMMIT succeeded
    (``GroupEngine.may_retire``); until then the group is pinned, counted, and reported in
    ``user.ckptfs.mirror``; new seals are never blocked (an alert is raised past ``pin_cap``).
M5  Uploading never changes what the mount shows, and a failure of the store is retried with
    backoff forever (state ``failed: why`` meanwhile); a group removed locally is dropped.
M6  Remote retention deletes a group's COMMIT before any of its objects.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import blake3

from ckptfs import crashpoints, events
from ckptfs.engine.seals import OPEN, SEALED, SealError, inferred_seal, read_seal
from ckptfs.layout import is_meta, parent
from ckptfs.mirror import protocol as P
from ckptfs.mirror.journal import LOOSE, UploadState, forget, loose_states
from ckptfs.mirror.publish import delete_remote_group, publish, remote_groups
from ckptfs.mirror.remote import MirrorRefused, PreconditionFailed, Remote, RemoteError, crc, crc_b64
from ckptfs.records import CHUNK_SIZE
from ckptfs.rules import TMP_DIR_RE, step_of
from ckptfs.xattrs import X_MIRROR

if TYPE_CHECKING:
    from ckptfs.fs import CkptFS

log = logging.getLogger("ckptfs.mirror")

MiB = 1 << 20
#: named crash points of the upload (CKPTFS_CRASH_AT; scripts/mirror_kill_campaign)
POINTS = (
    "mirror_upload_created",    # multipart upload created, its id not yet journaled
    "mirror_upload_journaled",  # upload id journaled, no part sent
    "mirror_mid_part",          # a part is being sent (after the first part of a file)
    "mirror_part_sent",         # a part acknowledged, not yet journaled
    "mirror_part_journaled",    # a part journaled
    "mirror_before_complete",   # every part sent, CompleteMultipartUpload not sent
    "mirror_completed",         # object complete, not yet journaled
    "mirror_object_put",        # a whole object put, group not finished
    "mirror_files_done",        # every object up, part manifest not put
    "mirror_part_put",          # part manifest up, not journaled
    "mirror_before_manifest",   # group complete remotely, MANIFEST not put
    "mirror_manifest_put",      # MANIFEST up, COMMIT not put
    "mirror_commit_put",        # COMMIT up, not journaled
    "mirror_committed",         # COMMIT journaled, local retention not yet run
    "mirror_superseding",       # an older seal's remote COMMIT deleted, its MANIFEST not yet
    "mirror_retention_commit_deleted",  # remote retention deleted a COMMIT, not its objects
    "mirror_retention_mid_delete",      # remote retention deleted some objects of a group
    "mirror_loose_put",         # a file outside groups put
    "mirror_orphans_aborted",   # startup aborted orphaned multipart uploads
    "mirror_probe_done",        # startup probe passed, nothing uploaded yet
)


NICE = int(os.environ.get("CKPTFS_MIRROR_NICE", "10"))
YIELD_S = float(os.environ.get("CKPTFS_MIRROR_YIELD_S", "20"))  # longest pause for a save in progress (0: never)


def background_priority() -> None:
    """Run the calling thread at a lower CPU priority (nice ``CKPTFS_MIRROR_NICE``, default 10): on a
    busy machine the application's next save comes first, the upload uses what is left (Linux:
    a thread's nice value is its own; elsewhere a no-op).  Measured: bench/mirror.py."""
    if NICE <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except OSError:
        pass


class Stopped(RemoteError):
    """The mount is going away: the journal resumes this upload at the next mount."""


@dataclass
class Task:
    kind: str  # "group" | "file" | "publish"
    path: str
    seq: int
    not_before: float = 0.0
    tries: int = 0
    pointer: bool = False


@dataclass
class Counters:
    bytes_uploaded: int = 0
    objects_uploaded: int = 0
    objects_skipped: int = 0  # already in the store (412 + matching HEAD)
    parts_uploaded: int = 0
    parts_skipped: int = 0  # listed by ListParts after a resume
    parts_resent: int = 0  # a journaled part the store no longer listed (never expected)
    groups_committed: int = 0
    commits_won: int = 0
    commits_lost: int = 0  # another publisher's identical COMMIT was there first
    uploads_aborted: int = 0
    remote_groups_deleted: int = 0
    failures: int = 0
    files_uploaded: int = 0  # committed files outside groups
    files_deferred: int = 0  # files in a temporary directory a framework renames into a group: never loose
    yield_s: float = 0.0  # seconds the uploader paused for saves in progress
    seal_to_commit_s: list[float] = field(default_factory=list)


class Mirror:
    """Uploads one mount's sealed groups to ``remote`` (see the module docstring)."""

    def __init__(self, fs: CkptFS, remote: Remote, node: str, part_size: int = 64 * MiB, threads: int = 8,
                 pin_cap: int = 0, remote_keep_last: int = 0, node_part: bool = False) -> None:
        if part_size % MiB or part_size < 5 * MiB:
            raise ValueError("part size must be a multiple of 1 MiB, at least 5 MiB (S3's minimum part)")
        self.fs, self.remote, self.node = fs, remote, node
        self.part_size, self.threads, self.pin_cap = part_size, threads, pin_cap
        self.remote_keep_last, self.node_part = remote_keep_last, node_part
        self.store = fs.store
        self.counters = Counters()
        self.state: dict[str, str] = {}  # group path -> user.ckptfs.mirror value
        self.confirmed: dict[str, str] = {}  # group path -> local manifest digest whose remote COMMIT was seen
        self.sealed_at: dict[str, float] = {}
        self._tasks: collections.deque[Task] = collections.deque()
        self._cv = threading.Condition()
        self._seq = 0
        self._stop = False
        self._busy = ""
        self._pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckptfs-upload",
                                           initializer=background_priority)
        self._slots = threading.BoundedSemaphore(threads)  # parts in memory
        self._worker: threading.Thread | None = None
        self._unsub: Any = None
        self.last_error = ""
        self._probe_pending = False
        self.refused = ""

    # ------------------------------------------------------------ life cycle
    def start(self, probe: bool = True) -> Mirror:
        """Probe the store (MirrorRefused propagates), then subscribe and queue the backlog: every
        sealed group (its journal says how far it got) and nothing else."""
        if probe:
            try:
                self.remote.probe()
                crashpoints.hit("mirror_probe_done")
            except MirrorRefused:
                raise
            except RemoteError as e:  # unreachable now: mount anyway, probe before the first upload
                log.warning("mirror: %s unreachable at mount (%s); uploads start when it answers",
                            self.remote.loc.url, e)
                self.last_error = f"store unreachable: {e}"
                self._probe_pending = True
        self.fs.grp.may_retire = self.may_retire
        self.fs.on_shutdown.append(self.stop)
        self.fs.attr_sources.append(self.attrs)
        self._unsub = self.fs.events.subscribe(self._on_event)
        with self.fs.lock:
            backlog = sorted((g for g in self.fs.groups.values() if g.state == SEALED), key=lambda g: g.sealed_at)
        for g in backlog:
            self.state[g.path] = "pending"
            self._enqueue("group", g.path)
        for path in loose_states(self.store):  # a loose file's multipart upload cut short: resume or abort
            self._enqueue("file", path)
        self._worker = threading.Thread(target=self._run, name="ckptfs-mirror", daemon=True)
        self._worker.start()
        log.info("mirror to %s as node %s: %d sealed groups to check or upload", self.remote.loc.url, self.node,
                 len(backlog))
        return self

    def stop(self) -> None:
        """Stop after the step in progress (the journal resumes the rest at the next mount)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._unsub:
            self._unsub()
        if self._worker is not None:
            self._worker.join(timeout=120)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.fs.on_shutdown.count(self.stop):
            self.fs.on_shutdown.remove(self.stop)
        left = [t.path for t in self._tasks if t.kind == "group"]
        if left:
            log.warning("mirror: %d groups not yet committed remotely (%s); they upload at the next mount",
                        len(left), ", ".join(left[:5]))

    def idle(self) -> bool:
        with self._cv:
            return not self._tasks and not self._busy

    # ------------------------------------------------------------ events
    def _on_event(self, ev: events.Event) -> None:
        """A subscriber: enqueue only (runs on the thread that made the change, locks held)."""
        if ev.kind == events.SEALED:
            self.state[ev.path] = "pending"
            self.sealed_at[ev.path] = time.time()
            self._enqueue("group", ev.path)
        elif ev.kind == events.PUBLISHED and not is_meta(ev.path):
            self._enqueue("file", ev.path, pointer=os.path.basename(ev.path) in self.fs.rules.pointer_names())
        elif ev.kind == events.RENAMED and ev.dst in self.fs.groups:
            self._enqueue("group", ev.dst)
        elif ev.kind in (events.REMOVED, events.QUARANTINED, events.RELEASED):
            self.state.pop(ev.path, None)

    def _enqueue(self, kind: str, path: str, delay: float = 0.0, pointer: bool = False) -> None:
        with self._cv:
            for t in self._tasks:
                if t.kind == kind and t.path == path:
                    t.not_before = min(t.not_before, time.monotonic() + delay)
                    t.tries = 0
                    self._cv.notify_all()
                    return
            self._seq += 1
            self._tasks.append(Task(kind, path, self._seq, time.monotonic() + delay, pointer=pointer))
            self._cv.notify_all()

    def _next(self) -> Task | None:
        """The first runnable task (a pointer waits for every group queued before it: a ``latest``
        is uploaded only after the groups it may name are committed remotely)."""
        with self._cv:
            while not self._stop:
                now = time.monotonic()
                wait = 1.0
                for t in self._tasks:
                    if t.pointer and any(o.kind != "file" and o.seq < t.seq for o in self._tasks):
                        continue
                    if t.not_before <= now:
                        self._tasks.remove(t)
                        self._busy = t.path
                        return t
                    wait = min(wait, t.not_before - now)
                self._cv.wait(max(0.01, wait))
            return None

    def _run(self) -> None:
        background_priority()
        while True:
            t = self._next()
            if t is None:
                return
            try:
                if self.refused:
                    raise RemoteError(self.refused)
                if self._probe_pending:
                    try:
                        self.remote.probe()
                    except MirrorRefused as e:
                        self.refused = f"store refused: {e}"
                        log.error("mirror: %s; nothing will be uploaded", e)
                        raise
                    self._probe_pending = False
                if t.kind == "group":
                    self._group(t)
                elif t.kind == "publish":
                    self._recheck(t)
                else:
                    self._file(t.path)
                if t.tries and t.kind != "publish":  # failed before, through now: the store is back
                    self._resume_backoff()
                self.last_error = ""
            except Exception as e:  # the store is down, a conflict: retry with backoff (M5)
                self.counters.failures += 1
                why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                self.last_error = why
                if not isinstance(e, (RemoteError, OSError, P.ProtocolError)):
                    log.exception("mirror: %s %s failed", t.kind, t.path)
                else:
                    log.warning("mirror: %s %s failed (retrying): %s", t.kind, t.path, why)
                if t.kind != "file" and t.path in self.state:
                    self.state[t.path] = f"failed: {why}"
                t.tries += 1
                t.not_before = time.monotonic() + min(30.0, 0.5 * 2 ** min(t.tries, 6))
                with self._cv:  # back in its place: groups keep seal order (older ones retire first)
                    self._tasks.append(t)
                    ordered = sorted(self._tasks, key=lambda o: o.seq)
                    self._tasks.clear()
                    self._tasks.extend(ordered)
            finally:
                with self._cv:
                    self._busy = ""

    def _resume_backoff(self) -> None:
        """A task that had failed went through: groups and files waiting out a backoff run now
        (most failed for the same reason, the store down; a publish keeps its own schedule)."""
        now = time.monotonic()
        with self._cv:
            for o in self._tasks:
                if o.kind != "publish" and o.tries and o.not_before > now:
                    o.not_before = now
            self._cv.notify_all()

    def _yield_to_saves(self) -> None:
        """Before reading the next part or object: while a save is in progress on this mount (a
        group open, not merely a directory made for one), wait, up to ``YIELD_S`` seconds in a row:
        the save gets the disk and CPU, the upload resumes after its seal (bench/mirror.py)."""
        if YIELD_S <= 0:
            return
        t0 = time.monotonic()
        while not self._stop and time.monotonic() - t0 < YIELD_S:
            with self.fs.lock:
                saving = any(g.state == OPEN and not g.tentative for g in self.fs.groups.values())
            if not saving:
                break
            time.sleep(0.05)
        self.counters.yield_s = round(self.counters.yield_s + time.monotonic() - t0, 3)

    # ------------------------------------------------------------ retention (M4)
    def may_retire(self, g: Any) -> bool:
        """M4: its remote COMMIT was confirmed.  With ``--node-part`` also a part superseded by a
        newer sibling committed remotely: a step no node completed (a rank died) never commits, and
        pinning it would keep every failed step forever."""
        if self.confirmed.get(g.path) == g.manifest_blake3 and bool(g.manifest_blake3):
            return True
        return self.node_part and self._newer_committed(g)

    def _newer_committed(self, g: Any) -> bool:
        """A sibling sealed on this node *after* ``g`` is committed remotely: the job went on, and
        ``g``'s missing parts will never come.  By seal time, not by step: a lower step saved again
        after higher ones (a rollback's re-run) was abandoned for the higher steps saved before it
        (issue 25), and its node never published while the others waited for it."""
        d = parent(g.path)
        with self.fs.lock:
            sibs = [s for s in self.fs.groups.values() if s is not g and s.state == SEALED and parent(s.path) == d]
        return any(s.sealed_at > g.sealed_at and self.confirmed.get(s.path) == s.manifest_blake3 for s in sibs)

    def pinned(self) -> list[tuple[str, int]]:
        with self.fs.lock:
            return [(g.path, g.bytes) for g in list(self.fs.groups.values())
                    if g.state == SEALED and not self.may_retire(g)]

    def attrs(self, path: str) -> dict[str, str]:
        """``user.ckptfs.mirror``: the root's summary (JSON), a group's upload state."""
        if path == "":
            pinned = self.pinned()
            pinned_bytes = sum(b for _, b in pinned)
            c = self.counters
            lat = sorted(c.seal_to_commit_s)
            doc = {"url": self.remote.loc.url, "node": self.node, "queue": len(self._tasks) + bool(self._busy),
                   "pinned_groups": len(pinned), "pinned_bytes": pinned_bytes, "pin_cap": self.pin_cap,
                   "alert": (f"{pinned_bytes} bytes of sealed groups not yet committed remotely exceed the cap "
                             f"({self.pin_cap})") if self.pin_cap and pinned_bytes > self.pin_cap else "",
                   "last_error": self.last_error,
                   "seal_to_commit_p50_s": lat[len(lat) // 2] if lat else None,
                   **{k: v for k, v in vars(c).items() if k != "seal_to_commit_s"}}
            return {X_MIRROR: json.dumps(doc, sort_keys=True)}
        st = self.state.get(path)
        return {X_MIRROR: st} if st else {}

    # ------------------------------------------------------------ one group
    def _sealed(self, path: str) -> tuple[Any, dict[str, Any], str] | None:
        with self.fs.lock:
            g = self.fs.groups.get(path)
        if g is None or g.state != SEALED:
            return None
        try:
            manifest, digest = read_seal(self.store, g.id)
        except SealError as e:
            raise RemoteError(f"{path}: local seal unreadable: {e}") from None
        return g, manifest, digest

    def _group(self, t: Task) -> None:
        found = self._sealed(t.path)
        if found is None:  # removed, quarantined or reopened since: nothing to upload (a new seal re-queues)
            self.state.pop(t.path, None)
            if t.path not in self.fs.groups:
                forget(self.store, t.path)
            return
        g, manifest, digest = found
        path = t.path
        st = UploadState.load(self.store, path, digest)
        if st.committed:  # journaled: confirm with a HEAD (M4)
            if self.remote.head(P.commit_key(path)) is not None:
                self._confirmed(path, digest, g)
                return
            log.warning("mirror: %s was committed but its remote COMMIT is gone (remote retention?)", path)
            self._confirmed(path, digest, g)
            return
        files: dict[str, dict[str, Any]] = manifest["files"]
        self._supersede(path, files)
        n = len(files)
        self.state[path] = f"uploading 0/{n}"
        self._abort_orphans(path, st, files)
        done: dict[str, dict[str, Any]] = {}
        futures: list[tuple[str, Any]] = []
        multipart: dict[str, dict[str, Any]] = {}
        for rel in sorted(files):
            if self._stop:
                raise Stopped("unmounting")
            rec = files[rel]
            info = self._upload_file(st, f"{path}/{rel}", P.data_key(path, rel), rec, futures, multipart, rel)
            if info is not None:
                done[rel] = info
        cf.wait([fut for _, fut in futures])  # (a failed attempt leaves nothing in flight behind it)
        for rel, fut in futures:
            r = fut.result()
            if r is not None:
                done[rel] = r
            self.state[path] = f"uploading {len(done)}/{n}"
        for rel, m in multipart.items():
            done[rel] = m["done"] if "done" in m else self._complete(st, P.data_key(path, rel), rel, m)
            self.state[path] = f"uploading {len(done)}/{n}"
        crashpoints.hit("mirror_files_done")
        entries = {rel: P.file_entry(files[rel], done[rel]["checksum"]) for rel in files}
        event = str(manifest.get("lineage", {}).get("event", ""))
        completes = not self.node_part or not inferred_seal(event)  # M3
        part = P.build_part(path, self.node, entries, completes, g.id, digest, g.step)
        self.remote.put(P.part_key(path, self.node), part)
        crashpoints.hit("mirror_part_put")
        st.part_up = True
        st.save()
        if self._publish(path, st):
            self._confirmed(path, digest, g)
        else:
            self.state[path] = "waiting for other nodes"
            self._enqueue("publish", path, delay=0.5)

    def _recheck(self, t: Task) -> None:
        found = self._sealed(t.path)
        if found is None:
            return
        g, _, digest = found
        if self._newer_committed(g):  # the job went on: this step will never be completed by another node
            self.state[t.path] = "abandoned: incomplete on the other nodes, a newer group is committed"
            log.info("mirror: %s: %s", t.path, self.state[t.path])
            return
        st = UploadState.load(self.store, t.path, digest)
        if self._publish(t.path, st):
            self._confirmed(t.path, digest, g)
        else:
            with self._cv:
                self._seq += 1
                self._tasks.append(Task("publish", t.path, self._seq,
                                        time.monotonic() + min(10.0, 0.5 * 1.5 ** min(t.tries + 1, 10)),
                                        tries=t.tries + 1))
                self._cv.notify_all()

    def _confirmed(self, path: str, digest: str, g: Any) -> None:
        first = self.confirmed.get(path) != digest
        self.confirmed[path] = digest
        self.state[path] = "committed"
        if first:
            t0 = self.sealed_at.pop(path, None)
            if t0 is not None:
                self.counters.seal_to_commit_s.append(time.time() - t0)
                del self.counters.seal_to_commit_s[:-1000]
            crashpoints.hit("mirror_committed")
            self.fs.apply_retention(parent(path))  # M4: a group retention had to keep may go now
            if self.remote_keep_last > 0:
                self._remote_retention(parent(path))

    def _supersede(self, path: str, files: dict[str, dict[str, Any]]) -> None:
        """A remote COMMIT of another seal of this path: delete it (then its MANIFEST) before any of
        its objects is replaced (M1).  Nothing to do if it already holds these very files."""
        if self.remote.head(P.commit_key(path)) is None:
            return
        try:
            manifest = P.parse(self.remote.get(P.manifest_key(path)), "ckptfs-remote-manifest", path)
            rf = manifest["files"]
            if all(rel in rf and rf[rel]["blake3"] == rec["blake3"] for rel, rec in files.items()):
                return
        except (FileNotFoundError, P.ProtocolError):
            pass
        log.info("mirror: %s was resealed locally: deleting its older remote COMMIT first", path)
        self.remote.delete(P.commit_key(path))
        crashpoints.hit("mirror_superseding")
        try:
            self.remote.delete(P.manifest_key(path))
        except FileNotFoundError:
            pass

    def _abort_orphans(self, path: str, st: UploadState, files: dict[str, Any]) -> None:
        """U1: uploads of keys this node owns that its journal does not name (created just before a
        crash) are aborted; other nodes' uploads of their own files are left alone."""
        mine = {P.data_key(path, rel) for rel in files}
        known = {uid for _, uid in st.open_uploads()}
        aborted = 0
        for rel, uid in self.remote.uploads(path + "/"):
            if rel in mine and uid not in known:
                self.remote.abort_upload(rel, uid)
                aborted += 1
        if aborted:
            self.counters.uploads_aborted += aborted
            log.info("mirror: aborted %d orphaned multipart uploads under %s", aborted, path)
            crashpoints.hit("mirror_orphans_aborted")

    # ------------------------------------------------------------ one file
    def _read_verified(self, fd: int, rec: dict[str, Any], off: int, n: int, what: str) -> bytes:
        """``n`` bytes at ``off`` (a multiple of the chunk size), each chunk checked against the record."""
        data = self.store.pread(fd, n, off)
        if len(data) != n:
            raise OSError(f"{what}: short read at {off} (the local file changed since its seal)")
        cs = int(rec.get("chunk_size", CHUNK_SIZE))
        chunks = str(rec["chunks"])
        mv = memoryview(data)
        for i in range(0, n, cs):
            k = (off + i) // cs
            if blake3.blake3(mv[i:i + cs]).hexdigest() != chunks[64 * k:64 * (k + 1)]:
                raise OSError(f"{what}: chunk {k} does not match its commit record (changed or corrupt locally): "
                              "not uploaded")
        return data

    def _upload_file(self, st: UploadState, local: str, key: str, rec: dict[str, Any], futures: list,
                     multipart: dict[str, dict[str, Any]], rel: str) -> dict[str, Any] | None:
        f = st.file(rel)
        if f.get("done"):
            return f["done"]
        size = int(rec["size"])
        fd = self.store.open(local, os.O_RDONLY)
        try:
            if size > self.part_size and not f.get("upload_id"):
                done = self._already_there(fd, key, rec, size)
                if done is not None:  # completed just before a crash (not journaled)
                    f["done"] = done
                    st.save()
                    return done
            if size <= self.part_size:
                self._yield_to_saves()
                data = self._read_verified(fd, rec, 0, size, local)
                self._slots.acquire()
                futures.append((rel, self._pool.submit(self._put_whole, key, data)))
                return None
            multipart[rel] = self._send_parts(st, fd, key, rel, rec, futures)
            return None
        finally:
            self.store.close(fd)

    def _already_there(self, fd: int, key: str, rec: dict[str, Any], size: int) -> dict[str, Any] | None:
        h = self.remote.head(key)
        if h is None or h["size"] != size:
            return None
        whole = 0
        for off in range(0, size, self.part_size):
            whole = crc(self._read_verified(fd, rec, off, min(self.part_size, size - off), key), whole)
        if h["checksum"] != crc_b64(whole):
            return None
        self.counters.objects_skipped += 1
        return {"size": size, "checksum": h["checksum"], "etag": h["etag"]}

    def _put_whole(self, key: str, data: bytes) -> dict[str, Any]:
        try:
            c = crc(data)
            want = {"size": len(data), "checksum": crc_b64(c)}
            try:
                etag = self.remote.put(key, data, if_absent=True, checksum=c)
                self.counters.objects_uploaded += 1
                self.counters.bytes_uploaded += len(data)
            except PreconditionFailed:
                etag = self._existing(key, want, lambda: self.remote.put(key, data, checksum=c))
            crashpoints.hit("mirror_object_put")
            return {**want, "etag": etag}
        finally:
            self._slots.release()

    def _existing(self, key: str, want: dict[str, Any], overwrite: Any, sends: bool = True) -> str:
        """A 412 on a data object: an earlier attempt wrote it (same size and checksum: skip), or an
        older seal (an older version of a loose file) did and no COMMIT names it any more
        (overwrite; ``sends``: the overwrite sends the bytes, not only completes an upload)."""
        h = self.remote.head(key)
        if h is not None and h["size"] == want["size"] and h["checksum"] == want["checksum"]:
            self.counters.objects_skipped += 1
            return str(h["etag"])
        group = key.rpartition("/")[0]
        if self.remote.head(P.commit_key(group)) is not None:
            raise P.ProtocolError(f"{key}: the store holds another version under a remote COMMIT")
        etag = overwrite()
        self.counters.objects_uploaded += 1
        if sends:
            self.counters.bytes_uploaded += want["size"]
        return str(etag)

    def _send_parts(self, st: UploadState, fd: int, key: str, rel: str, rec: dict[str, Any],
                    futures: list) -> dict[str, Any]:
        size = int(rec["size"])
        f = st.file(rel)
        have: dict[int, dict[str, Any]] = {}
        if f.get("upload_id"):
            try:
                have = self.remote.list_parts(key, f["upload_id"])  # U2: the store's word, not ours
            except FileNotFoundError:  # completed just before a crash (then skipped), or aborted: start over
                f["upload_id"], f["parts"] = "", {}
                done = self._already_there(fd, key, rec, size)
                if done is not None:
                    f["done"] = done
                    st.save()
                    return {"done": done}
        if not f.get("upload_id"):
            for r, uid in self.remote.uploads(key):
                if r == key:
                    self.remote.abort_upload(r, uid)
                    self.counters.uploads_aborted += 1
            f["upload_id"] = self.remote.create_upload(key)
            crashpoints.hit("mirror_upload_created")
            f["parts"] = {}
            st.save()  # U1
            crashpoints.hit("mirror_upload_journaled")
        uid = f["upload_id"]
        nparts = (size + self.part_size - 1) // self.part_size
        whole = 0
        part_crcs: dict[int, int] = {}
        etags: dict[int, str] = {}
        lock = threading.Lock()
        for n in range(1, nparts + 1):
            if self._stop:
                raise Stopped("unmounting")
            off = (n - 1) * self.part_size
            length = min(self.part_size, size - off)
            if n in have and have[n]["size"] == length:  # the store has it: read for the checksums only
                data = self._read_verified(fd, rec, off, length, key)
                c = crc(data)
                whole = crc(data, whole)
                part_crcs[n], etags[n] = c, have[n]["etag"]
                self.counters.parts_skipped += 1
                continue
            if n in f["parts"]:
                self.counters.parts_resent += 1
            self._yield_to_saves()
            self._slots.acquire()
            try:
                data = self._read_verified(fd, rec, off, length, key)
            except BaseException:
                self._slots.release()
                raise
            c = crc(data)
            whole = crc(data, whole)
            part_crcs[n] = c

            def send(n: int = n, data: bytes = data, c: int = c) -> None:
                try:
                    if n > 1:
                        crashpoints.hit("mirror_mid_part")
                    etag = self.remote.upload_part(key, uid, n, data, c)
                    self.counters.parts_uploaded += 1
                    self.counters.bytes_uploaded += len(data)
                    crashpoints.hit("mirror_part_sent")
                    with lock:
                        etags[n] = etag
                        f["parts"][n] = etag
                        st.save()
                    crashpoints.hit("mirror_part_journaled")
                finally:
                    self._slots.release()
                return None

            futures.append((rel, self._pool.submit(send)))
        return {"upload_id": uid, "etags": etags, "part_crcs": part_crcs, "whole": whole, "size": size}

    def _complete(self, st: UploadState, key: str, rel: str, m: dict[str, Any]) -> dict[str, Any]:
        crashpoints.hit("mirror_before_complete")
        want = {"size": m["size"], "checksum": crc_b64(m["whole"])}
        try:
            etag = self.remote.complete_upload(key, m["upload_id"], m["etags"], m["whole"], m["part_crcs"])
        except PreconditionFailed:
            etag = self._existing(key, want, lambda: self.remote.complete_upload(
                key, m["upload_id"], m["etags"], m["whole"], m["part_crcs"], if_absent=False), sends=False)
            self.remote.abort_upload(key, m["upload_id"])
        else:
            self.counters.objects_uploaded += 1
        crashpoints.hit("mirror_completed")
        done = {**want, "etag": etag}
        f = st.file(rel)
        f["done"] = done
        st.save()
        return done

    # ------------------------------------------------------------ publish (M1-M3)
    def _publish(self, path: str, st: UploadState) -> bool:
        how = publish(self.remote, path, self.node)
        if how:
            self.counters.groups_committed += 1
            if how == "won":
                self.counters.commits_won += 1
            elif how == "lost":
                self.counters.commits_lost += 1
            st.committed = True
            st.save()
        return bool(how)

    # ------------------------------------------------------------ files outside groups
    def _file(self, path: str) -> None:
        """A committed file outside groups, as its newest version.  Not one in a directory with the
        temporary name a framework renames into a group once its save is done (Orbax's
        ``<step>.orbax-checkpoint-tmp-<ts>``, ``tmp-checkpoint-N``): that save goes up as the
        group, under its final name, when sealed (a loose copy would be uploaded twice and never
        deleted remotely).  A file larger than a part: a multipart upload journaled as a group's
        is (U1-U3), so a crash resumes or aborts it (``start``)."""
        if any(TMP_DIR_RE.fullmatch(c) for c in path.split("/")[:-1]):
            self.counters.files_deferred += 1
            return
        with self.fs.lock:
            rec = self.fs.records.get(path)
            in_group = self.fs.grp.group_of(path) is not None
        if rec is None or in_group:
            self._drop_loose(path)
            return
        if rec.size > self.part_size:
            self._large_file(path, rec.to_json())
            return
        fd = self.store.open(path, os.O_RDONLY)
        try:
            data = self._read_verified(fd, rec.to_json(), 0, rec.size, path)
        except OSError:
            return  # replaced since (a newer version is queued by its own event)
        finally:
            self.store.close(fd)
        self.remote.put(path, data)
        self.counters.files_uploaded += 1
        self.counters.bytes_uploaded += len(data)
        crashpoints.hit("mirror_loose_put")

    def _large_file(self, path: str, rec: dict[str, Any]) -> None:
        st = UploadState.load(self.store, path, LOOSE + str(rec["blake3"]))
        rel = os.path.basename(path)
        futures: list[tuple[str, Any]] = []
        multipart: dict[str, dict[str, Any]] = {}
        try:
            if self._upload_file(st, path, path, rec, futures, multipart, rel) is None:  # (else: up already)
                cf.wait([fut for _, fut in futures])
                for _, fut in futures:
                    fut.result()
                if "done" not in multipart[rel]:
                    self._complete(st, path, rel, multipart[rel])
        except OSError:
            cf.wait([fut for _, fut in futures])  # nothing of this attempt in flight behind it
            with self.fs.lock:
                now = self.fs.records.get(path)
            if now is not None and now.blake3 == rec["blake3"]:
                raise  # the store failed, or this version rotted: retried (M5)
            self._drop_loose(path, st)  # replaced or removed since: a newer version has its own event
            return
        forget(self.store, path)
        self.counters.files_uploaded += 1
        crashpoints.hit("mirror_loose_put")

    def _drop_loose(self, path: str, st: UploadState | None = None) -> None:
        """Abort the journaled multipart upload of a loose file's older version, drop its state."""
        st = st or UploadState.load(self.store, path, "")
        for _, uid in st.open_uploads():  # (the store down: raises, the task is retried, the state kept)
            self.remote.abort_upload(path, uid)  # (gone already: nothing to do)
            self.counters.uploads_aborted += 1
        if st.files:
            forget(self.store, path)

    # ------------------------------------------------------------ remote retention (M6)
    def _remote_retention(self, d: str) -> None:
        groups = remote_groups(self.remote, d)
        committed = sorted((g for g in groups if g["commit"] is not None), key=lambda g: P.order(g["commit"]))
        keep = committed[-self.remote_keep_last:]
        if not keep:
            return
        oldest_kept = P.order(keep[0]["commit"])
        for g in groups:
            if g in keep:
                continue
            if g["commit"] is not None:
                if P.order(g["commit"]) >= oldest_kept:
                    continue
            else:  # torn remotely: only leftovers older than every kept group (a newer one may be uploading)
                s = step_of(os.path.basename(g["path"]))
                if s is None or s >= oldest_kept[0]:
                    continue
            delete_remote_group(self.remote, g["path"], g["commit"] is not None)
            self.counters.remote_groups_deleted += 1
