"""Checkpoint group commands: ``ckptfs ls / show / seal / gc`` and the group half of ``ckptfs verify``.

Each command works on a mounted directory (through the daemon's xattrs and the
files as served) and, except ``seal``, on an unmounted one (from the plain
files under ``.ckptfs``: snapshot, journal, manifests, COMMITs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import blake3

from ckptfs import offline
from ckptfs.backing import OsBackingStore
from ckptfs.cli.common import CliError, Where, locate, walk
from ckptfs.engine import quarantine as qt
from ckptfs.engine.replay import Replayed
from ckptfs.engine.seals import CORRUPT, OPEN, SEALED, TORN, GroupState, SealError, read_seal
from ckptfs.layout import parent
from ckptfs.xattrs import (
    PREFIX,
    X_ATTRS,
    X_BLAKE3,
    X_GC,
    X_GC_REPORT,
    X_GROUPS,
    X_QUARANTINE,
    X_SEAL,
    X_STATUS,
)


def offline_state(root: str) -> Replayed:
    """:func:`ckptfs.offline.state`, its metadata problems printed as warnings."""
    return offline.state(root, warn=lambda p: print(f"ckptfs: warning: {p}", file=sys.stderr))


def offline_groups(root: str) -> tuple[dict[str, Any], dict[str, GroupState]]:
    """Records and groups of an unmounted directory (:func:`offline_state`)."""
    r = offline_state(root)
    return r.files, r.groups


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def _age(t: float) -> str:
    s = max(0.0, time.time() - t)
    for unit, div in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= div:
            return f"{s / div:.0f}{unit}"
    return f"{s:.0f}s"


def list_groups(w: Where) -> list[dict[str, Any]]:
    """The live groups directly in ``w`` (open, sealed, being deleted; unmounted: also those a crash
    left open, labelled torn)."""
    d = os.path.join(w.root, w.rel)
    if w.mounted:
        try:
            return json.loads(os.getxattr(d, X_GROUPS))
        except OSError as e:
            raise CliError(f"{d}: cannot read group list: {e.strerror}", 1) from None
    _, groups = offline_groups(w.root)
    rel = w.rel.strip("/")
    out = [g.to_json() for g in groups.values() if parent(g.path) == rel]
    return sorted(out, key=lambda x: (x["step"] if x["step"] is not None else -1, x["created_at"]))


def list_quarantine(w: Where) -> list[dict[str, Any]]:
    """What was moved out of sight from ``w`` (engine/quarantine.py), mounted: ``user.ckptfs.quarantine``
    (unmounted, ``cmd_ls`` reads the same rows from the snapshot, the journal and .ckptfs/quarantine)."""
    d = os.path.join(w.root, w.rel)
    try:
        return json.loads(os.getxattr(d, X_QUARANTINE))
    except OSError as e:
        raise CliError(f"{d}: cannot read what was moved out of sight: {e.strerror}", 1) from None


def _note_unknown_origin(w: Where, r: Replayed | None) -> None:
    """Entries under .ckptfs/quarantine whose origin nothing records are listed at the root: say so
    when listing another directory (an older ckptfs lost such records; engine/quarantine.py Q4)."""
    if r is None:
        try:
            rows = json.loads(os.getxattr(w.root, X_QUARANTINE))
        except OSError:
            return
    else:
        store = OsBackingStore(w.root)
        try:
            rows = [q.row() for q in qt.unrecorded(store, r.quarantine, r.groups)]
        finally:
            store.shutdown()
    n = sum(1 for r in rows if "omitted" not in r and not r.get("path"))
    if n:
        print(f"ckptfs: note: {n} more in .ckptfs/quarantine of unknown origin: `ckptfs ls --all {w.root}`",
              file=sys.stderr)


def _order(row: dict[str, Any]) -> tuple:
    return (row.get("step") if row.get("step") is not None else -1, row.get("created_at") or 0,
            row.get("time", 0))


def cmd_ls(a: argparse.Namespace) -> int:
    w = locate(a.dir)
    if w.mounted:
        rows, moved = list_groups(w), (list_quarantine(w) if a.all else [])
    else:  # one read of the metadata for both
        r = offline_state(w.root)
        rel = w.rel.strip("/")
        rows = sorted((g.to_json() for g in r.groups.values() if parent(g.path) == rel), key=_order)
        store = OsBackingStore(w.root)
        try:
            moved = qt.rows_in(store, r.quarantine, r.groups, rel) if a.all else []
        finally:
            store.shutdown()
    rows = [g for g in rows if a.all or g["state"] in (OPEN, SEALED)]
    if a.all and w.rel.strip("/"):
        _note_unknown_origin(w, None if w.mounted else r)
    if a.all:
        for extra in [r for r in moved if "omitted" in r]:
            print(f"ckptfs: {extra['omitted']} older entries not shown (too many for one xattr); "
                  "`ckptfs gc --dry-run` lists them all", file=sys.stderr)
        rows = sorted(rows + [r for r in moved if "omitted" not in r], key=_order)
    if a.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    if not rows:
        print("(no groups)")
        return 0
    print(f"{'STATE':10} {'STEP':>8} {'FILES':>6} {'BYTES':>10} {'AGE':>5}  NAME")
    for g in rows:
        step = "-" if g.get("step") is None else str(g["step"])
        kept = "kept_at" in g
        when = g["time"] if kept else (g["sealed_at"] or g["created_at"])
        name = os.path.basename(g["path"]) or "?"
        line = f"{g['state']:10} {step:>8} {g['files']:>6} {_human(g['bytes']):>10} {_age(when):>5}  {name}"
        if kept:
            what = "its re-save's files" if g["state"] == qt.RESAVE else "kept"
            line += f"  ({g['reason']}; moved {_age(g['time'])} ago; {what} at {g['kept_at']} until 'ckptfs gc')"
        elif g["state"] in (TORN, CORRUPT):
            line += f"  ({g['reason']}; hidden at the next mount)"
        print(line)
    return 0


def _group_at(w: Where) -> GroupState:
    _, groups = offline_groups(w.root)
    g = groups.get(w.rel.strip("/"))
    if g is None:
        raise CliError(f"{os.path.join(w.root, w.rel)}: not a checkpoint group")
    return g


def cmd_show(a: argparse.Namespace) -> int:
    w = locate(a.group)
    if w.mounted:
        p = os.path.join(w.root, w.rel)
        try:
            attrs = {k.removeprefix(PREFIX): v
                     for k, v in json.loads(os.getxattr(p, X_ATTRS)).items()}
        except OSError as e:
            raise CliError(f"{p}: cannot read its status: {e.strerror}", 1) from None
        if "group" not in attrs:  # a file or an ordinary directory: its status attributes
            print(json.dumps(attrs, indent=2, sort_keys=True))
            return 0
        out = json.loads(attrs["group"])
        for key in ("lineage", "manifest_files"):
            if key in attrs:
                out[key] = json.loads(attrs[key])
    elif not os.path.isdir(os.path.join(w.root, w.rel)):
        files, _ = offline_groups(w.root)
        rec = files.get(w.rel.lstrip("/"))
        out = {"status": "committed", **rec.to_json()} if rec is not None else {"status": "untracked"}
    else:
        g = _group_at(w)
        out = g.to_json()
        store = OsBackingStore(w.root)
        try:
            manifest, _ = read_seal(store, g.id)
            out["lineage"] = manifest.get("lineage")
            out["manifest_files"] = sorted(manifest["files"])
        except SealError as e:
            out["seal_problem"] = str(e)
        finally:
            store.shutdown()
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def cmd_seal(a: argparse.Namespace) -> int:
    w = locate(a.dir)
    p = os.path.join(w.root, w.rel)
    if not w.mounted:
        raise CliError(f"{p}: not mounted; sealing needs the daemon (mount it, or it stays as it is)")
    try:
        os.setxattr(p, X_SEAL, b"1")
        status = os.getxattr(p, X_STATUS).decode()
    except OSError as e:
        raise CliError(f"{p}: seal failed: {e.strerror}", 1) from None
    print(f"ckptfs: {p}: {status}")
    return 0 if status == SEALED else 1


def _offline_dry_run(root: str, generations: bool = False) -> dict[str, Any]:
    """What gc on the unmounted ``root`` would delete, read-only: recovery (which gc runs first) is
    not run, so groups a crash left open are named in a note, not counted."""
    r = offline_state(root)
    for g in r.groups.values():
        if g.state == TORN:
            print(f"ckptfs: note: {g.path} was still open when the daemon stopped: recovery (the next mount, "
                  "or gc) first rolls it back or moves it out of sight; not counted here", file=sys.stderr)
    store = OsBackingStore(root)
    try:
        rep = qt.report(qt.gc_plan(store, r.quarantine, r.groups), True, os.getpid())
        if generations:
            kept = [g for gs in r.gens.values() for g in gs]  # (raw entries: {"name", "rec"})
            rep["generations_removed"] = len(kept)
            rep["generations_bytes"] = sum(int(g.get("rec", {}).get("size", 0)) for g in kept)
            rep["bytes_freed"] += rep["generations_bytes"]
        return rep
    finally:
        store.shutdown()


def cmd_gc(a: argparse.Namespace) -> int:
    w = locate(a.dir)
    if w.mounted:
        try:
            words = [b"generations"] if a.generations else []
            os.setxattr(w.root, X_GC, b",".join([*words, b"dry-run" if a.dry_run else b"1"]))
            rep = json.loads(os.getxattr(w.root, X_GC_REPORT))
        except OSError as e:
            raise CliError(f"{w.root}: gc failed: {e.strerror}", 1) from None
        if rep.get("pid") != os.getpid():  # (the daemon keeps each process's own report)
            print("ckptfs: warning: this report is another gc's", file=sys.stderr)
    elif a.dry_run:
        rep = _offline_dry_run(w.root, a.generations)
    else:
        from ckptfs.fs import CkptFS

        store = OsBackingStore(w.root)
        try:
            fs = CkptFS(store, housekeeping_interval=0)  # runs recovery: torn groups are quarantined first
            rep = fs.gc(pid=os.getpid(), generations=a.generations)
            fs.shutdown()
        finally:
            store.shutdown()
    rep["dir"] = w.root
    if a.json:
        print(json.dumps(rep, indent=2, sort_keys=True))
        return 0
    verb = "would remove" if rep["dry_run"] else "removed"
    for it in rep["items"]:
        print(f"{verb} {it['kept_at']}  {it['path'] or '?'}  {it['state']}  {it['files']} file"
              f"{'' if it['files'] == 1 else 's'}  {it['bytes']} bytes  ({it['reason']})")
    if rep.get("items_omitted"):
        print(f"... and {rep['items_omitted']} more (each is in {w.root}/.ckptfs/daemon.log)")
    n = rep["groups_removed"]
    gens = (f" and {rep['generations_removed']} kept generation{'' if rep['generations_removed'] == 1 else 's'}"
            if "generations_removed" in rep else "")
    print(f"ckptfs: gc {verb} {n} group{'' if n == 1 else 's'}{gens} ({rep['bytes_freed'] / 1e6:.1f} MB) "
          f"from {w.root}")
    return 0


def _hash_file(path: str) -> str:
    h = blake3.blake3()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def verify_group_offline(root: str, g: GroupState, out: list[str]) -> int:
    """Check G1 and every file's size and blake3 against the manifest; append problems to out."""
    store = OsBackingStore(root)
    try:
        manifest, _ = read_seal(store, g.id)
    except SealError as e:
        out.append(f"{g.path}: {e}")
        return 0
    finally:
        store.shutdown()
    n = 0
    for rel, rec in sorted(manifest["files"].items()):
        p = os.path.join(root, g.path, rel)
        n += 1
        try:
            size = os.path.getsize(p)
        except OSError:
            out.append(f"{g.path}/{rel}: missing")
            continue
        if size != rec["size"]:
            out.append(f"{g.path}/{rel}: size {size}, manifest says {rec['size']}")
        elif _hash_file(p) != rec["blake3"]:
            out.append(f"{g.path}/{rel}: content does not match its blake3 in the manifest")
    gdir = os.path.join(root, g.path)
    for dirpath, _, names in walk(gdir):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), gdir)
            if rel not in manifest["files"]:
                out.append(f"{g.path}/{rel}: not in the manifest (added after the seal)")
    return n


def verify_group_mounted(root: str, rel: str, out: list[str]) -> int:
    """Read every file of a sealed group through the mount and compare with its committed digest."""
    gdir = os.path.join(root, rel)
    status = os.getxattr(gdir, X_STATUS).decode()
    if status != SEALED:
        out.append(f"{rel}: group is {status}, not sealed")
        return 0
    n = 0
    for dirpath, _, names in walk(gdir):
        for name in names:
            p = os.path.join(dirpath, name)
            n += 1
            try:
                want = os.getxattr(p, X_BLAKE3).decode()
            except OSError:
                out.append(f"{os.path.relpath(p, root)}: no committed digest")
                continue
            try:
                got = _hash_file(p)
            except OSError as e:
                out.append(f"{os.path.relpath(p, root)}: read failed: {e.strerror}")
                continue
            if got != want:
                out.append(f"{os.path.relpath(p, root)}: content does not match its committed blake3")
    return n


def verify_groups(a: argparse.Namespace) -> tuple[int, str]:
    """Verify a group, or every group directly inside a directory; prints each problem; (exit
    status, summary words) for ``ckptfs verify``'s one line."""
    w = locate(a.path)
    rel = w.rel.strip("/")
    problems: list[str] = []
    checked_files = checked_groups = 0
    if w.mounted:
        p = os.path.join(w.root, rel)
        try:
            is_group = os.getxattr(p, X_STATUS).decode() in (OPEN, SEALED)
        except OSError:
            is_group = False
        if is_group:
            targets = [rel]
        else:  # every sealed group at any depth under it (issue 25: two levels down were missed)
            targets = []
            for dirpath, dirnames, _files in walk(p):
                dirnames.sort()
                try:
                    here = json.loads(os.getxattr(dirpath, X_GROUPS))
                except (OSError, ValueError):
                    continue
                targets += [g["path"] for g in here if g["state"] == SEALED]
                sealed = {os.path.basename(g["path"]) for g in here}
                dirnames[:] = [n for n in dirnames if n not in sealed]  # (a group holds no groups)
        for t in targets:
            checked_files += verify_group_mounted(w.root, t, problems)
            checked_groups += 1
    else:
        _, groups = offline_groups(w.root)
        if rel in groups:
            targets = [groups[rel]]
        else:
            targets = [g for g in groups.values() if rel == "" or g.path.startswith(rel + "/")]  # any depth
        for g in targets:
            checked_groups += 1
            if g.state != SEALED:
                print(f"note: {g.path} is {g.state} ({g.reason}); not part of the committed state",
                      file=sys.stderr)
                continue
            checked_files += verify_group_offline(w.root, g, problems)
    for line in problems:
        print(f"FAIL {line}", file=sys.stderr)
    words = (f"{checked_groups} group{'s' if checked_groups != 1 else ''} ({checked_files} "
             f"file{'s' if checked_files != 1 else ''} against their manifests")
    words += f", {len(problems)} problems)" if problems else ")"
    return (1 if problems else 0), words


def cmd_latest(a: argparse.Namespace) -> int:
    """``ckptfs latest DIR``: the newest sealed group in DIR (or, with none, its newest committed
    file), for resume scripts; exit 1 and say so when there is none (api.latest)."""
    from ckptfs import api

    try:
        got = api.latest(a.dir)
    except (api.NotCkptfs, NotADirectoryError, FileNotFoundError) as e:
        raise CliError(str(e) if isinstance(e, api.NotCkptfs) else f"{a.dir}: {e.strerror}") from None
    if a.json:
        st = api.status(got) if got else {}
        for k, v in st.items():  # status attributes that hold JSON are given as JSON, not as strings
            if isinstance(v, str) and v[:1] in ("{", "["):
                try:
                    st[k] = json.loads(v)
                except ValueError:
                    pass
        if "group" not in st and "state" in st:  # unmounted: the group's fields came flat; the same shape
            st = {"status": st.get("status"), "mounted": st.get("mounted"),
                  "group": {k: v for k, v in st.items() if k not in ("status", "mounted")}}
        print(json.dumps({"latest": got, **st}, sort_keys=True))
    elif got is not None:
        print(got)
    if got is None:
        print(f"ckptfs: no sealed group or committed file in {a.dir}", file=sys.stderr)
        return 1
    return 0


def add_parsers(sub: Any) -> None:
    la = sub.add_parser("latest", help="the newest sealed group (or committed file) in DIR, for resume scripts")
    la.add_argument("dir")
    la.add_argument("--json", action="store_true", help="one JSON object: its path and status")
    la.set_defaults(func=cmd_latest)
    ls = sub.add_parser("ls", help="list checkpoint groups in DIR")
    ls.add_argument("dir")
    ls.add_argument("--all", action="store_true", help="include what was moved out of sight: torn and corrupt "
                                                      "groups, torn re-saves' files (why, when, kept where)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    sh = sub.add_parser("show", help="a group's state, files and lineage; a file's status (blake3, size, generation)")
    sh.add_argument("group")
    sh.add_argument("--json", action="store_true", help="(its output is JSON already)")
    sh.set_defaults(func=cmd_show)
    se = sub.add_parser("seal", help="seal DIR as a checkpoint group now (mounted)")
    se.add_argument("dir")
    se.set_defaults(func=cmd_seal)
    gc = sub.add_parser("gc", help="delete what was moved out of sight (torn/corrupt groups, torn re-saves' "
                                   "files in .ckptfs/quarantine); prints each item and the bytes freed")
    gc.add_argument("dir")
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    gc.add_argument("--json", action="store_true", help="the report as JSON")
    gc.add_argument("--generations", action="store_true",
                    help="also delete every kept previous version (rollback targets: a torn re-save "
                         "of a sealed group is then quarantined, not rolled back)")
    gc.set_defaults(func=cmd_gc)
