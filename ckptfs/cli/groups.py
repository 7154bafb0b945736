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

from ckptfs.backing import OsBackingStore
from ckptfs.cli.common import CliError, Where, locate
from ckptfs.engine.replay import replay
from ckptfs.engine.seals import CORRUPT, OPEN, SEALED, TORN, GroupState, SealError, read_seal
from ckptfs.layout import parent
from ckptfs.log.journal import Journal
from ckptfs.log.metadata import load_trusted
from ckptfs.status import PREFIX, X_ATTRS, X_BLAKE3, X_GC, X_GROUPS, X_SEAL, X_STATUS


def offline_groups(root: str) -> tuple[dict[str, Any], dict[str, GroupState]]:
    """Records and groups of an unmounted directory, read-only (no recovery is run).

    Groups still open here were torn by a crash; the next mount quarantines them."""
    store = OsBackingStore(root)
    try:
        r = replay(load_trusted(Journal(store)), last="apply")
        files, groups = r.files, r.groups
        for p in r.problems:  # damaged metadata: the listing is partial, and says so
            print(f"ckptfs: warning: {p}", file=sys.stderr)
        for p in [p for p, g in groups.items() if g.state == OPEN and g.tentative]:
            del groups[p]  # a directory made by mkdir with no checkpoint file: not a group (issue 10)
        for g in groups.values():
            if g.state == OPEN:
                g.state, g.reason = TORN, "not sealed before the daemon stopped (recovery will quarantine it)"
        return files, groups
    finally:
        store.shutdown()


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


def cmd_ls(a: argparse.Namespace) -> int:
    w = locate(a.dir)
    rows = [g for g in list_groups(w) if a.all or g["state"] in (OPEN, SEALED)]
    if a.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    if not rows:
        print("(no groups)")
        return 0
    print(f"{'STATE':8} {'STEP':>8} {'FILES':>6} {'BYTES':>10} {'AGE':>5}  NAME")
    for g in rows:
        step = "-" if g["step"] is None else str(g["step"])
        when = g["sealed_at"] or g["created_at"]
        line = (f"{g['state']:8} {step:>8} {g['files']:>6} {_human(g['bytes']):>10} {_age(when):>5}  "
                f"{os.path.basename(g['path'])}")
        if g["state"] in (TORN, CORRUPT):
            where = f"kept at {g['moved_to']} until 'ckptfs gc'" if g["moved_to"] else "hidden at the next mount"
            line += f"  ({g['reason']}; {where})"
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


def cmd_gc(a: argparse.Namespace) -> int:
    w = locate(a.dir)
    if w.mounted:
        try:
            os.setxattr(w.root, X_GC, b"1")
        except OSError as e:
            raise CliError(f"{w.root}: gc failed: {e.strerror}", 1) from None
        print(f"ckptfs: gc done on {w.root}")
        return 0
    from ckptfs.fs import CkptFS

    store = OsBackingStore(w.root)
    try:
        fs = CkptFS(store, housekeeping_interval=0)  # runs recovery: torn groups are quarantined first
        res = fs.gc()
        fs.shutdown()
    finally:
        store.shutdown()
    print(f"ckptfs: gc removed {res['groups_removed']} torn/corrupt groups from {w.root}")
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
    for dirpath, _, names in os.walk(gdir):
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
    for dirpath, _, names in os.walk(gdir):
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


def cmd_verify_groups(a: argparse.Namespace) -> int:
    """Verify a group, or every group directly inside a directory."""
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
        targets = [rel] if is_group else [g["path"] for g in list_groups(w) if g["state"] == SEALED]
        for t in targets:
            checked_files += verify_group_mounted(w.root, t, problems)
            checked_groups += 1
    else:
        _, groups = offline_groups(w.root)
        if rel in groups:
            targets = [groups[rel]]
        else:
            targets = [g for g in groups.values() if parent(g.path) == rel]
        for g in targets:
            checked_groups += 1
            if g.state != SEALED:
                print(f"note: {g.path} is {g.state} ({g.reason}); not part of the committed state",
                      file=sys.stderr)
                continue
            checked_files += verify_group_offline(w.root, g, problems)
    for line in problems:
        print(f"FAIL {line}", file=sys.stderr)
    print(f"ckptfs: verified {checked_groups} groups, {checked_files} files: "
          f"{'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


def add_parsers(sub: Any) -> None:
    ls = sub.add_parser("ls", help="list checkpoint groups in DIR")
    ls.add_argument("dir")
    ls.add_argument("--all", action="store_true", help="include torn and corrupt groups")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    sh = sub.add_parser("show", help="a group's state, files and lineage; a file's status (blake3, size, generation)")
    sh.add_argument("group")
    sh.set_defaults(func=cmd_show)
    se = sub.add_parser("seal", help="seal DIR as a checkpoint group now (mounted)")
    se.add_argument("dir")
    se.set_defaults(func=cmd_seal)
    gc = sub.add_parser("gc", help="delete torn/corrupt groups kept in quarantine")
    gc.add_argument("dir")
    gc.set_defaults(func=cmd_gc)
