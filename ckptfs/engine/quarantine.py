"""What ckptfs moved out of sight, where it keeps it, and what ``ckptfs gc`` deletes (G7, G11).

A torn or corrupt group is moved whole into ``.ckptfs/quarantine/<id>`` (G7); a torn re-save that was
rolled back to its seal leaves the files it wrote in ``.ckptfs/quarantine/<id>.resave`` (G11).  Each
is one row of the *quarantine table*, keyed by where it is kept (``kept_at``), never by the path it
was moved from: that name is usually saved again (a trainer that resumes writes ``checkpoint-N``
once more), and the new group lives in the group table, keyed by path, without touching this row.
A row says what was there (``path``, ``id``, ``step``, ``rule``), why it was moved (``state``:
torn / corrupt / resave, ``reason``), when (``time``) and how much (``files``, ``bytes``: the
records moved).

Invariants:

Q1  A row is added by the state change of the journal entry that moves the thing (``group_quarantine``,
    ``group_rollback``; :func:`put_group`, :func:`put_resave`, applied live and by replay alike) or by
    recovery before its compaction (a group torn by the crash), and persisted in the snapshot
    (``"quarantine"``) by every compaction; a snapshot of an older version, which kept a quarantined
    group in the group table under its path, is read into this table (:func:`take_legacy`).
Q2  A row goes only when its directory is gone: ``ckptfs gc`` deletes the directory, then journals
    ``quarantine_forget {to}``; recovery drops a row whose directory is missing (a gc cut short).
Q3  A row never shadows a live group nor a live group a row: the two tables have different keys, and
    no lookup of a path consults this one.
Q4  Listings and gc also report what lies under ``.ckptfs/quarantine`` with no row (``unrecorded``:
    kept by an older version that lost its record when the name was saved again) and retired groups'
    debris under ``.ckptfs/trash``: nothing gc deletes goes unreported.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from ckptfs.engine.seals import CORRUPT, TORN, GroupState, quarantine_target
from ckptfs.layout import GROUPS, QUARANTINE, TRASH, parent
from ckptfs.xattrs import VALUE_MAX

if TYPE_CHECKING:
    from ckptfs.backing import BackingStore
    from ckptfs.records import FileRecord

RESAVE = "resave"  # the files of a torn re-save, moved aside by its rollback (G11)
UNRECORDED = "unrecorded"  # under .ckptfs/quarantine with no row (Q4)
DEBRIS = "trash"  # files of a retired or deleted group left under .ckptfs/trash (gc only)
STATES = (TORN, CORRUPT, RESAVE, UNRECORDED)
FORGET = "quarantine_forget"  # journal entry: gc deleted the directory of row ``to``
SNAPSHOT_KEY = "quarantine"


@dataclass
class Quarantined:
    """One row: something moved out of sight, kept at ``kept_at`` (relative to the root) until gc."""

    kept_at: str
    path: str  # where it was (relative to the root); "" if unknown (UNRECORDED)
    state: str
    reason: str = ""
    time: float = 0.0  # when it was moved (0: unknown, an older version's record)
    id: str = ""
    rule: str = ""
    step: int | None = None
    created_at: float = 0.0
    sealed_at: float = 0.0
    files: int = 0
    bytes: int = 0
    resaves: int = 0  # RESAVE: how many torn re-saves of the group were kept here

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Quarantined:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        q = cls(**known)
        if not isinstance(q.kept_at, str) or not q.kept_at.startswith(QUARANTINE + "/") or ".." in q.kept_at:
            raise ValueError(f"bad kept_at {q.kept_at!r}")
        if not isinstance(q.path, str) or q.path.startswith("/"):
            raise ValueError(f"bad path {q.path!r}")
        return q

    def row(self) -> dict[str, Any]:
        """The presentation (``user.ckptfs.quarantine``, ``ckptfs ls --all``, gc reports): the row,
        its base name, and the keys a group row has (``moved_to``), so one listing holds both."""
        d = self.to_json()
        d["name"] = os.path.basename(self.path)
        d["moved_to"] = self.kept_at
        d["when"] = self.time
        d["when_iso"] = (time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.time)) if self.time else "")
        return d


Table = dict[str, Quarantined]


def _members(files: dict[str, FileRecord], path: str) -> tuple[int, int]:
    pre = path + "/"
    recs = [r for k, r in files.items() if k.startswith(pre)]
    return len(recs), sum(r.size for r in recs)


def put_group(table: Table, files: dict[str, FileRecord], g: GroupState | None, e: dict[str, Any]) -> Quarantined:
    """Row of a ``group_quarantine`` entry ``{path, to, state, reason, time}`` for group ``g`` (None:
    a group the replay does not know).  Call before the records under the path are dropped."""
    n, nbytes = _members(files, e["path"])
    q = Quarantined(kept_at=e["to"], path=e["path"], state=str(e.get("state", TORN)),
                    reason=str(e.get("reason", "")), time=float(e.get("time", 0)), files=n, bytes=nbytes)
    if g is not None:
        q.id, q.rule, q.step, q.created_at, q.sealed_at = g.id, g.rule, g.step, g.created_at, g.sealed_at
        if not n:
            q.files, q.bytes = g.files, g.bytes
    table[q.kept_at] = q
    return q


def put_resave(table: Table, files: dict[str, FileRecord], g: GroupState | None, e: dict[str, Any]) -> None:
    """Row of a ``group_rollback`` entry: the re-save's files it moves into ``e["to"]`` (the paths it
    removes, and the rewritten paths it restores).  Call before the records change.  A second torn
    re-save of the same group adds to the same row (its files are renamed beside the first's)."""
    moved = [files[p] for p in e.get("remove", ()) if p in files]
    moved += [files[r["path"]] for r in e.get("restore", ()) if r["path"] in files]
    q = table.get(e["to"])
    if q is None:
        if not moved:
            return  # nothing moved aside (the re-save only deleted files): nothing kept
        q = Quarantined(kept_at=e["to"], path=e["path"], state=RESAVE, id=str(e.get("id", "")))
        if g is not None:
            q.rule, q.step, q.created_at, q.sealed_at = g.rule, g.step, g.created_at, g.sealed_at
        table[q.kept_at] = q
    q.files += len(moved)
    q.bytes += sum(r.size for r in moved)
    q.resaves += 1
    q.time = float(e.get("time", 0)) or q.time
    q.reason = str(e.get("reason", "")) or q.reason or "re-save torn"


def take_legacy(groups: dict[str, GroupState], table: Table) -> None:
    """Snapshots written before the quarantine table kept a torn/corrupt group in the group table
    under its path: move such records here (Q1)."""
    for p, g in list(groups.items()):
        if g.state in (TORN, CORRUPT):
            to = g.moved_to or quarantine_target(g)
            if to not in table:
                table[to] = Quarantined(kept_at=to, path=g.path, state=g.state, reason=g.reason, id=g.id,
                                        rule=g.rule, step=g.step, created_at=g.created_at, sealed_at=g.sealed_at,
                                        files=g.files, bytes=g.bytes)
            del groups[p]


def load(raw: Any, problems: list[str]) -> Table:
    """The snapshot's table; a row that does not parse is reported and skipped."""
    out: Table = {}
    if not isinstance(raw, dict):
        if raw is not None:
            problems.append("snapshot quarantine table is not a mapping; ignored")
        return out
    for k, d in raw.items():
        try:
            q = Quarantined.from_json(d)
            if q.kept_at != k:
                raise ValueError(f"key {k!r} is not its kept_at")
            out[k] = q
        except (TypeError, ValueError, AttributeError) as e:
            problems.append(f"snapshot quarantine row {k!r} untrusted ({e}); listed as unrecorded if still on disk")
    return out


def to_json(table: Table) -> dict[str, dict[str, Any]]:
    return {k: q.to_json() for k, q in table.items()}


def apply_entry(table: Table, e: dict[str, Any]) -> None:
    """The table's own journal entry (``quarantine_forget``)."""
    if e["op"] == FORGET:
        table.pop(e["to"], None)


def reconcile(store: BackingStore, table: Table) -> list[str]:
    """Recovery: drop rows whose directory is gone (a gc cut short before its entry, Q2)."""
    gone = [k for k in table if not store.exists(k)]
    for k in gone:
        del table[k]
    return gone


# ------------------------------------------------------------------ on disk
def on_disk(store: BackingStore, top: str) -> tuple[int, int, float]:
    """(regular files, their bytes, ctime of ``top``) of the tree at ``top``; a hard link counts once."""
    try:
        st = store.lstat(top)
    except OSError:
        return 0, 0, 0.0
    if not stat.S_ISDIR(st.st_mode):
        return (1, st.st_size, st.st_ctime) if stat.S_ISREG(st.st_mode) else (0, 0, st.st_ctime)
    seen: set[int] = set()
    n = size = 0
    todo = [top]
    while todo:
        d = todo.pop()
        try:
            names = store.listdir(d)
        except OSError:
            continue
        for name in names:
            p = f"{d}/{name}"
            try:
                s = store.lstat(p)
            except OSError:
                continue
            if stat.S_ISDIR(s.st_mode):
                todo.append(p)
            elif stat.S_ISREG(s.st_mode) and s.st_ino not in seen:
                seen.add(s.st_ino)
                n += 1
                size += s.st_size
    return n, size, st.st_ctime


def _guess_path(store: BackingStore, name: str, groups: dict[str, GroupState]) -> str:
    """Where an unrecorded entry came from, if anything still says: the live group of a re-save's id,
    or the (unverified) manifest of the group id it is named after."""
    gid = name.removesuffix(".resave")
    for g in groups.values():
        if g.id == gid:
            return g.path
    try:
        fd = store.open(f"{GROUPS}/{gid}.manifest", os.O_RDONLY)
    except OSError:
        return ""
    try:
        doc = json.loads(store.pread(fd, 1 << 20, 0))
        p = doc.get("group", "") if isinstance(doc, dict) else ""
        return p if isinstance(p, str) and not p.startswith("/") else ""
    except ValueError:
        return ""
    finally:
        store.close(fd)


def unrecorded(store: BackingStore, table: Table, groups: dict[str, GroupState]) -> list[Quarantined]:
    """Entries under ``.ckptfs/quarantine`` with no row (Q4), described from the disk."""
    try:
        names = store.listdir(QUARANTINE)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        k = f"{QUARANTINE}/{name}"
        if k in table:
            continue
        n, nbytes, ctime = on_disk(store, k)
        out.append(Quarantined(kept_at=k, path=_guess_path(store, name, groups), state=UNRECORDED,
                               reason="kept in .ckptfs/quarantine without a record (an older ckptfs lost it "
                                      "when the name was saved again)",
                               time=ctime, id=name.removesuffix(".resave"), files=n, bytes=nbytes))
    return out


def rows_in(store: BackingStore, table: Table, groups: dict[str, GroupState], d: str) -> list[dict[str, Any]]:
    """What was moved out of sight from directory ``d`` (rows, then unrecorded entries whose origin is
    ``d``; those of unknown origin are listed at the root), oldest first."""
    qs = [q for q in table.values() if parent(q.path) == d and store.exists(q.kept_at)]
    qs += [q for q in unrecorded(store, table, groups) if parent(q.path) == d]
    rows = []
    for q in qs:
        if not q.time or not q.files:  # an older version's record: what is on disk, moved at its ctime
            n, nbytes, ctime = on_disk(store, q.kept_at)
            q = replace(q, time=q.time or ctime, files=q.files or n, bytes=q.bytes or nbytes)
        rows.append(q.row())
    return sorted(rows, key=lambda r: (r["time"], r["kept_at"]))


def fit_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as one xattr value (Linux: 64 KiB): the newest that fit, then ``{"omitted": N}``."""
    if len(json.dumps(rows)) <= VALUE_MAX:
        return rows
    keep = list(rows)
    while keep and len(json.dumps(keep)) > VALUE_MAX - 100:
        keep = keep[len(keep) // 8 or 1:]
    return [*keep, {"omitted": len(rows) - len(keep)}]


# ---------------------------------------------------------------------- gc
def gc_plan(store: BackingStore, table: Table, groups: dict[str, GroupState]) -> list[dict[str, Any]]:
    """What ``ckptfs gc`` deletes, each with the files and bytes on disk now: every row, every
    unrecorded entry under quarantine, and what lies under ``.ckptfs/trash`` but is not the trash of
    a deletion in progress (G9 may still put that group back)."""
    items = []
    for q in sorted(table.values(), key=lambda q: (q.time, q.kept_at)):
        n, nbytes, ctime = on_disk(store, q.kept_at)
        items.append({**q.row(), "files": n, "bytes": nbytes, "recorded": True})
    for q in unrecorded(store, table, groups):
        items.append({**q.row(), "recorded": False})
    keep = {g.moved_to for g in groups.values() if g.moved_to}
    try:
        names = sorted(store.listdir(TRASH))
    except OSError:
        names = []
    for name in names:
        k = f"{TRASH}/{name}"
        if k in keep:
            continue
        n, nbytes, ctime = on_disk(store, k)
        q = Quarantined(kept_at=k, path="", state=DEBRIS, time=ctime, id=name, files=n, bytes=nbytes,
                        reason="files of a retired or deleted group whose removal was cut short")
        items.append({**q.row(), "recorded": False})
    return items


def fit_report(rep: dict[str, Any]) -> dict[str, Any]:
    """A gc report as one xattr value: items beyond what fits are counted in ``items_omitted``."""
    if len(json.dumps(rep)) <= VALUE_MAX:
        return rep
    items = list(rep.get("items", []))
    out = dict(rep)
    while items and len(json.dumps({**out, "items": items})) > VALUE_MAX - 100:
        items = items[: len(items) * 7 // 8]
    out["items"], out["items_omitted"] = items, len(rep.get("items", [])) - len(items)
    return out


def report(items: list[dict[str, Any]], dry_run: bool, pid: int = 0) -> dict[str, Any]:
    """A gc report: what was (or, ``dry_run``, would be) deleted and the bytes freed."""
    return {"dry_run": dry_run, "time": time.time(), "pid": pid, "items": items, "groups_removed": len(items),
            "bytes_freed": sum(int(i.get("bytes", 0)) for i in items)}
