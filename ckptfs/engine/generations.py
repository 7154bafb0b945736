"""Previous committed generations of overwritten files (rollback targets).

When a commit replaces a path that already has a committed version, ckptfs
keeps the replaced version as a hard link ``.ckptfs/generations/<uuid>``
(no copy: the old inode simply stays alive) together with its
:class:`FileRecord`, up to ``keep`` generations per path, newest first.

Protocol (inside the install of the new version, under the commit lock):

1. the install intent carries ``keep = {"name": <gen file>, "rec": <old record>}``
   and is made durable first (as every intent);
2. ``link(path, name)`` - the old version gets a second name;
3. ``rename(staging, path)`` - the new version is installed.

Recovery replays ``keep`` from the journal like the record map, and then
*reconciles* with the disk: a generation whose file is missing or has another
inode/size is dropped, a file in ``generations/`` that no record references is
deleted.  The link is not fsynced on its own (that would cost a directory
fsync per overwrite); after power loss a generation may therefore be missing
and is dropped, never wrong: every generation is verified against its record
before it is served.

Invariants: a generation entry always describes the bytes of an earlier
committed version of the same path; generations follow their path through
renames made via the mount and are deleted with it (unlink, or a rename of a
directory over it); a committed file replaced by a rename of another committed
file is kept like an overwritten one (the rename's intent carries ``keep``);
pruning beyond ``keep`` only deletes files, and recovery tolerates a crash
anywhere in between.
"""

from __future__ import annotations

import logging
import stat
import uuid
from dataclasses import dataclass

from ckptfs import META_DIR
from ckptfs.backing import BackingStore
from ckptfs.layout import GEN_DIR, swap_prefix
from ckptfs.records import FileRecord

log = logging.getLogger("ckptfs.generations")


@dataclass(frozen=True)
class GenEntry:
    name: str  # backing path of the kept file, under GEN_DIR
    rec: FileRecord

    def to_json(self) -> dict:
        return {"name": self.name, "rec": self.rec.to_json()}


def _drop_prefix(table: dict, path: str) -> list:
    pre = path + "/"
    gone = []
    for k in [k for k in table if k == path or k.startswith(pre)]:
        gone.extend(table.pop(k))
    return gone


def _move_prefix(table: dict, src: str, dst: str) -> None:
    pre = src + "/"
    for k in [k for k in table if k == src or k.startswith(pre)]:
        table[dst + k[len(src):]] = table.pop(k)


def apply_gen_entry(table: dict[str, list[dict]], e: dict) -> None:
    """Replay one completed journal entry into a raw generation table."""
    op = e["op"]
    if op == "install" and e.get("keep"):
        keep = e["keep"]
        if not isinstance(keep, dict) or not str(keep.get("name", "")).startswith(GEN_DIR + "/"):
            raise ValueError("bad keep fragment")
        table.setdefault(e["path"], []).insert(0, keep)
    elif op == "group_rollback":  # rollback.py: the generations put back leave the table
        for r in e["restore"]:
            left = [g for g in table.get(r["path"], []) if g.get("name") != r["name"]]
            if left:
                table[r["path"]] = left
            else:
                table.pop(r["path"], None)
        for p in e["remove"]:
            table.pop(p, None)
    elif op in ("unlink", "symlink", "mknod"):
        _drop_prefix(table, e["path"])
    elif op == "link":
        _drop_prefix(table, e["dst"])
    elif op == "rename" and e.get("keep"):  # a committed file replaced by a rename: its history goes on
        keep = e["keep"]
        if not isinstance(keep, dict) or not str(keep.get("name", "")).startswith(GEN_DIR + "/"):
            raise ValueError("bad keep fragment")
        history = table.pop(e["dst"], [])
        _drop_prefix(table, e["src"])
        table[e["dst"]] = [keep, *history]
    elif op == "rename":
        _drop_prefix(table, e["dst"])
        _move_prefix(table, e["src"], e["dst"])
    elif op == "exchange":
        swap_prefix(table, e["src"], e["dst"])


def reconcile(store: BackingStore, raw: dict) -> tuple[dict[str, list[GenEntry]], list[str]]:
    """Keep only generations whose file is on disk as recorded; delete orphans.

    Returns (table, problems).  Idempotent."""
    if not store.exists(GEN_DIR):
        store.mkdir(GEN_DIR, 0o700)
        store.fsync_dir(META_DIR)
    problems: list[str] = []
    table: dict[str, list[GenEntry]] = {}
    for path, entries in (raw.items() if isinstance(raw, dict) else []):
        good = []
        for g in entries if isinstance(entries, list) else []:
            try:
                ent = GenEntry(str(g["name"]), FileRecord.from_json(g["rec"]))
                if not ent.name.startswith(GEN_DIR + "/") or "/" in ent.name[len(GEN_DIR) + 1:]:
                    raise ValueError("bad generation name")
            except (KeyError, ValueError, TypeError) as e:
                problems.append(f"generation record of {path!r} untrusted ({e}); dropped")
                continue
            try:
                st = store.lstat(ent.name)
            except OSError:
                continue  # link lost (power loss) or pruned before a crash
            if stat.S_ISREG(st.st_mode) and st.st_ino == ent.rec.ino and st.st_size == ent.rec.size:
                good.append(ent)
        if good:
            table[path] = good
    referenced = {g.name for gs in table.values() for g in gs}
    for name in store.listdir(GEN_DIR):
        if f"{GEN_DIR}/{name}" not in referenced:
            store.unlink(f"{GEN_DIR}/{name}")
    return table, problems


class Generations:
    """Live generation table of a mounted filesystem.  Callers hold the commit lock
    for every mutating method (they run inside journaled operations).

    The table methods also run under the facade's ``lock`` (with the records they follow), so they
    never touch the disk (I5): a generation they drop is deleted by :meth:`collect`, which the
    caller runs once ``lock`` is released (still under the commit lock).  One that is never
    collected (a crash in between) is an unreferenced file recovery's ``reconcile`` deletes."""

    def __init__(self, store: BackingStore, keep: int, table: dict[str, list[GenEntry]],
                 everywhere: bool = True) -> None:
        self.store = store
        self.keep = max(0, keep)
        # False: only files in checkpoint groups keep generations (the caller's keep_plan decides)
        self.everywhere = everywhere
        self.table = table
        self._dropped: list[str] = []
        for path in list(self.table):
            self._prune(path)
        self.collect()

    def to_json(self) -> dict:
        return {p: [g.to_json() for g in gs] for p, gs in self.table.items()}

    def of(self, path: str) -> list[GenEntry]:
        """Kept generations of ``path``, newest first."""
        return list(self.table.get(path, ()))

    def drop_all(self, dry_run: bool = False) -> list[tuple[str, int]]:
        """Every kept generation, as (name, size); unless ``dry_run`` dropped from the table (the
        files go at :meth:`collect`).  ``ckptfs gc --generations``."""
        kept = [(g.name, g.rec.size) for gs in self.table.values() for g in gs]
        if not dry_run:
            for gs in self.table.values():
                for g in gs:
                    self._remove(g)
            self.table.clear()
        return kept

    def links_to(self, ino: int) -> int:
        """How many kept generations are names of backing inode ``ino`` (O(generations): for an
        fstat of an open file whose name went, which natively counts none of them)."""
        return sum(1 for gs in self.table.values() for g in gs if g.rec.ino == ino)

    def plan(self, prev: FileRecord | None) -> dict | None:
        """The ``keep`` fragment for an install replacing ``prev`` (None: keep nothing)."""
        if self.keep <= 0 or prev is None:
            return None
        return {"name": f"{GEN_DIR}/{uuid.uuid4().hex}", "rec": prev.to_json()}

    def link(self, path: str, keep: dict) -> None:
        self.store.link(path, keep["name"])

    def unlink_quiet(self, keep: dict) -> None:
        try:
            self.store.unlink(keep["name"])
        except OSError:
            pass

    def installed(self, path: str, keep: dict | None) -> None:
        if keep is None:
            return
        self.table.setdefault(path, []).insert(0, GenEntry(keep["name"], FileRecord.from_json(keep["rec"])))
        self._prune(path)

    def _prune(self, path: str) -> None:
        gs = self.table.get(path, [])
        while len(gs) > self.keep:
            self._remove(gs.pop())
        if not gs:
            self.table.pop(path, None)

    def _remove(self, g: GenEntry) -> None:
        self._dropped.append(g.name)  # deleted by collect(), outside the facade's lock

    def collect(self) -> None:
        """Delete the kept generations dropped from the table since the last call."""
        while self._dropped:
            name = self._dropped.pop()
            try:
                self.store.unlink(name)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("could not delete kept generation %s: %s (recovery retries)", name, e)

    def on_unlink(self, path: str) -> None:
        for g in _drop_prefix(self.table, path):
            self._remove(g)

    def on_rename(self, old: str, new: str, keep: dict | None = None, is_dir: bool = True) -> None:
        """``keep``: the replaced file at ``new`` was kept (its history goes on; ``old``'s ends).
        ``is_dir`` False: a file, whose own key is all that moves (no scan of the table)."""
        if keep is not None:
            history = self.table.pop(new, [])
            for g in _drop_prefix(self.table, old) if is_dir else self.table.pop(old, []):
                self._remove(g)
            self.table[new] = [GenEntry(keep["name"], FileRecord.from_json(keep["rec"])), *history]
            self._prune(new)
            return
        if not is_dir:
            for g in self.table.pop(new, []):
                self._remove(g)
            if old in self.table:
                self.table[new] = self.table.pop(old)
            return
        for g in _drop_prefix(self.table, new):
            self._remove(g)
        _move_prefix(self.table, old, new)


    def on_exchange(self, a: str, b: str) -> None:
        """``rename(a, b, RENAME_EXCHANGE)``: each name keeps the history of the file it now holds."""
        swap_prefix(self.table, a, b)


def link_for_recovery(store: BackingStore, path: str, keep: dict) -> None:
    """Roll-forward helper: make the generation link if the path still has the old inode."""
    rec = FileRecord.from_json(keep["rec"])
    if store.exists(keep["name"]):
        return
    try:
        st = store.lstat(path)
    except FileNotFoundError:
        return
    if st.st_ino == rec.ino:
        store.link(path, keep["name"])

