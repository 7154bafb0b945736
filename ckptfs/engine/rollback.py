"""Rolling a torn re-save of a sealed group back to its last seal (G11).

A sealed group whose files are rewritten (a re-save into ``checkpoint-N``, a
custom ``latest/`` directory saved over every time) is reopened (G10).  If the
re-save never completes, the group used to be quarantined whole, taking the
last good copy with it.  Every file a commit replaced is kept as a generation
(generations.py), so the sealed state can be put back instead:

* *plan* (:func:`rollback_plan`): for every file of the last manifest, its
  current record if unchanged, else the kept generation with the manifest's
  blake3; files the manifest does not list are moved aside.  If any listed
  file has no such generation (not kept: ``--keep-generations 0``, a rename
  over it, a power loss that lost the unsynced link), there is no plan and the
  group is quarantined as before;
* the plan is one journal entry ``group_rollback {path, to, restore, remove}``,
  made durable before any change (the single in-flight entry of the protocol);
* *apply* (:func:`apply_rollback`, idempotent, used live and by recovery to
  finish an interrupted one): each rewritten or added file is renamed into
  ``to`` (``.ckptfs/quarantine/<id>.resave/``: nothing is deleted), each kept
  generation is hard-linked back to its path and its generation name removed,
  with a directory fsync after each step, so no version is ever without a
  durable name;
* *state* (:func:`apply_rollback_state`): records of restored files become the
  kept records, moved-aside ones go, the generations used leave the table, and
  the group is sealed again under its old, still valid COMMIT.

Invariant: after a rollback the group holds exactly the files of its last
manifest with their sealed contents, so its COMMIT verifies again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptfs.backing import BackingStore
from ckptfs.engine.generations import GenEntry
from ckptfs.engine.quarantine import Table, put_resave
from ckptfs.engine.seals import OPEN, SEALED, GroupState, SealError, read_seal
from ckptfs.layout import GEN_DIR, GROUPS, QUARANTINE
from ckptfs.records import FileRecord

OP = "group_rollback"


def resave_target(g: GroupState) -> str:
    return f"{QUARANTINE}/{g.id}.resave"


def sealed_copy(p: str, rj: dict[str, Any], files: Mapping[str, FileRecord],
                gens_of: Callable[[str], Sequence[GenEntry]]) -> FileRecord | GenEntry | None:
    """Where the sealed version of file ``p`` (its manifest entry ``rj``) is now: its current record
    if the path still holds it, else the kept generation with its blake3, else None (gone).  The one
    rule a rollback plan (G11) and the last-seal view of a re-save (RS1, sealedview.py) share."""
    cur = files.get(p)
    if cur is not None and cur.blake3 == rj.get("blake3") and cur.size == rj.get("size"):
        return cur
    return next((x for x in gens_of(p) if x.rec.blake3 == rj.get("blake3")), None)


def _plan_for(manifest: dict[str, Any], files: dict[str, FileRecord], gens: dict[str, list[GenEntry]],
              pre: str) -> tuple[list[dict[str, Any]], list[str]] | None:
    restore = []
    for rel, rj in sorted(manifest["files"].items()):
        p = pre + rel
        got = sealed_copy(p, rj, files, lambda q: gens.get(q, ()))
        if got is None:
            return None
        if isinstance(got, GenEntry):
            restore.append({"path": p, "name": got.name, "rec": got.rec.to_json()})
    listed = {pre + rel for rel in manifest["files"]}
    return restore, sorted(k for k in files if k.startswith(pre) and k not in listed)


def rollback_plan(store: BackingStore, files: dict[str, FileRecord], gens: dict[str, list[GenEntry]],
                  g: GroupState, reason: str = "") -> dict[str, Any] | None:
    """The ``group_rollback`` entry that puts ``g`` back to its last seal it can rebuild, or None.

    Tried in order: the current seal (if it is the one journaled); the previous one (kept by
    ``write_seal``; the journaled one when a crash hit the re-save's own seal); the anchor, the
    last seal by a completion event (``keep_anchor``): a re-save by tmp + rename first adds its
    tmp files, resealing the group with them (G10), then replaces sealed files, so the newer
    seals name tmp files that no longer exist."""
    if not g.manifest_blake3 or not g.id:
        return None  # never sealed: nothing to go back to
    journaled = False
    for which in ("", "prev", "anchor"):
        try:
            manifest, digest = read_seal(store, g.id, which)
        except (SealError, OSError):
            continue
        if digest != g.manifest_blake3 and not journaled and which != "anchor":
            continue  # a half-written new seal, or a prev older than the journaled seal it should be
        journaled = journaled or digest == g.manifest_blake3
        plan = _plan_for(manifest, files, gens, g.path + "/")
        if plan is not None:
            return {"op": OP, "path": g.path, "id": g.id, "seal": which or "current",
                    "manifest": digest, "files": len(manifest["files"]),
                    "bytes": sum(int(r.get("size", 0)) for r in manifest["files"].values()),
                    "to": resave_target(g), "restore": plan[0], "remove": plan[1],
                    "reason": reason, "time": time.time()}
    return None


def _makedirs(store: BackingStore, d: str, made: set[str]) -> None:
    if not d or store.exists(d):
        return
    _makedirs(store, os.path.dirname(d), made)
    store.mkdir(d, 0o700)
    made.add(os.path.dirname(d))


def apply_rollback(store: BackingStore, e: dict[str, Any]) -> bool:
    """Carry out a ``group_rollback`` entry on disk; idempotent (a crash anywhere, then again).
    True if it now holds; False if a kept generation it needs is gone (lost to a power loss before
    the plan was made durable): then the entry must not be applied and the group is quarantined.

    Every kept version always has a durable name: a rewritten file is renamed aside and both its
    directories fsynced before its path is reused; a kept generation is *linked* back to its path,
    that directory fsynced, and only then its generation name unlinked (a rename across the two
    directories could lose both names under weak persistence: found by the model checker)."""
    path, to = e["path"], e["to"]
    dirty: set[str] = set()

    def aside(p: str) -> None:
        dst = f"{to}/{p[len(path) + 1:]}"
        try:
            st = store.lstat(p)
        except FileNotFoundError:
            return
        try:
            if store.lstat(dst).st_ino == st.st_ino:
                store.unlink(p)  # a half-persisted earlier move left both names
                store.fsync_dir(os.path.dirname(p))
                return
        except FileNotFoundError:
            pass
        made: set[str] = set()
        _makedirs(store, os.path.dirname(dst), made)
        for d in sorted(made, key=len, reverse=True):
            store.fsync_dir(d)
        n = 1
        while store.exists(dst):  # never replace what an earlier run moved aside
            dst = f"{to}/{p[len(path) + 1:]}.{n}"
            n += 1
        store.rename(p, dst)
        store.fsync_dir(os.path.dirname(dst))
        store.fsync_dir(os.path.dirname(p))

    for r in e["restore"]:
        p, name = r["path"], r["name"]
        ino = FileRecord.from_json(r["rec"]).ino
        try:
            here = store.lstat(p).st_ino
        except FileNotFoundError:
            here = None
        if here != ino:
            if not store.exists(name):
                continue  # nothing to put back (lost: recovery's classify drops the record)
            aside(p)
            store.link(name, p)
            store.fsync_dir(os.path.dirname(p))
        if store.exists(name):
            store.unlink(name)
            dirty.add(os.path.dirname(name))
    for p in e["remove"]:
        aside(p)
    if e.get("seal") in ("prev", "anchor"):  # an older seal becomes the current one again
        for suffix in (".manifest", ".commit"):  # manifest first: a COMMIT never names a missing manifest
            src, dst = f"{GROUPS}/{e['id']}.{e['seal']}{suffix}", f"{GROUPS}/{e['id']}{suffix}"
            if store.exists(src) and not _same_inode(store, src, dst):
                if store.exists(dst + ".tmp"):
                    store.unlink(dst + ".tmp")
                store.link(src, dst + ".tmp")
                store.rename(dst + ".tmp", dst)
        dirty.add(GROUPS)
    for d in sorted(dirty, key=len, reverse=True):
        if store.exists(d):
            store.fsync_dir(d)
    for r in e["restore"]:
        try:
            if store.lstat(r["path"]).st_ino != FileRecord.from_json(r["rec"]).ino:
                return False
        except FileNotFoundError:
            return False
    return True


def _same_inode(store: BackingStore, a: str, b: str) -> bool:
    try:
        return store.lstat(a).st_ino == store.lstat(b).st_ino
    except FileNotFoundError:
        return False


def make_durable(store: BackingStore) -> None:
    """The generation links a plan relies on are not fsynced when made (generations.py): fsync their
    directory before the plan is journaled, so a power loss cannot take them afterwards."""
    store.fsync_dir(GEN_DIR)


def apply_rollback_state(files: dict[str, FileRecord], groups: dict[str, GroupState], e: dict[str, Any],
                         gens: dict[str, list] | None = None, quarantine: Table | None = None) -> None:
    """The record/group/generation changes of a completed ``group_rollback`` entry, and the
    quarantine row of the files it moved aside (engine/quarantine.py).

    ``gens`` maps a path to generation entries (GenEntry or raw JSON dicts)."""
    if quarantine is not None:
        put_resave(quarantine, files, groups.get(e["path"]), e)
    for r in e["restore"]:
        files[r["path"]] = FileRecord.from_json(r["rec"])
        if gens is not None and r["path"] in gens:
            left = [x for x in gens[r["path"]] if (x.name if isinstance(x, GenEntry) else x.get("name")) != r["name"]]
            if left:
                gens[r["path"]] = left
            else:
                del gens[r["path"]]
    for p in e["remove"]:
        files.pop(p, None)
        if gens is not None:
            gens.pop(p, None)
    g = groups.get(e["path"])
    if g is not None and g.state in (OPEN, SEALED):
        g.state, g.late, g.reason, g.seal_requested = SEALED, False, "", ""
        g.manifest_blake3 = e.get("manifest", g.manifest_blake3)
        g.files, g.bytes = int(e.get("files", g.files)), int(e.get("bytes", g.bytes))
