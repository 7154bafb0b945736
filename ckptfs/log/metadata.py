"""Loading ckptfs metadata (snapshot + journal) without trusting damaged parts.

Policy (docs/design.md, "Integrity"): metadata that fails its CRC, does not
parse, or holds internally inconsistent records is *never trusted* and *never
crashes* the daemon:

* snapshot frame bad (CRC, length, JSON, shape): the whole snapshot is
  distrusted; records are rebuilt only from the journal of the newest epoch,
  as *hints* that recovery keeps only where the file on disk has the recorded
  inode and size (and verification still checks every byte before serving).
  The damaged snapshot is preserved as ``.ckptfs/corrupt-snapshot.<time>``.
* snapshot frame good but one record inconsistent: that record is dropped.
* journal: a bad frame at the very end is a torn append (crash mid-write) and
  is dropped silently, as before.  A bad frame *followed by a valid frame* can
  only be corruption (appends are sequential and each is durable before the
  next); everything from the bad frame on is distrusted, reported, and the
  journal is preserved as ``.ckptfs/corrupt-journal.<E>.<time>``.
* a journal entry that does not apply (missing keys, bad record) is skipped.

Every problem is a line in ``Loaded.problems``; the daemon logs them and
shows them in the root xattr ``user.ckptfs.metadata``.
A snapshot of an unknown ``format`` is not corruption (a newer ckptfs wrote
it): that still raises :class:`CorruptMetadata` and the mount is refused.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from ckptfs import META_DIR
from ckptfs.layout import GEN_DIR, STAGING, TRASH, safe_rel
from ckptfs.log.journal import (
    FORMAT,
    MAX_FRAME,
    SNAPSHOT,
    CorruptMetadata,
    Journal,
    JournalState,
    decode_frames,
    read_whole,
)
from ckptfs.records import FileRecord

_HDR = struct.Struct("<II")


@dataclass
class Loaded:
    state: JournalState
    generations: dict[str, list[dict]] = field(default_factory=dict)
    quarantine: Any = None  # the snapshot's quarantine table, raw (engine/quarantine.py checks it)
    problems: list[str] = field(default_factory=list)
    snapshot_corrupt: bool = False
    journal_corrupt_at: int | None = None  # byte offset of the first distrusted frame


def _valid_frame_at(data: bytes, pos: int) -> bool:
    if pos + _HDR.size > len(data):
        return False
    length, crc = _HDR.unpack_from(data, pos)
    end = pos + _HDR.size + length
    if length == 0 or length > MAX_FRAME or end > len(data):
        return False
    payload = data[pos + _HDR.size : end]
    if zlib.crc32(payload) != crc:
        return False
    try:
        return isinstance(json.loads(payload), dict)
    except ValueError:
        return False


def scan_journal(data: bytes) -> tuple[list[dict], int | None]:
    """(entries of the trusted prefix, offset of corruption or None if clean/torn tail)."""
    entries, pos = decode_frames(data)
    if pos >= len(data):
        return entries, None
    # Anything valid after the first bad frame proves corruption, not a torn tail.
    for q in range(pos + 1, len(data) - _HDR.size):
        if _valid_frame_at(data, q):
            return entries, pos
    return entries, None


def file_path(p: object) -> bool:
    """Whether ``p`` may name a file in the tables: a user path, or a file of a sealed group being
    deleted, moved with its record under ``.ckptfs/trash/`` (G9: the deletion is finished or undone
    from there; dropping those records made offline ``verify`` fail after a killed rotation)."""
    return safe_rel(p) or safe_rel(p, TRASH)


def _records(raw: object, problems: list[str], where: str) -> dict[str, FileRecord]:
    out: dict[str, FileRecord] = {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: file table is not a mapping; ignored")
        return out
    for p, r in raw.items():
        try:
            if not file_path(p):
                raise ValueError(f"bad path {p!r}")
            out[p] = FileRecord.from_json(r)
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            problems.append(f"{where}: record of {p!r} untrusted ({e}); dropped")
    return out


_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
MAX_BATCH_ITEMS = 4096  # files one group commit names (the committer makes at most 64)


def entry_problem(e: object) -> str:
    """Why a journal entry must not be applied ("" if it may): every path it names is confined to
    the backing root (``layout.safe_rel``): user paths outside ``.ckptfs/``, staging files, kept
    generations and quarantine/trash directories under theirs, group ids plain names.  The journal
    may have been written by whoever could write the backing directory while it was unmounted
    (issue 26, threat model in docs/design.md): a hostile entry is reported and skipped, never
    applied."""
    if not isinstance(e, dict) or not isinstance(e.get("op"), str):
        return "not an entry"
    op = e["op"]
    grouplike = op.startswith(("group_", "quarantine"))
    for k in ("path", "src", "dst"):
        if k in e and not (file_path(e[k]) or (grouplike and e[k] == "")):
            return f"{k} {e[k]!r} is not a path inside the directory"
    if "staging" in e and not safe_rel(e["staging"], STAGING):
        return f"staging {e['staging']!r} is not under {STAGING}"
    if "to" in e and not safe_rel(e["to"], META_DIR):
        return f"to {e['to']!r} is not under {META_DIR}"
    keep = e.get("keep")
    if keep is not None and not (isinstance(keep, dict) and safe_rel(keep.get("name"), GEN_DIR)):
        return "keep names no kept generation"
    if "id" in e and not (isinstance(e["id"], str) and (_ID.fullmatch(e["id"]) or e["id"] == "")):
        return f"id {e['id']!r} is not a group id"
    items = e.get("items")
    if isinstance(items, list):  # an async group commit's installs (engine/commit.py C5): each confined
        # as an entry of its own (their shape is checked where they are applied: replay.batch_items)
        if len(items) > MAX_BATCH_ITEMS:
            return f"items names more than {MAX_BATCH_ITEMS} entries"
        for it in items:
            if isinstance(it, dict) and "items" in it:
                return "an item names items of its own"  # (one level: no recursion on planted depth)
            why = entry_problem(it)
            if why:
                return f"item: {why}"
    for r in e.get("restore", []) if isinstance(e.get("restore", []), list) else [None]:
        if not (isinstance(r, dict) and safe_rel(r.get("path")) and safe_rel(r.get("name"), GEN_DIR)):
            return "restore names a path outside the directory"
    for r in e.get("remove", []) if isinstance(e.get("remove", []), list) else [None]:
        if not safe_rel(r):
            return "remove names a path outside the directory"
    return ""


def confine(st: JournalState, out: Loaded) -> None:
    """Drop (and report) every record, group, generation, quarantine row and journal entry whose
    paths are not confined to the backing root (``entry_problem``)."""
    for p in [p for p in st.files if not file_path(p)]:
        del st.files[p]
        out.problems.append(f"record of {p!r} names a path outside the directory; dropped")
    for p in list(st.groups):
        g = st.groups[p]
        gid, moved = g.get("id", ""), g.get("moved_to", "")
        if not ((safe_rel(p) or p == "") and isinstance(gid, str) and (gid == "" or _ID.fullmatch(gid))
                and (moved in ("", None) or safe_rel(moved, META_DIR))):
            del st.groups[p]
            out.problems.append(f"group {p!r} names a path or id outside the directory; dropped")
    gens = out.generations
    for p in list(gens):
        hist = gens[p]
        if not (safe_rel(p) and isinstance(hist, list)
                and all(isinstance(x, dict) and safe_rel(x.get("name"), GEN_DIR) for x in hist)):
            del gens[p]
            out.problems.append(f"kept generations of {p!r} name paths outside the directory; dropped")
    q = out.quarantine
    if isinstance(q, dict):
        for k in list(q):
            row = q[k]
            if not (safe_rel(k, META_DIR) and isinstance(row, dict)
                    and (row.get("path") in ("", None) or safe_rel(row.get("path")))):
                del q[k]
                out.problems.append(f"quarantine row {k!r} names a path outside the directory; dropped")
    kept = []
    for e in st.entries:
        why = entry_problem(e)
        if why:
            out.problems.append(f"journal entry {str(e)[:200]} not applied: {why}")
        else:
            kept.append(e)
    st.entries = kept


def _newest_journal_epoch(journal: Journal) -> int:
    best = 0
    for name in journal.store.listdir(META_DIR):
        m = re.fullmatch(r"journal\.(\d+)", name)
        if m:
            best = max(best, int(m.group(1)))
    return best


def load_trusted(journal: Journal) -> Loaded:
    """Like :meth:`Journal.load`, but damaged metadata is reported, not raised."""
    store = journal.store
    st = JournalState()
    out = Loaded(state=st)
    if store.exists(SNAPSHOT):
        data = read_whole(store, SNAPSHOT)
        frames, used = decode_frames(data)
        snap = frames[0] if len(frames) == 1 and used == len(data) and isinstance(frames[0], dict) else None
        if snap is not None and snap.get("format") != FORMAT:
            raise CorruptMetadata(f"{SNAPSHOT}: unknown format {snap.get('format')!r} (newer ckptfs?)")
        try:
            if snap is None:
                raise ValueError("bad frame (CRC, length or JSON)")
            st.epoch = int(snap["epoch"])
            aborts = snap.get("aborts", [])
            st.aborts = [a for a in aborts if isinstance(a, dict)] if isinstance(aborts, list) else []
            st.files = _records(snap["files"], out.problems, "snapshot")
            gens = snap.get("generations", {})
            out.generations = gens if isinstance(gens, dict) else {}
            out.quarantine = snap.get("quarantine")
            groups = snap.get("groups", {})
            st.groups = {p: g for p, g in groups.items() if isinstance(g, dict)} if isinstance(groups, dict) else {}
            st.clean = snap.get("clean") is True
        except (KeyError, ValueError, TypeError) as e:
            out.snapshot_corrupt = True
            out.problems.append(f"snapshot corrupt ({e}); not trusted: records rebuilt from the journal "
                                "where the files on disk confirm them")
            st.epoch = _newest_journal_epoch(journal)
            st.files, st.aborts, out.generations, st.groups, out.quarantine = {}, [], {}, {}, None
    jp = journal.journal_path(st.epoch)
    if store.exists(jp):
        data = read_whole(store, jp)
        st.entries, bad_at = scan_journal(data)
        if bad_at is not None:
            out.journal_corrupt_at = bad_at
            out.problems.append(f"journal.{st.epoch} corrupt at byte {bad_at} of {len(data)}: "
                                f"{len(st.entries)} entries before it trusted, the rest ignored")
    confine(st, out)
    st.clean = st.clean and not st.entries and not out.problems
    journal.epoch = st.epoch
    return out
