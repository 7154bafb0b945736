"""The mirror's crash-safe upload state: one small JSON file per group, fsynced on every change
(also per large file outside groups: its path as the group, ``LOOSE`` + its blake3 as the seal).

``.ckptfs/mirror/<blake3 of the group path>.json`` (in the backing directory, through the
:class:`~ckptfs.backing.BackingStore`) holds, for the group's current local seal (its manifest
digest): each file's multipart upload id and the parts the store acknowledged, each finished
object's ETag and checksum, whether this node's part manifest is up, and whether the COMMIT was
seen.  Written to a temporary name, fsynced, renamed, directory fsynced: after a crash it is the
state of the last acknowledged step or the one before.

Invariants:

U1  An upload id is journaled (durable) before its first part is sent, so a crash never leaves a
    multipart upload the resumed uploader cannot find (it also lists the store's uploads of the
    keys it owns and aborts the ones its journal does not name).
U2  A part is journaled only after the store acknowledged it; a resumed upload reconciles with
    ListParts, so a part the store holds is never sent again.
U3  State for another seal of the group (a different manifest digest) is never reused.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import blake3

from ckptfs import META_DIR
from ckptfs.engine.seals import write_durable
from ckptfs.layout import safe_rel

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore

MIRROR_DIR = f"{META_DIR}/mirror"
LOOSE = "file "  # the ``manifest`` of a loose file's state: this prefix, then its version's blake3


def _name(group: str) -> str:
    return f"{MIRROR_DIR}/{blake3.blake3(group.encode()).hexdigest()[:32]}.json"


class UploadState:
    """The journaled upload state of one group seal (see module docstring)."""

    def __init__(self, store: BackingStore, group: str, manifest: str) -> None:
        self.store, self.group, self.manifest = store, group, manifest
        self.files: dict[str, dict[str, Any]] = {}  # rel -> {"upload_id", "parts": {n: etag}, "done": {...}}
        self.part_up = False
        self.committed = False

    @classmethod
    def load(cls, store: BackingStore, group: str, manifest: str) -> UploadState:
        """The state of ``group`` for seal ``manifest``; ``manifest=""``: whatever seal it is for."""
        st = cls(store, group, manifest)
        doc = _read(store, _name(group))
        if doc is None or doc.get("group") != group or (manifest and doc.get("manifest") != manifest):
            return st  # U3: another seal's state
        try:  # a damaged or hostile state is no state (the upload starts over; issue 26)
            files = {rel: {"upload_id": str(f.get("upload_id", "")),
                           "parts": {int(n): str(e) for n, e in f.get("parts", {}).items()},
                           "done": f.get("done")} for rel, f in doc.get("files", {}).items()}
            if not all(isinstance(rel, str) and safe_rel(rel) for rel in files):
                raise ValueError("a file name outside the group")
        except (AttributeError, TypeError, ValueError):
            return st
        st.files = files
        st.part_up, st.committed = bool(doc.get("part_up")), bool(doc.get("committed"))
        return st

    def open_uploads(self) -> list[tuple[str, str]]:
        """(rel, upload id) of journaled multipart uploads not finished."""
        return [(rel, f["upload_id"]) for rel, f in self.files.items() if f.get("upload_id") and not f.get("done")]

    def save(self) -> None:
        """Make this state durable (tmp, fsync, rename, fsync the directory)."""
        store = self.store
        if not store.exists(MIRROR_DIR):
            store.mkdir(MIRROR_DIR, 0o700)
            store.fsync_dir(META_DIR)
        doc = {"group": self.group, "manifest": self.manifest, "part_up": self.part_up, "committed": self.committed,
               "files": {rel: {"upload_id": f.get("upload_id", ""), "parts": {str(n): e for n, e in f["parts"].items()},
                               "done": f.get("done")} for rel, f in self.files.items()}}
        write_durable(store, _name(self.group), json.dumps(doc, sort_keys=True).encode(), MIRROR_DIR, 0o600)

    def file(self, rel: str) -> dict[str, Any]:
        return self.files.setdefault(rel, {"upload_id": "", "parts": {}, "done": None})


def _read(store: BackingStore, name: str) -> dict[str, Any] | None:
    try:
        fd = store.open(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(store.pread(fd, store.fstat(fd).st_size, 0))
    except ValueError:
        return None  # (never written torn: tmp + rename) an unreadable file is no state
    finally:
        store.close(fd)
    return doc if isinstance(doc, dict) else None


def loose_states(store: BackingStore) -> list[str]:
    """Paths of loose files (outside groups) with a journaled upload state: multipart uploads a
    crash or an unmount cut short."""
    try:
        names = store.listdir(MIRROR_DIR)
    except FileNotFoundError:
        return []
    out = []
    for n in sorted(names):
        doc = _read(store, f"{MIRROR_DIR}/{n}") if n.endswith(".json") else None
        if (doc is not None and str(doc.get("manifest", "")).startswith(LOOSE) and doc.get("group")
                and safe_rel(doc["group"])):  # a path read from disk names a file inside, or nothing
            out.append(str(doc["group"]))
    return out


def forget(store: BackingStore, group: str) -> None:
    """Drop a group's upload state (the group is gone locally)."""
    try:
        store.unlink(_name(group))
    except FileNotFoundError:
        pass
