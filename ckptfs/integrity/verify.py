"""Verification of committed files against their records (online and offline).

Everything here reads through a :class:`BackingStore` and never writes, so it
works on an unmounted backing directory (``ckptfs verify`` / ``ckptfs scrub``)
as well as inside the daemon (verify-on-read, background scrub).

A committed file is *good* iff all of these hold (checked in this order, the
first failure is the :class:`Finding`):

1. the path exists and is a regular file                 (mechanism ``presence``)
2. its inode is the committed inode (``FileRecord.ino``)  (mechanism ``inode``)
   - ckptfs installs every version by rename, so a committed path keeps the
   inode it was staged in; another inode means the file was replaced or two
   files were swapped behind ckptfs' back;
3. its size is the committed size                         (mechanism ``size``)
4. every ``chunk_size`` (1 MiB) chunk hashes (blake3) to its recorded digest
                                                          (mechanism ``chunk digest``)
5. the whole file hashes to the recorded whole-file blake3 (mechanism ``file digest``;
   redundant with 4 unless the record itself is inconsistent).

Invariant: a Finding with ``ok=True`` is only produced after every byte of the
file was hashed and matched (``verify_fd``) -- never from metadata alone.

Group manifests (issue 3) plug in above this: a group is good iff its manifest
is trusted and ``verify_file`` is good for each member record.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import blake3

from ckptfs import META_DIR
from ckptfs.backing import BackingStore
from ckptfs.records import FileRecord

Progress = Callable[[int], None]  # called with the number of bytes just hashed


@dataclass(frozen=True)
class Finding:
    """Outcome of verifying one file.  ``kind`` is ``ok`` or what failed."""

    path: str
    ok: bool
    kind: str = "ok"  # ok | missing | not-regular | inode | size | chunk | digest | unreadable | no-permission
    mechanism: str = ""  # which check caught it (see module docstring)
    detail: str = ""
    chunk: int | None = None
    expected: str = ""
    actual: str = ""
    bytes_hashed: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    def message(self) -> str:
        if self.ok:
            return f"{self.path}: ok"
        return f"{self.path}: CORRUPT ({self.kind}): {self.detail}"


class RateLimiter:
    """Token bucket: ``take(n)`` sleeps so the long-run rate stays <= ``bytes_per_s``."""

    def __init__(self, bytes_per_s: float | None) -> None:
        self.rate = bytes_per_s if bytes_per_s and bytes_per_s > 0 else None
        self.t0 = time.monotonic()
        self.done = 0

    def take(self, n: int, stop: threading.Event | None = None) -> None:
        if self.rate is None:
            return
        self.done += n
        wait = self.t0 + self.done / self.rate - time.monotonic()
        if wait > 0:
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)


def chunk_count(rec: FileRecord) -> int:
    return (rec.size + rec.chunk_size - 1) // rec.chunk_size


def check_chunk(path: str, rec: FileRecord, index: int, data: bytes) -> Finding | None:
    """None if ``data`` is exactly chunk ``index`` of ``rec``, else the Finding."""
    start = index * rec.chunk_size
    want_len = min(rec.chunk_size, rec.size - start)
    if len(data) != want_len:
        return Finding(path, False, "size", "size", f"chunk {index} at offset {start}: read {len(data)} bytes, "
                       f"committed {want_len}", chunk=index, expected=str(want_len), actual=str(len(data)))
    got = blake3.blake3(data).hexdigest()
    want = rec.chunk_digest(index)
    if got != want:
        return Finding(path, False, "chunk", "chunk digest",
                       f"chunk {index} (bytes {start}-{start + want_len - 1}): expected blake3 {want}, actual {got}",
                       chunk=index, expected=want, actual=got)
    return None


def check_identity(path: str, st: os.stat_result, rec: FileRecord,
                   inode_owner: Callable[[int], str | None] | None = None) -> Finding | None:
    """Metadata checks (2, 3 above) of an open file's fstat against its record."""
    if not stat.S_ISREG(st.st_mode):
        return Finding(path, False, "not-regular", "presence", "not a regular file any more")
    if rec.ino and st.st_ino != rec.ino:
        other = inode_owner(st.st_ino) if inode_owner else None
        why = f"holds the inode committed for {other} (files swapped or moved)" if other else "file replaced"
        return Finding(path, False, "inode", "inode", f"{why}: inode {st.st_ino}, committed inode {rec.ino}",
                       expected=str(rec.ino), actual=str(st.st_ino))
    if st.st_size != rec.size:
        how = "truncated" if st.st_size < rec.size else "extended"
        return Finding(path, False, "size", "size", f"{how}: size {st.st_size}, committed size {rec.size}",
                       expected=str(rec.size), actual=str(st.st_size))
    return None


def verify_fd(store: BackingStore, fd: int, path: str, rec: FileRecord, *,
              progress: Progress | None = None, limiter: RateLimiter | None = None,
              stop: threading.Event | None = None,
              inode_owner: Callable[[int], str | None] | None = None) -> Finding:
    """Verify every byte of the open file ``fd`` against ``rec``."""
    bad = check_identity(path, store.fstat(fd), rec, inode_owner)
    if bad is not None:
        return bad
    whole = blake3.blake3()
    hashed = 0
    for i in range(chunk_count(rec)):
        if stop is not None and stop.is_set():
            return Finding(path, False, "unreadable", "", "verification interrupted", bytes_hashed=hashed)
        off = i * rec.chunk_size
        try:
            data = store.pread(fd, min(rec.chunk_size, rec.size - off), off)
        except OSError as e:
            return Finding(path, False, "unreadable", "read error", f"chunk {i}: {e}", chunk=i, bytes_hashed=hashed)
        hashed += len(data)
        bad = check_chunk(path, rec, i, data)
        if bad is not None:
            return Finding(**{**bad.to_json(), "bytes_hashed": hashed})
        whole.update(data)
        if progress:
            progress(len(data))
        if limiter:
            limiter.take(len(data), stop)
    if store.pread(fd, 1, rec.size):
        return Finding(path, False, "size", "size", "extended while verifying", bytes_hashed=hashed)
    got = whole.hexdigest()
    if got != rec.blake3:
        return Finding(path, False, "digest", "file digest", f"expected blake3 {rec.blake3}, actual {got}",
                       expected=rec.blake3, actual=got, bytes_hashed=hashed)
    return Finding(path, True, bytes_hashed=hashed)


def verify_file(store: BackingStore, path: str, rec: FileRecord, **kw) -> Finding:
    """Open ``path`` in the backing store and verify it (see :func:`verify_fd`)."""
    try:
        st = store.lstat(path)
    except FileNotFoundError:
        return Finding(path, False, "missing", "presence", "committed file is missing")
    if not stat.S_ISREG(st.st_mode):
        return Finding(path, False, "not-regular", "presence", "not a regular file any more")
    try:
        fd = store.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        return Finding(path, False, "unreadable", "read error", str(e))
    try:
        return verify_fd(store, fd, path, rec, **kw)
    finally:
        store.close(fd)


def inode_index(records: dict[str, FileRecord]) -> Callable[[int], str | None]:
    by_ino = {r.ino: p for p, r in records.items() if r.ino}
    return by_ino.get


# ------------------------------------------------------------ offline state
@dataclass
class OfflineState:
    """Records of an unmounted backing directory, read without changing it."""

    files: dict[str, FileRecord]
    generations: dict[str, list[dict]]
    problems: list[str]  # metadata that could not be trusted


def load_offline(store: BackingStore) -> OfflineState:
    """Snapshot + journal replayed in memory; the directory is not modified.

    The last journal intent is applied only if the disk shows it completed
    (install: the path has the intent's inode).  Untrusted metadata is reported
    in ``problems`` and skipped, never raised.
    """
    from ckptfs.engine.replay import BATCH, batch_items, replay
    from ckptfs.log.journal import Journal
    from ckptfs.log.metadata import load_trusted

    def completed(e: dict) -> bool:  # the in-flight intent counts only if the disk shows it done
        if e.get("op") == BATCH:  # (an async group commit: all of it, engine/commit.py C5)
            return all(completed(it) for it in batch_items(e))
        return e.get("op") != "install" or store.lstat(e["path"]).st_ino == FileRecord.from_json(e["rec"]).ino

    def last_done(e: dict) -> bool:
        try:
            return completed(e)
        except OSError:
            return False

    loaded = load_trusted(Journal(store))
    r = replay(loaded, last=last_done)
    files, gens, problems = r.files, r.gens, r.problems
    if loaded.state.clean:  # cleanly unmounted: the snapshot holds every record
        return OfflineState(files, gens, problems)
    from ckptfs.recovery import adopt_carried, carried_instead, classify

    owner = {rec.ino: p for p, rec in files.items() if rec.ino}
    for path, rec in list(files.items()):  # a newer install whose journal entry a power loss dropped (R1)
        try:
            st = store.lstat(path)
        except OSError:
            continue
        if classify(path, rec, st, owner) != "ok":
            newer = carried_instead(store, path, rec, st, owner, files)
            if newer is not None:
                files[path] = newer
    adopt_carried(store, files)
    return OfflineState(files, gens, problems)


def select(records: dict[str, FileRecord], prefix: str) -> dict[str, FileRecord]:
    """Records at ``prefix`` or under it ("" = all)."""
    prefix = prefix.strip("/")
    if not prefix:
        return dict(records)
    return {p: r for p, r in records.items() if p == prefix or p.startswith(prefix + "/")}


def untracked_files(store: BackingStore, records: dict[str, FileRecord], prefix: str = "") -> list[str]:
    """Regular files under ``prefix`` that have no record (written without ckptfs)."""
    out: list[str] = []
    stack = [prefix.strip("/")]
    while stack:
        d = stack.pop()
        try:
            names = store.listdir(d)
        except NotADirectoryError:
            if d not in records:
                out.append(d)
            continue
        except OSError:
            continue
        for n in names:
            p = f"{d}/{n}" if d else n
            if p == META_DIR:
                continue
            try:
                st = store.lstat(p)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(p)
            elif stat.S_ISREG(st.st_mode) and p not in records:
                out.append(p)
    return sorted(out)


class ProgressBar:
    """A one-line progress bar on stderr (bytes hashed of a known total), with rate and ETA; the
    commands enable it only on a terminal (or with --progress)."""

    def __init__(self, total: int, enabled: bool, stream=None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.label = ""
        self.last = 0.0
        self.t0 = time.monotonic()

    def set_label(self, label: str) -> None:
        self.label = label
        self.draw(force=True)

    def __call__(self, n: int) -> None:
        self.done += n
        self.draw()

    def draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.1:
            return
        self.last = now
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        rate = self.done / max(now - self.t0, 1e-6)
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_s = f"{int(eta) // 60}:{int(eta) % 60:02d}" if eta < 360000 else "--:--"
        self.stream.write(f"\r[{bar:<30}] {frac * 100:5.1f}% {self.done / 2**20:9.1f}/{self.total / 2**20:.1f} MiB "
                          f"{rate / 2**20:7.1f} MiB/s ETA {eta_s} {self.label[-32:]:<32}")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.draw(force=True)
            self.stream.write("\n")
            self.stream.flush()


def verify_many(store: BackingStore, records: dict[str, FileRecord], *, progress: ProgressBar | None = None,
                limiter: RateLimiter | None = None, stop: threading.Event | None = None,
                all_records: dict[str, FileRecord] | None = None) -> list[Finding]:
    """Verify each record (sorted by path); one Finding per file."""
    owner = inode_index(all_records if all_records is not None else records)
    out = []
    for path in sorted(records):
        if stop is not None and stop.is_set():
            break
        if progress:
            progress.set_label(path)
        out.append(verify_file(store, path, records[path], progress=progress, limiter=limiter, stop=stop,
                               inode_owner=owner))
    return out

