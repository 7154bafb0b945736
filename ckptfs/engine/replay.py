"""The one replay of the journal over its snapshot: committed records, groups, kept generations.

Used by recovery (at mount), by the offline verifier (``ckptfs verify`` on an unmounted directory)
and by the offline group listing (``ckptfs ls`` unmounted).  They differ only in what they do with
the journal's last entry, which may be the one in flight when the daemon stopped (I2: at most one
intent is in flight), so that is an explicit argument, ``last``:

* ``"apply"``: apply it like every other entry (the state is a hint: untrusted metadata, a listing);
* ``"hold"``: leave it out and return it as :attr:`Replayed.held` (recovery finishes or drops it on
  disk first, then calls :meth:`Replayed.apply`);
* a predicate: apply it only if ``last(entry)`` is true (the offline verifier checks the disk).

Abort entries are collected, never applied.  An entry that does not parse is reported in
``problems`` and skipped, never raised (bad metadata loses nothing that is still on disk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ckptfs.engine import quarantine as qt
from ckptfs.engine.generations import apply_gen_entry
from ckptfs.engine.rollback import OP as ROLLBACK
from ckptfs.engine.rollback import apply_rollback_state
from ckptfs.engine.seals import OPEN, SEALED, TRASHED, GroupState
from ckptfs.layout import drop_prefix, move_prefix, swap_prefix
from ckptfs.log.metadata import Loaded
from ckptfs.records import FileRecord

BATCH = "install_batch"  # an async group commit's intent (engine/commit.py C5): its ``items`` are installs


def batch_items(e: dict) -> list[dict]:
    """The installs an ``install_batch`` entry names (each checked as an install entry); raises
    one of PARSE_ERRORS for anything else, so the whole entry is untrusted."""
    items = e["items"]
    if not isinstance(items, list):
        raise TypeError("install_batch items is not a list")
    for it in items:
        if not isinstance(it, dict) or it.get("op") != "install" or "keep" in it:
            raise ValueError("install_batch item is not a plain install")
        FileRecord.from_json(it["rec"])
        if not isinstance(it["path"], str) or not isinstance(it["staging"], str):
            raise TypeError("install_batch item path or staging is not a string")
    return items


Last = Literal["apply", "hold"] | Callable[[dict], bool]
PARSE_ERRORS = (KeyError, ValueError, TypeError, AttributeError)


@dataclass
class Replayed:
    files: dict[str, FileRecord]
    groups: dict[str, GroupState]
    gens: dict[str, list[dict]]  # path -> kept generations (raw; engine/generations.reconcile checks them)
    aborts: list[dict]
    quarantine: qt.Table = field(default_factory=dict)  # kept_at -> what was moved out of sight there
    problems: list[str] = field(default_factory=list)
    held: dict | None = None  # the last entry, when ``last="hold"``
    applied: int = 0
    # group id -> (its first seal's entry, group path, rule, member records then): what recovery
    # needs to rewrite seal files written unsynced (engine/groups.py G12); a later durable reseal of
    # the group drops it
    lazy_seals: dict[str, tuple[dict, str, str, dict[str, FileRecord]]] = field(default_factory=dict)
    # both names of every replayed ``link`` entry: a user's hard links, never the remains of a
    # rename that recovery finishes (recovery.py R2)
    linked: set[str] = field(default_factory=set)

    def apply(self, e: dict) -> None:
        """Apply one entry to the records, groups, quarantine table and generations."""
        if e["op"] == BATCH:
            for item in batch_items(e):
                apply_entry(self.files, item, self.groups, self.quarantine)
            self.applied += 1
            return
        apply_entry(self.files, e, self.groups, self.quarantine)
        apply_gen_entry(self.gens, e)
        if e["op"] == "group_seal":
            self._note_seal(e)
        elif e["op"] == "link":
            self.linked.update((str(e["src"]), str(e["dst"])))
        self.applied += 1

    def _note_seal(self, e: dict) -> None:
        g = self.groups.get(e["path"])
        if g is None or not g.id:
            return
        if "lineage" not in e:
            self.lazy_seals.pop(g.id, None)  # a durable reseal: made the lazy files durable first
            return
        pre = g.path + "/"
        members = {k[len(pre):]: r for k, r in self.files.items() if k.startswith(pre)}
        self.lazy_seals[g.id] = (e, g.path, str(e.get("rule", g.rule)), members)


def load_groups(raw: dict[str, dict], problems: list[str]) -> dict[str, GroupState]:
    out: dict[str, GroupState] = {}
    for p, g in raw.items():
        try:
            out[p] = GroupState.from_json(g)
        except (TypeError, ValueError) as e:
            problems.append(f"snapshot group record for {p!r} untrusted ({e}); group forgotten")
    return out


def replay(loaded: Loaded, last: Last = "apply") -> Replayed:
    """Snapshot + journal of ``loaded`` (log/metadata.load_trusted) replayed in memory."""
    st = loaded.state
    problems = list(loaded.problems)
    groups = load_groups(st.groups, problems)
    table = qt.load(loaded.quarantine, problems)
    qt.take_legacy(groups, table)  # an older snapshot kept quarantined groups in the group table
    r = Replayed(files=st.files, groups=groups, gens=loaded.generations, aborts=list(st.aborts),
                 quarantine=table, problems=problems)
    ops = []
    for e in st.entries:
        (r.aborts if e.get("op") == "abort" else ops).append(e)
    for n, e in enumerate(ops):
        if n == len(ops) - 1 and last != "apply":
            if last == "hold":
                r.held = e
                break
            try:
                if not last(e):  # type: ignore[operator]
                    break
            except PARSE_ERRORS:
                break
        try:
            r.apply(e)
        except PARSE_ERRORS as err:
            r.problems.append(f"journal entry {n} untrusted ({err!r}); skipped")
    return r


def apply_entry(files: dict[str, FileRecord], e: dict, groups: dict[str, GroupState] | None = None,
                quarantine: qt.Table | None = None) -> None:
    """Apply a completed journal entry to the record map (and the group map, the quarantine table)."""
    op = e["op"]
    if groups is not None:
        apply_group_entry(files, groups, e, quarantine)
    if op == "install":
        files[e["path"]] = FileRecord.from_json(e["rec"])
    elif op == "unlink":
        files.pop(e["path"], None)
    elif op == "rename":
        drop_prefix(files, e["dst"])
        move_prefix(files, e["src"], e["dst"])
    elif op == "exchange":
        swap_prefix(files, e["src"], e["dst"])
    elif op in ("symlink", "mknod"):
        files.pop(e["path"], None)
    elif op == "link":
        if e["src"] in files:
            files[e["dst"]] = files[e["src"]]


def apply_group_entry(files: dict[str, FileRecord], groups: dict[str, GroupState], e: dict,
                      quarantine: qt.Table | None = None) -> None:
    """A journal entry's change of the groups (and, ``quarantine`` given, of the quarantine table:
    a quarantined group leaves the group table for it, engine/quarantine.py Q1).  Live and replay."""
    op = e["op"]
    if op == "group_open":
        prev = groups.get(e["path"])
        if prev is not None and prev.id and prev.id == e.get("id") and prev.state in (OPEN, SEALED):
            prev.state, prev.late = OPEN, bool(e.get("late", False))  # reopened after its seal (G10)
            prev.tentative, prev.rule = bool(e.get("tentative", False)), e.get("rule", prev.rule)  # evidence came
            return
        groups[e["path"]] = GroupState(path=e["path"], rule=e["rule"], id=e.get("id", ""), state=OPEN,
                                       created_at=float(e.get("time", 0)), step=e.get("step"),
                                       tentative=bool(e.get("tentative", False)))
    elif op == "group_seal":
        g = groups.get(e["path"])
        if g is not None:
            g.state, g.manifest_blake3 = SEALED, e["manifest"]
            g.marker, g.rule = str(e.get("marker", g.marker)), str(e.get("rule", g.rule))
            g.sealed_at, g.files, g.bytes = float(e.get("time", 0)), int(e.get("files", 0)), int(e.get("bytes", 0))
            g.reason = ""
    elif op in ("group_quarantine", "group_retire"):
        g = groups.get(e["path"])
        if op == "group_quarantine" and quarantine is not None:
            qt.put_group(quarantine, files, g, e)
        if g is not None:
            g.state = e.get("state", TRASHED)
            g.moved_to, g.reason = e["to"], e.get("reason", "")
            del groups[e["path"]]  # retired, or quarantined: then a row of the quarantine table
        drop_prefix(files, e["path"])
        groups_keys_under = [k for k in groups if k.startswith(e["path"] + "/")]
        for k in groups_keys_under:
            del groups[k]
    elif op == ROLLBACK:
        apply_rollback_state(files, groups, e, quarantine=quarantine)
    elif op == qt.FORGET:
        if quarantine is not None:
            qt.apply_entry(quarantine, e)
    elif op == "group_forget":
        groups.pop(e["path"], None)
    elif op == "group_restore":
        g = groups.get(e["path"])
        if g is not None and g.state == TRASHED:
            move_prefix(files, g.moved_to, g.path)
            g.state, g.moved_to, g.reason = SEALED, "", ""
    elif op == "group_trash":
        g = groups.get(e["path"])
        if g is not None:
            g.state, g.moved_to = TRASHED, e["to"]
            g.reason = "deleted while a newer group was still open"
    elif op in ("rename", "exchange"):
        live = {k: v for k, v in groups.items() if v.state in (OPEN, SEALED)}
        for k in live:
            del groups[k]
        if op == "exchange":
            swap_prefix(live, e["src"], e["dst"])
        else:
            drop_prefix(live, e["dst"])
            move_prefix(live, e["src"], e["dst"])
        for k, g in live.items():
            g.path = k
            groups[k] = g
    elif op == "rmdir":
        g = groups.get(e["path"])
        if g is not None and g.state in (OPEN, SEALED):
            del groups[e["path"]]
