"""What another job sees of a sealed group while it is being saved again (RS1, issue 25).

A sealed group whose files are rewritten (the same ``checkpoint-N/`` saved again after a resume
from an older step, a ``latest/`` directory saved over every time) is reopened (G10) and, while
open, listed only to its writers' job (``GroupEngine.sees``).  Hiding it from everyone else hides
a good checkpoint for the length of the re-save, and its files, isolated one by one (V1), would
show another job a mix of new and sealed files.  Instead, a process outside the writers' job sees
the group **as last sealed**, exactly as if the framework had written the new save into a
temporary directory and renamed it over the old one when done:

* the group's directory is listed;
* inside it, exactly the files of its last seal's manifest are listed and looked up (a file the
  re-save added is ENOENT), each with its sealed contents and attributes: the file at its path
  while the re-save has not replaced it, else the generation a commit kept of it
  (generations.py: every file a commit replaces in a group is kept, by default one version);
* reads are verified against the sealed record (blake3), like every committed read.

The mapping is the one a rollback of the re-save would restore (``rollback.sealed_copy``): if any
sealed file has no kept copy (``--keep-generations 0``, or unlinked by the re-save: an unlink
keeps none), there is no view, and the group is shown as before (unlisted to other jobs, its
files isolated one by one).  Once the group is sealed again everyone sees the new save.

Intent (RS1): while a re-save of a sealed group is open, a process outside its writers' job
reads no byte, size or name that is not the group's last seal.  Known limits: a sealed file
rewritten *in place* (opened for writing without ``O_TRUNC``) changes under the view until it is
closed (its bytes are the path's); and under load a reader gets ESTALE about once per 2,000-13,000
passes on the native transport (``scripts/resave_race_campaign``, docs/results/readers.md).  A
rare mixed pass (one in ~7,000-28,000) came from an open racing the install of the re-saved file:
the sealed file was checked against the path's new record and the path reopened, serving the new
file; it is checked against the sealed record now (fs.CkptFS._open_sealed).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ckptfs.backing import BackingStore
from ckptfs.engine.generations import GenEntry
from ckptfs.engine.rollback import sealed_copy
from ckptfs.engine.seals import OPEN, GroupState, SealError, read_seal
from ckptfs.records import FileRecord

MAX_CACHED = 64  # manifests kept in memory (one per group being re-saved, in practice)


class SealedView:
    """The last-sealed view of groups being re-saved (RS1); reads only, never changes the store."""

    def __init__(self, store: BackingStore, records: Mapping[str, FileRecord],
                 gens_of: Any) -> None:
        """``records``: the live record table; ``gens_of(path)``: the kept generations of a path."""
        self.store = store
        self.records = records
        self.gens_of = gens_of
        self._cache: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def applies(g: GroupState | None) -> bool:
        """Whether g is a sealed group being saved again (open, with a seal to show)."""
        return g is not None and g.state == OPEN and bool(g.manifest_blake3) and bool(g.id)

    def _manifests(self, g: GroupState) -> list[dict[str, Any]]:
        """The seals of g a view may show, in the order a rollback tries them
        (``rollback.rollback_plan``): the current one (if it is the one journaled), the one before
        it, the anchor (the last seal made by a completion event: a re-save by tmp + rename first
        reseals the group with its tmp files, G10, so the newer seals name files already gone)."""
        key = (g.id, g.manifest_blake3)
        with self._lock:
            got = self._cache.get(key)
        if got is not None:
            return got
        out: list[dict[str, Any]] = []
        journaled = False
        for which in ("", "prev", "anchor"):
            try:
                manifest, digest = read_seal(self.store, g.id, which)
            except (SealError, OSError, ValueError):
                continue
            if digest != g.manifest_blake3 and not journaled and which != "anchor":
                continue  # a half-written new seal, or a prev older than the journaled one
            journaled = journaled or digest == g.manifest_blake3
            out.append(manifest)
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[key] = out
        return out

    def files(self, g: GroupState) -> dict[str, tuple[str, FileRecord]] | None:
        """For every file of g's last seal that can be shown whole (its path under the mount
        root): the backing path that holds its sealed contents (the path itself, or a kept
        generation's name) and the record of that version.  None: no view (some sealed file of
        every candidate seal has no kept copy, or no seal can be read)."""
        for manifest in self._manifests(g):
            got = self._resolve(g, manifest)
            if got is not None:
                return got
        return None

    def _resolve(self, g: GroupState, manifest: dict[str, Any]) -> dict[str, tuple[str, FileRecord]] | None:
        pre = g.path + "/"
        out: dict[str, tuple[str, FileRecord]] = {}
        for rel, rj in manifest.get("files", {}).items():
            p = pre + rel
            got = sealed_copy(p, rj, self.records, self.gens_of)
            if got is None:
                return None
            out[p] = (got.name, got.rec) if isinstance(got, GenEntry) else (p, got)
        return out

    @staticmethod
    def names_in(files: Mapping[str, Any], d: str) -> dict[str, bool]:
        """The names directly inside directory ``d`` that the view shows: name -> is a directory."""
        pre = d + "/"
        out: dict[str, bool] = {}
        for p in files:
            if p.startswith(pre):
                rest = p[len(pre):]
                name, sep, _ = rest.partition("/")
                out[name] = out.get(name, False) or bool(sep)
        return out
