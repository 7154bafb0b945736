"""Checkpoint groups: state, manifest and COMMIT records.

On disk (plain files, readable without a daemon)::

    .ckptfs/groups/<id>.manifest   JSON: format, group id and path, files {rel: record}, lineage
    .ckptfs/groups/<id>.commit     JSON: format, group id, blake3 of the manifest bytes

``<id>`` is the group's identity, fixed when the group opens and journaled;
the journal/snapshot map paths to ids, so renaming a sealed group (or a
directory above it) needs no new COMMIT.  Both files are written to a
temporary name and renamed.  A group's first seal writes them without a sync of their own
(:func:`write_seal_lazy`): the journal's ``group_seal`` entry, appended with ``fdatasync``, is the
durable seal, and it holds what the files hold beyond the members' records (the lineage and the
COMMIT's time), so recovery rewrites byte-identical files from the replayed journal
(:func:`rebuild_seal`, the digest checked) until a compaction, which fsyncs them first
(``Journal.defer_durable``), drops the entries.  A reseal (:func:`write_seal`) keeps the previous
seal under second names and writes durably: manifest fsynced and renamed, ``groups`` fsynced, then
the COMMIT the same way.

Invariants:

G1  A group is *sealed* iff its COMMIT parses, names the group's id, and
    its digest equals blake3 of the manifest bytes; anything else is torn
    (no COMMIT) or corrupt (a COMMIT that does not match).
G2  A seal is durable before any later operation (a pointer naming the
    group, a deletion of an older group) is journaled: its ``group_seal`` entry is
    fdatasynced, and its files are durable or rebuildable from the journal (G12).
G3  A sealed group's manifest lists every file under the group directory
    with the record it had when sealed.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import blake3

from ckptfs import META_DIR, __version__
from ckptfs.backing import BackingStore
from ckptfs.layout import GROUPS, QUARANTINE
from ckptfs.records import FileRecord

MANIFEST_FORMAT = 1

OPEN, SEALED, TORN, CORRUPT, TRASHED = "open", "sealed", "torn", "corrupt", "trashed"


# Seal events that infer the end of a save from silence, not from a completion record the writer
# made (a marker, a pointer, a DCP .metadata): the idle timeout, an unmount while idle, a loop's
# next save (GroupEngine._seal_finished_siblings).  A node-local part of a multi-node group sealed
# by one of them never completes the group remotely (mirror M3): another node's shards may still be
# on their way.
NEXT_SAVE_EVENT = "its writer began the next save"
INFERRED_SEAL_EVENTS = ("idle", "unmount (idle)", NEXT_SAVE_EVENT)


def inferred_seal(event: str) -> bool:
    """Whether seal ``event`` (a manifest's ``lineage.event``) was inferred, not recorded."""
    return event.startswith(INFERRED_SEAL_EVENTS)


def new_group_id() -> str:
    return uuid.uuid4().hex


@dataclass
class GroupState:
    """What ckptfs knows about one group (journaled; rebuilt by recovery)."""

    path: str
    rule: str
    id: str = ""
    state: str = OPEN
    created_at: float = 0.0
    sealed_at: float = 0.0
    manifest_blake3: str = ""
    reason: str = ""  # why torn / corrupt / trashed
    moved_to: str = ""  # quarantine or trash location (under .ckptfs)
    pids: list[int] = field(default_factory=list)  # processes that wrote into it (live only)
    files: int = 0
    bytes: int = 0
    step: int | None = None
    late: bool = False  # reopened only by files added after its seal: its sealed files are untouched
    seal_requested: str = ""  # a completion event seen while files were still open (live only)
    last_activity: float = 0.0  # live only
    corrupt: str = ""  # a file failed verification; quarantined by the next sweep (live only)
    written: bool = False  # a file was ever created in it (live only)
    marker: str = ""  # the completion marker that sealed it (siblings of its layout then wait for one)
    tentative: bool = False  # opened at mkdir of a directory a rule names, no evidence yet (issue 10)
    made_by_writer: bool = False  # tentative, made by a writer of a sibling group (live only)
    refused: dict[str, str] = field(default_factory=dict)  # incomplete files refused at close (live only)
    moved_on: bool = False  # a writer of it began a newer sibling group afterwards (live only, issue 25)
    sids: set[int] = field(default_factory=set)  # process sessions of its writers: its job (live only)

    @property
    def order(self) -> tuple[int, float]:
        """Which of two sibling groups is newer: the higher step (none: -1), then the later seal.
        The one ordering retention, G9 deletions and recovery use."""
        return (self.step if self.step is not None else -1, self.sealed_at)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for live_only in ("pids", "seal_requested", "last_activity", "corrupt", "written", "made_by_writer",
                          "refused", "moved_on", "sids"):
            d.pop(live_only)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupState:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def lineage(step: int | None, parent_group: str | None, pid: int, created_at: float) -> dict[str, Any]:
    """Where a group came from (stored in its manifest)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        cmdline = []
    return {
        "step": step, "parent": parent_group, "host": socket.gethostname(), "pid": pid,
        "cmdline": cmdline, "ckptfs_version": __version__, "created_at": created_at,
        "sealed_at": time.time(),
    }


def build_manifest(gid: str, path: str, rule: str, files: dict[str, FileRecord], lin: dict[str, Any]) -> bytes:
    doc = {
        "format": MANIFEST_FORMAT, "kind": "ckptfs-manifest", "id": gid, "group": path, "rule": rule,
        "files": {rel: rec.to_json() for rel, rec in sorted(files.items())},
        "lineage": lin,
    }
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def build_commit(gid: str, manifest: bytes, sealed_at: float | None = None) -> bytes:
    doc = {"format": MANIFEST_FORMAT, "kind": "ckptfs-commit", "id": gid,
           "manifest_blake3": blake3.blake3(manifest).hexdigest(),
           "sealed_at": time.time() if sealed_at is None else sealed_at}
    return json.dumps(doc, sort_keys=True).encode()


def write_durable(store: BackingStore, name: str, data: bytes, directory: str = GROUPS, mode: int = 0o644) -> None:
    """``name`` holds ``data`` durably: written to ``name.tmp``, fsynced, renamed, ``directory`` fsynced."""
    tmp = name + ".tmp"
    fd = store.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        off = 0
        while off < len(data):
            off += store.pwrite(fd, data[off:], off)
        store.fsync(fd)
    finally:
        store.close(fd)
    store.rename(tmp, name)
    store.fsync_dir(directory)


def write_seal(store: BackingStore, gid: str, manifest: bytes) -> str:
    """Durably write manifest then COMMIT for group ``gid``; return the manifest digest.

    Resealing keeps the previous seal readable (:func:`read_seal` ``prev=True``) under second names
    made durable first: until the new seal is journaled, a torn re-save is rolled back to it."""
    if not store.exists(GROUPS):
        store.mkdir(GROUPS, 0o700)
        store.fsync_dir(META_DIR)
    if store.exists(f"{GROUPS}/{gid}.commit"):
        try:
            read_seal(store, gid)
        except SealError:
            pass  # a seal that does not verify is no previous seal
        else:
            for suffix in (".commit", ".manifest"):
                prev = f"{GROUPS}/{gid}.prev{suffix}"
                if store.exists(prev):
                    store.unlink(prev)
                store.link(f"{GROUPS}/{gid}{suffix}", prev)
            store.fsync_dir(GROUPS)
    write_durable(store, f"{GROUPS}/{gid}.manifest", manifest)
    commit = build_commit(gid, manifest)
    write_durable(store, f"{GROUPS}/{gid}.commit", commit)
    return json.loads(commit)["manifest_blake3"]


SEAL_SUFFIXES = (".manifest", ".commit")


def seal_names(gid: str, anchor: bool) -> list[str]:
    """The files a lazy first seal of ``gid`` writes (with ``anchor``: its anchor names too)."""
    names = [f"{GROUPS}/{gid}{s}" for s in SEAL_SUFFIXES]
    return names + [f"{GROUPS}/{gid}.anchor{s}" for s in SEAL_SUFFIXES] if anchor else names


def _write_named(store: BackingStore, name: str, data: bytes, mode: int = 0o644) -> None:
    """``name`` holds ``data`` (written to ``name.tmp`` and renamed; nothing synced)."""
    tmp = name + ".tmp"
    if store.exists(tmp):
        store.unlink(tmp)  # a second name of a file a power loss left (never write through it)
    fd = store.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        off = 0
        while off < len(data):
            off += store.pwrite(fd, data[off:], off)
    finally:
        store.close(fd)
    store.rename(tmp, name)


def write_seal_lazy(store: BackingStore, gid: str, manifest: bytes, sealed_at: float, anchor: bool) -> str:
    """A group's first seal (G12): manifest, then COMMIT (then, ``anchor``, both linked as the
    anchor), written and renamed without a sync.  The caller journals the ``group_seal`` entry with
    ``fdatasync`` right after (the durable seal) and defers these files' durability to the next
    compaction; until then recovery rebuilds them (:func:`rebuild_seal`).  Returns the digest."""
    if not store.exists(GROUPS):
        store.mkdir(GROUPS, 0o700)
        store.fsync_dir(META_DIR)
    _write_named(store, f"{GROUPS}/{gid}.manifest", manifest)
    _write_named(store, f"{GROUPS}/{gid}.commit", build_commit(gid, manifest, sealed_at))
    if anchor:
        keep_anchor(store, gid, sync=False)
    return blake3.blake3(manifest).hexdigest()


def rebuild_seal(store: BackingStore, gid: str, path: str, rule: str, files: dict[str, FileRecord],
                 entry: dict[str, Any], which: tuple[str, ...] = ("",)) -> list[str]:
    """G12: rewrite, durably, the seal files of ``gid`` named by ``which`` ("" its seal, "anchor"
    its anchor) from its journaled ``group_seal`` ``entry`` (lineage, time, digest) and its
    members' records at that entry (``files``, relative paths), where they do not verify against
    the entry's digest (lost to a power loss before the compaction that would have synced them).
    Only a manifest whose blake3 is the journaled digest is written, so the files are
    byte-identical to the lost ones.  Returns which were rewritten."""
    want = entry.get("manifest")
    lin = entry.get("lineage")
    if not isinstance(lin, dict) or not isinstance(want, str):
        return []
    todo = []
    for w in which:
        try:
            _m, got = read_seal(store, gid, w)
        except SealError:
            got = ""
        if got != want:
            todo.append(w)
    if not todo:
        return []
    manifest = build_manifest(gid, path, rule, files, lin)
    if blake3.blake3(manifest).hexdigest() != want:
        return []
    commit = build_commit(gid, manifest, float(entry.get("time", 0)))
    if not store.exists(GROUPS):
        store.mkdir(GROUPS, 0o700)
        store.fsync_dir(META_DIR)
    for w in todo:
        key = f"{gid}.{w}" if w else gid
        write_durable(store, f"{GROUPS}/{key}.manifest", manifest)
        write_durable(store, f"{GROUPS}/{key}.commit", commit)
    return todo


def keep_anchor(store: BackingStore, gid: str, sync: bool = True) -> None:
    """After a seal by a completion event: keep it as ``<id>.anchor.*``, the rollback target of last
    resort (G11).  Reseals for files added later (G10) leave the anchor alone, so a re-save that
    first added its tmp files still finds the checkpoint as the framework completed it."""
    for suffix in (".manifest", ".commit"):  # manifest first: an anchor COMMIT never names a missing one
        src, dst = f"{GROUPS}/{gid}{suffix}", f"{GROUPS}/{gid}.anchor{suffix}"
        if store.exists(dst + ".tmp"):
            store.unlink(dst + ".tmp")
        store.link(src, dst + ".tmp")
        store.rename(dst + ".tmp", dst)
    if sync:
        store.fsync_dir(GROUPS)


def remove_seal(store: BackingStore, gid: str) -> None:
    """Delete a group's COMMIT (first) and manifest; a missing one is fine."""
    for suffix in (".commit", ".manifest", ".prev.commit", ".prev.manifest", ".anchor.commit", ".anchor.manifest"):
        try:
            store.unlink(f"{GROUPS}/{gid}{suffix}")
        except FileNotFoundError:
            pass


def _read_all(store: BackingStore, name: str) -> bytes:
    fd = store.open(name, os.O_RDONLY)
    try:
        size = store.fstat(fd).st_size
        return store.pread(fd, size, 0)
    finally:
        store.close(fd)


class SealError(Exception):
    """A group's manifest/COMMIT is missing or does not verify."""


def read_seal(store: BackingStore, gid: str, prev: bool | str = False) -> tuple[dict[str, Any], str]:
    """Return (verified manifest, its blake3) of group ``gid``; raise SealError saying what is wrong (G1).
    ``prev``: True or "prev" for the seal before the latest reseal (kept by :func:`write_seal`),
    "anchor" for the last seal made by a completion event (:func:`keep_anchor`)."""
    which = "prev" if prev is True else prev or ""
    key = f"{gid}.{which}" if which else gid
    try:
        commit_b = _read_all(store, f"{GROUPS}/{key}.commit")
    except FileNotFoundError:
        raise SealError("no COMMIT record") from None
    try:
        manifest_b = _read_all(store, f"{GROUPS}/{key}.manifest")
    except FileNotFoundError:
        raise SealError("COMMIT present but manifest missing") from None
    try:
        commit = json.loads(commit_b)
        if commit.get("kind") != "ckptfs-commit" or commit.get("format") != MANIFEST_FORMAT:
            raise SealError(f"COMMIT has unknown kind/format {commit.get('kind')}/{commit.get('format')}")
    except (ValueError, AttributeError):
        raise SealError("COMMIT record unreadable (truncated or corrupt)") from None
    got = blake3.blake3(manifest_b).hexdigest()
    if commit.get("manifest_blake3") != got:
        raise SealError(f"manifest digest mismatch: COMMIT says {commit.get('manifest_blake3')}, manifest is {got}")
    if commit.get("id") != gid:
        raise SealError(f"COMMIT names group {commit.get('id')!r}, not {gid!r}")
    try:
        manifest = json.loads(manifest_b)
    except ValueError:
        raise SealError("manifest unreadable") from None
    if manifest.get("id") != gid or not isinstance(manifest.get("files"), dict):
        raise SealError("manifest does not describe this group")
    return manifest, got


def quarantine_target(g: GroupState) -> str:
    """Where a torn or corrupt group is moved (``.ckptfs/quarantine/<id>``)."""
    return f"{QUARANTINE}/{g.id or int(g.created_at * 1000)}"
