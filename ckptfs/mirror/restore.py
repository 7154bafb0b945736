"""``ckptfs restore s3://... DIR`` and ``ckptfs verify s3://...``: the remote half read back.

Restore (docs/mirror.md):

1. pick the newest committed remote group (step, then commit time) or the one named; read its
   COMMIT and MANIFEST and check the MANIFEST's blake3 against the COMMIT (protocol.check_commit);
2. download every file with parallel ranged GETs, checking every 1 MiB chunk against the MANIFEST
   as it arrives, and install it through the normal commit path (a ckptfs mount's, or an
   in-process filesystem over an unmounted DIR): written into a staged version, committed at
   close; completion markers last, then an explicit seal.  Into a new directory both overlap
   (:func:`stream`); over an existing one (``--replace``) everything is downloaded and verified
   into a private staging directory first.  A failed restore removes what it installed; an
   interrupted one leaves an unsealed group, which ckptfs quarantines as torn.

Invariants: R-M1 no file is committed under DIR before every chunk of it was verified against a
MANIFEST whose blake3 the COMMIT names; R-M2 with ``--replace`` nothing under DIR is touched before
every chunk of every file was.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import blake3

from ckptfs.mirror import protocol as P
from ckptfs.mirror.remote import Remote, RemoteError, crc, crc_b64
from ckptfs.rules import STEP_MARKERS

RANGE = 16 << 20  # bytes per ranged GET (a multiple of the 1 MiB chunk)


class RestoreError(Exception):
    """A restore or verify failed; the message names the group and object."""


@dataclass
class RemoteGroup:
    path: str
    commit: dict[str, Any]
    manifest: dict[str, Any] | None = None

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        assert self.manifest is not None
        return self.manifest["files"]

    @property
    def bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


def committed_groups(remote: Remote) -> list[RemoteGroup]:
    """Every committed group under the prefix (a COMMIT that parses), oldest first."""
    objs, _ = remote.list("")
    suffix = f"/{P.META}/COMMIT"
    out = []
    for o in objs:
        if o["rel"].endswith(suffix):
            path = o["rel"][: -len(suffix)]
            try:
                out.append(RemoteGroup(path, P.parse(remote.get(o["rel"]), "ckptfs-remote-commit", o["rel"])))
            except (FileNotFoundError, P.ProtocolError):
                continue  # deleted meanwhile, or not ours: not a committed group
    return sorted(out, key=lambda g: (P.order(g.commit), g.path))


def pick(groups: list[RemoteGroup], name: str | None) -> RemoteGroup:
    if not groups:
        raise RestoreError("no committed group in the store (no COMMIT under the prefix)")
    if name is None:
        return groups[-1]
    name = name.strip("/")
    hits = [g for g in groups if g.path == name] or [g for g in groups if os.path.basename(g.path) == name]
    if not hits:
        raise RestoreError(f"no committed group named {name!r} (have: {', '.join(g.path for g in groups[-5:])})")
    return hits[-1]


def load_manifest(remote: Remote, g: RemoteGroup) -> RemoteGroup:
    try:
        data = remote.get(P.manifest_key(g.path))
    except FileNotFoundError:
        raise RestoreError(f"{g.path}: COMMIT present but its MANIFEST is missing") from None
    try:
        g.manifest = P.check_commit(g.commit, data, g.path)
    except P.ProtocolError as e:
        raise RestoreError(str(e)) from None
    return g


def _check_chunks(data: bytes, f: dict[str, Any], off: int, what: str) -> None:
    cs = int(f["chunk_size"])
    mv = memoryview(data)
    for i in range(0, len(data), cs):
        k = (off + i) // cs
        if k >= len(f["chunks"]) or blake3.blake3(mv[i:i + cs]).hexdigest() != f["chunks"][k]:
            raise RestoreError(f"{what}: chunk {k} (bytes {off + i}..) does not match the MANIFEST: "
                               "the object is corrupt in the store")


def get_verified(remote: Remote, g: RemoteGroup, rel: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of file ``rel`` of ``g``, every chunk checked against the MANIFEST."""
    what = f"{g.path}/{rel}"
    if end <= start:
        return b""
    try:
        data = remote.get(P.data_key(g.path, rel), start, end)
    except FileNotFoundError:
        raise RestoreError(f"{what}: object missing from the store") from None
    if len(data) != end - start:
        raise RestoreError(f"{what}: the store returned {len(data)} bytes at {start}, expected {end - start}")
    _check_chunks(data, g.files[rel], start, what)
    return data


def download(remote: Remote, g: RemoteGroup, staging: str, threads: int = 8,
             progress: Callable[[int], None] | None = None) -> None:
    """Every file of ``g`` into ``staging`` (same relative names), every chunk verified (R-M1)."""
    jobs: list[tuple[str, int, int]] = []
    fds: dict[str, int] = {}
    try:
        for rel, f in sorted(g.files.items()):
            dst = os.path.join(staging, rel)  # (rel is confined: protocol.check_names)
            _no_links(staging, os.path.dirname(rel))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            fds[rel] = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            jobs += [(rel, off, min(off + RANGE, int(f["size"]))) for off in range(0, int(f["size"]), RANGE)]
        lock = threading.Lock()

        def get(rel: str, start: int, end: int) -> None:
            data = get_verified(remote, g, rel, start, end)
            os.pwrite(fds[rel], data, start)
            if progress:
                with lock:
                    progress(len(data))

        with cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckptfs-restore") as pool:
            futs = [pool.submit(get, *j) for j in jobs]
            for fut in cf.as_completed(futs):
                err = fut.exception()
                if err is not None:
                    for other in futs:
                        other.cancel()
                    raise err
    finally:
        for fd in fds.values():
            os.close(fd)


def _no_links(top: str, rel_dir: str) -> None:
    """RestoreError if ``top`` or a directory between it and ``top/rel_dir`` is a symbolic link: a
    restore writes nothing through a link (issue 26: files written into a linked group directory's
    target)."""
    d = top
    for part in [""] + [p for p in rel_dir.split("/") if p]:
        d = os.path.join(d, part) if part else d
        if os.path.islink(d):
            raise RestoreError(f"{d} is a symbolic link: a restore writes nothing through a link")


def _check_space(dest_dir: str, need: int) -> None:
    """RestoreError unless the filesystem of ``dest_dir`` can hold ``need`` more bytes (a MANIFEST's
    sizes are believed only as far as the disk can hold them)."""
    try:
        sv = os.statvfs(dest_dir)
    except OSError:
        return
    free = sv.f_bavail * sv.f_frsize
    if need > free:
        raise RestoreError(f"the group needs {need} bytes, {dest_dir} has {free} free: nothing written")


def install_order(files: list[str]) -> list[str]:
    """Data first, completion markers (``.metadata``, ``COMMIT``, ``trainer_state.json``...) last."""
    last = {*STEP_MARKERS, "trainer_state.json"}
    return sorted(files, key=lambda r: (os.path.basename(r) in last, r))


class Sink:
    """Where restored files are installed: the normal commit path of a mount (:class:`MountSink`)
    or of an in-process ckptfs over an unmounted directory (:class:`FsSink`).  A file is committed
    at :meth:`close` (never before all its bytes were written); :meth:`abort` drops one unclosed;
    :meth:`undo` removes every file and directory this sink made (a failed restore leaves nothing)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.made: list[str] = []  # group-relative files committed, directories made (in order)

    def mkdirs(self, rel_dir: str) -> None: ...
    def open(self, rel: str) -> Any: ...
    def write(self, h: Any, data: bytes, off: int) -> None: ...
    def close(self, h: Any) -> None: ...
    def abort(self, h: Any) -> None: ...
    def seal(self) -> None: ...
    def undo(self) -> None: ...
    def finish(self) -> None: ...


class MountSink(Sink):
    """Through a ckptfs mount: plain writes (each close commits), then ``user.ckptfs.seal``."""

    def __init__(self, group: str, dest_dir: str) -> None:
        super().__init__(group)
        self.root = os.path.join(dest_dir, group)
        self.dirs: list[str] = []
        d = self.root
        while not os.path.lexists(d):
            self.dirs.insert(0, d)
            d = os.path.dirname(d)
        for d in self.dirs:
            os.mkdir(d)

    def mkdirs(self, rel_dir: str) -> None:
        d = os.path.join(self.root, rel_dir)
        if not os.path.isdir(d):
            os.makedirs(d)
            self.dirs.append(d)

    def open(self, rel: str) -> Any:
        _no_links(self.root, os.path.dirname(rel))
        self.mkdirs(os.path.dirname(rel))
        return os.open(os.path.join(self.root, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                       0o644), rel

    def write(self, h: Any, data: bytes, off: int) -> None:
        os.pwrite(h[0], data, off)

    def close(self, h: Any) -> None:
        os.close(h[0])
        self.made.append(h[1])

    def abort(self, h: Any) -> None:
        try:
            os.unlink(os.path.join(self.root, h[1]))  # unlinked while open: its version is never committed
        finally:
            os.close(h[0])

    def seal(self) -> None:
        os.setxattr(self.root, "user.ckptfs.seal", b"1")

    def undo(self) -> None:
        for rel in reversed(self.made):
            try:
                os.unlink(os.path.join(self.root, rel))
            except OSError:
                pass
        for d in reversed(self.dirs):
            try:
                os.rmdir(d)
            except OSError:
                pass

    def finish(self) -> None:
        pass


class FsSink(Sink):
    """Through an in-process ckptfs over an unmounted directory: the same commit path as a mount."""

    def __init__(self, group: str, dest_dir: str, commit_mode: str = "async") -> None:
        from ckptfs.backing import OsBackingStore
        from ckptfs.fs import CkptFS

        super().__init__(group)
        self.store = OsBackingStore(dest_dir)
        # async: a file's durable install (fsync, rename, directory fsync) overlaps the next file's
        # download; the seal waits for every install (G5), so nothing is sealed before it is durable
        self.fs = CkptFS(self.store, housekeeping_interval=0, backing_label=dest_dir, commit_mode=commit_mode)
        self.dirs: list[str] = []
        parts = group.split("/")
        for i in range(1, len(parts) + 1):
            self._mkdir("/".join(parts[:i]))

    def _mkdir(self, d: str) -> None:
        if not self.store.exists(d):
            self.fs.mkdir(d, 0o755)
            self.dirs.append(d)

    def mkdirs(self, rel_dir: str) -> None:
        sub = rel_dir.split("/") if rel_dir else []
        for i in range(1, len(sub) + 1):
            self._mkdir(f"{self.group}/{'/'.join(sub[:i])}")

    def open(self, rel: str) -> Any:
        self.mkdirs(os.path.dirname(rel))
        return self.fs.create(f"{self.group}/{rel}", 0o644, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), rel

    def write(self, h: Any, data: bytes, off: int) -> None:
        self.fs.write(h[0], data, off)

    def close(self, h: Any) -> None:
        try:
            self.fs.flush(h[0])
        finally:
            self.fs.release(h[0])
        self.made.append(h[1])

    def abort(self, h: Any) -> None:
        self.fs.abandon(h[0])  # released, its version never committed

    def seal(self) -> None:
        self.fs.seal(self.group)
        g = self.fs.groups.get(self.group)
        if g is None or g.state != "sealed":
            raise RestoreError(f"{self.group}: restored but could not be sealed")

    def undo(self) -> None:
        for rel in reversed(self.made):
            try:
                self.fs.unlink(f"{self.group}/{rel}")
            except OSError:
                pass
        for d in reversed(self.dirs):
            try:
                self.fs.rmdir(d)
            except OSError:
                pass

    def finish(self) -> None:
        self.fs.shutdown()
        self.store.shutdown()


def _copy_into(sink: Sink, h: Any, src: str) -> None:
    with open(src, "rb") as f:
        off = 0
        while True:
            buf = f.read(8 << 20)
            if not buf:
                return
            sink.write(h, buf, off)
            off += len(buf)


def install_staged(staging: str, g: RemoteGroup, sink: Sink) -> None:
    """Every file (verified in ``staging``) through ``sink``, markers last, then the seal."""
    for rel in install_order(list(g.files)):
        h = sink.open(rel)
        try:
            _copy_into(sink, h, os.path.join(staging, rel))
        except BaseException:
            sink.abort(h)
            raise
        sink.close(h)
    sink.seal()


def stream(remote: Remote, g: RemoteGroup, sink: Sink, threads: int = 8,
           progress: Callable[[int], None] | None = None) -> None:
    """Download and install at once: ranged GETs on ``threads`` connections (at most 2 x threads
    ranges ahead), every range's chunks verified as it arrives, written in order through ``sink``;
    a file is closed (committed) only after all its ranges verified.  Any failure: the file being
    written is dropped and :meth:`Sink.undo` removes what was installed."""
    jobs = [(rel, off, min(off + RANGE, int(g.files[rel]["size"])))
            for rel in install_order(list(g.files)) for off in range(0, max(int(g.files[rel]["size"]), 1), RANGE)]

    h: Any = None
    try:
        with cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckptfs-restore") as pool:
            window: list[tuple[tuple[str, int, int], cf.Future[bytes]]] = []
            nxt = 0
            try:
                for i in range(len(jobs)):
                    while nxt < len(jobs) and nxt < i + 2 * threads:
                        window.append((jobs[nxt], pool.submit(get_verified, remote, g, *jobs[nxt])))
                        nxt += 1
                    (rel, start, end), fut = window.pop(0)
                    data = fut.result()
                    if start == 0:
                        h = sink.open(rel)
                    sink.write(h, data, start)
                    if progress:
                        progress(len(data))
                    if end >= int(g.files[rel]["size"]):
                        sink.close(h)
                        h = None
            finally:
                for _, fut in window:
                    fut.cancel()
        sink.seal()
    except BaseException:
        if h is not None:
            sink.abort(h)
        sink.undo()
        raise


def restore(remote: Remote, dest_dir: str, name: str | None = None, threads: int = 8, mounted: bool = False,
            replace: bool = False, progress_factory: Callable[[int], Any] | None = None,
            staging_root: str | None = None) -> dict[str, Any]:
    """Restore one committed group into ``dest_dir`` (see module docstring); returns a summary.

    A new directory is restored by :func:`stream`.  Over an existing one (``replace``) every byte is
    downloaded and verified into a private staging directory first (:func:`download`), so a
    corrupt object never touches the copy it would replace."""
    import time

    t0 = time.monotonic()
    g = load_manifest(remote, pick(committed_groups(remote), name))
    target = os.path.join(dest_dir, g.path)  # (g.path is confined: protocol.check_names)
    exists = os.path.lexists(target)
    if exists and not replace:
        raise RestoreError(f"{target} exists: restore into another directory, or pass --replace")
    _no_links(dest_dir, g.path)
    _check_space(dest_dir, g.bytes * (2 if exists else 1))
    bar = progress_factory(g.bytes) if progress_factory else None
    staging = ""
    t_dl = 0.0
    try:
        if exists:
            root = staging_root or (os.path.join(dest_dir, ".ckptfs") if not mounted else None)
            if root:
                os.makedirs(root, exist_ok=True)
            staging = tempfile.mkdtemp(prefix="restore-", dir=root)
            download(remote, g, staging, threads, progress=bar)
            t_dl = time.monotonic() - t0
        sink: Sink = MountSink(g.path, dest_dir) if mounted else FsSink(g.path, dest_dir)
        try:
            if exists:
                install_staged(staging, g, sink)
            else:
                stream(remote, g, sink, threads, progress=bar)
        finally:
            sink.finish()
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        if bar is not None:
            bar.finish()
    dt = time.monotonic() - t0
    return {"group": g.path, "files": len(g.files), "bytes": g.bytes, "step": g.commit.get("step"),
            "seconds": round(dt, 3), "download_seconds": round(t_dl, 3), "into": target,
            "mode": "staged" if exists else "streamed"}


def verify(remote: Remote, name: str | None = None, read_data: bool = False, threads: int = 8,
           progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Check committed groups (all, or the one named): COMMIT names the MANIFEST, every object has
    the size and checksum the COMMIT records; ``read_data``: every chunk hashed too.  One finding
    per group: {"group", "ok", "problems": [...]}."""
    groups = committed_groups(remote)
    if name is not None:
        groups = [pick(groups, name)]
    out = []
    for g in groups:
        problems: list[str] = []
        try:
            load_manifest(remote, g)
        except RestoreError as e:
            out.append({"group": g.path, "ok": False, "problems": [str(e)]})
            continue
        for rel, f in sorted(g.files.items()):
            what = f"{g.path}/{rel}"
            obj = g.commit["objects"].get(rel, {})
            h = remote.head(P.data_key(g.path, rel))
            if h is None:
                problems.append(f"{what}: object missing")
                continue
            if h["size"] != int(f["size"]) or (h["checksum"] and h["checksum"] != obj.get("checksum")):
                problems.append(f"{what}: size/checksum {h['size']}/{h['checksum']} differ from the COMMIT's "
                                f"{f['size']}/{obj.get('checksum')}")
                continue
        if read_data and not problems:
            problems += _read_all(remote, g, threads, progress)
        out.append({"group": g.path, "ok": not problems, "problems": problems, "files": len(g.files),
                    "bytes": g.bytes, "step": g.commit.get("step")})
    return out


def _read_all(remote: Remote, g: RemoteGroup, threads: int, progress: Callable[[int], None] | None) -> list[str]:
    def one(rel: str) -> str:
        f = g.files[rel]
        what = f"{g.path}/{rel}"
        c = 0
        try:
            for off in range(0, int(f["size"]), RANGE):
                data = remote.get(P.data_key(g.path, rel), off, min(off + RANGE, int(f["size"])))
                _check_chunks(data, f, off, what)
                c = crc(data, c)
                if progress:
                    progress(len(data))
        except (RestoreError, RemoteError, FileNotFoundError) as e:
            return str(e)
        if crc_b64(c) != f["checksum"]:
            return f"{what}: CRC64-NVME of the data differs from the MANIFEST's"
        return ""

    with cf.ThreadPoolExecutor(max_workers=threads) as pool:
        return [p for p in pool.map(one, sorted(g.files)) if p]

