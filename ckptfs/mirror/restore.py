"""``ckptfs restore s3://... DIR`` and ``ckptfs verify s3://...``: the remote half read back.

Restore (docs/mirror.md):

1. pick the newest committed remote group (step, then commit time) or the one named; read its
   COMMIT and MANIFEST and check the MANIFEST's blake3 against the COMMIT (protocol.check_commit);
2. download every file with parallel ranged GETs into a private staging directory, checking every
   1 MiB chunk against the MANIFEST as it arrives: a corrupt object fails the restore, naming it,
   before anything is written to DIR;
3. install through the normal commit path (a ckptfs mount's, or an in-process filesystem over an
   unmounted DIR): each file staged, fsynced, renamed; the group sealed last (its completion
   marker written last, then an explicit seal).  An interrupted restore leaves an unsealed group,
   which ckptfs quarantines as torn: resume never sees a half-restored checkpoint.

Invariant R-M1: nothing is written under DIR unless every chunk of every file of the group was
verified against a MANIFEST whose blake3 the COMMIT names.
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


def download(remote: Remote, g: RemoteGroup, staging: str, threads: int = 8,
             progress: Callable[[int], None] | None = None) -> None:
    """Every file of ``g`` into ``staging`` (same relative names), every chunk verified (R-M1)."""
    jobs: list[tuple[str, int, int]] = []
    fds: dict[str, int] = {}
    try:
        for rel, f in sorted(g.files.items()):
            dst = os.path.join(staging, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            fds[rel] = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fds[rel], int(f["size"]))
            jobs += [(rel, off, min(off + RANGE, int(f["size"]))) for off in range(0, int(f["size"]), RANGE)]
        lock = threading.Lock()

        def get(rel: str, start: int, end: int) -> None:
            what = f"{g.path}/{rel}"
            try:
                data = remote.get(P.data_key(g.path, rel), start, end)
            except FileNotFoundError:
                raise RestoreError(f"{what}: object missing from the store") from None
            if len(data) != end - start:
                raise RestoreError(f"{what}: the store returned {len(data)} bytes at {start}, expected {end - start}")
            _check_chunks(data, g.files[rel], start, what)
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


def install_order(files: list[str]) -> list[str]:
    """Data first, completion markers (``.metadata``, ``COMMIT``, ``trainer_state.json``...) last."""
    last = {*STEP_MARKERS, "trainer_state.json"}
    return sorted(files, key=lambda r: (os.path.basename(r) in last, r))


def _copy_into(write: Callable[[bytes, int], None], src: str) -> None:
    with open(src, "rb") as f:
        off = 0
        while True:
            buf = f.read(8 << 20)
            if not buf:
                return
            write(buf, off)
            off += len(buf)


def install_mounted(staging: str, g: RemoteGroup, dest_dir: str) -> None:
    """Through a ckptfs mount: plain writes (each close commits), then ``user.ckptfs.seal``."""
    target = os.path.join(dest_dir, g.path)
    for rel in install_order(list(g.files)):
        dst = os.path.join(target, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _copy_into(lambda b, off, fd=fd: os.pwrite(fd, b, off), os.path.join(staging, rel))
        finally:
            os.close(fd)
    os.setxattr(target, "user.ckptfs.seal", b"1")


def install_unmounted(staging: str, g: RemoteGroup, dest_dir: str) -> None:
    """Through an in-process ckptfs over an unmounted directory: the same commit path as a mount."""
    from ckptfs.backing import OsBackingStore
    from ckptfs.fs import CkptFS

    store = OsBackingStore(dest_dir)
    fs = CkptFS(store, housekeeping_interval=0, backing_label=dest_dir)
    try:
        parts = g.path.split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if not store.exists(d):
                fs.mkdir(d, 0o755)
        for rel in install_order(list(g.files)):
            path = f"{g.path}/{rel}"
            sub = path.split("/")
            for i in range(len(parts) + 1, len(sub)):
                d = "/".join(sub[:i])
                if not store.exists(d):
                    fs.mkdir(d, 0o755)
            fh = fs.create(path, 0o644, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                _copy_into(lambda b, off, fh=fh: fs.write(fh, b, off), os.path.join(staging, rel))
                fs.flush(fh)
            finally:
                fs.release(fh)
        fs.seal(g.path)
        if fs.groups.get(g.path) is None or fs.groups[g.path].state != "sealed":
            raise RestoreError(f"{g.path}: restored but could not be sealed")
    finally:
        fs.shutdown()
        store.shutdown()


def restore(remote: Remote, dest_dir: str, name: str | None = None, threads: int = 8, mounted: bool = False,
            replace: bool = False, progress_factory: Callable[[int], Any] | None = None,
            staging_root: str | None = None) -> dict[str, Any]:
    """Restore one committed group into ``dest_dir`` (see module docstring); returns a summary."""
    import time

    t0 = time.monotonic()
    g = load_manifest(remote, pick(committed_groups(remote), name))
    target = os.path.join(dest_dir, g.path)
    if os.path.lexists(target) and not replace:
        raise RestoreError(f"{target} exists: restore into another directory, or pass --replace")
    root = staging_root or (os.path.join(dest_dir, ".ckptfs") if not mounted else None)
    if root:
        os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="restore-", dir=root)
    bar = progress_factory(g.bytes) if progress_factory else None
    try:
        download(remote, g, staging, threads, progress=bar)
        t_dl = time.monotonic() - t0
        (install_mounted if mounted else install_unmounted)(staging, g, dest_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if bar is not None:
            bar.finish()
    dt = time.monotonic() - t0
    return {"group": g.path, "files": len(g.files), "bytes": g.bytes, "step": g.commit.get("step"),
            "seconds": round(dt, 3), "download_seconds": round(t_dl, 3), "into": target}


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

