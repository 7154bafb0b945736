"""Integrity commands: ``ckptfs verify`` (the files half), ``scrub``, ``forget``.

``verify PATH`` and ``scrub DIR`` work in two modes:

* **offline** (PATH is inside an unmounted ckptfs directory): records are read
  from ``.ckptfs`` without changing anything (``verify.load_offline``) and every
  byte of every committed file under PATH (and its kept generations) is
  hashed against them.
* **mounted** (PATH is inside a ckptfs mount): the daemon does the work: each
  file gets ``setxattr user.ckptfs.control=verify`` (a forced, cache-ignoring
  full verification, synchronous, EIO if corrupt; the detail is then read from
  ``user.ckptfs.error``).  ``scrub`` on a mount starts a background scrub
  (``--wait`` waits for it).

Exit status: 0 all good, 1 corruption or untrusted metadata found (each bad
file is named with the failing chunk and digests), 2 usage errors.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import time

from ckptfs import META_DIR
from ckptfs.backing import OsBackingStore
from ckptfs.cli.common import CliError, find_backing_root, find_mount_root, is_ckptfs_mount, walk
from ckptfs.integrity.verify import (
    Finding,
    ProgressBar,
    RateLimiter,
    load_offline,
    select,
    untracked_files,
    verify_many,
)
from ckptfs.log.journal import CorruptMetadata
from ckptfs.xattrs import X_CONTROL, X_ERROR, X_SCRUB, X_STATUS

CONTROL = X_CONTROL.encode()


def add_parsers(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("verify", help="verify committed files against their digests (mounted or not)")
    v.add_argument("path", help="a ckptfs directory, a file/directory inside one, or a mirror s3://BUCKET/PREFIX")
    v.add_argument("--progress", action="store_true", help="progress bar on stderr even when not a tty")
    v.add_argument("--json", action="store_true", help="one JSON object per file on stdout")
    v.add_argument("--read-data", action="store_true", help="s3://...: download and hash every object too")
    v.add_argument("--group", metavar="NAME", help="s3://...: only this committed group")

    s = sub.add_parser("scrub", help="re-verify everything: offline now, or start the mounted daemon's scrub")
    s.add_argument("dir")
    s.add_argument("--rate", type=float, default=0.0, metavar="MB/s", help="offline read rate limit (0: none)")
    s.add_argument("--wait", action="store_true", help="mounted: wait until the scrub has finished")
    s.add_argument("--progress", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_scrub)

    f = sub.add_parser("forget", help="drop the records of files changed on purpose while unmounted")
    f.add_argument("dir")
    f.add_argument("files", nargs="+", help="paths relative to DIR")
    f.set_defaults(func=cmd_forget)


# ----------------------------------------------------------------- helpers
def _report(findings: list[Finding], problems: list[str], untracked: list[str], as_json: bool,
            root: str | None = None) -> tuple[int, str]:
    """Print each finding; (exit status, the summary's words: "N committed files (k ok, j corrupt)...").
    ``root``: the backing root the findings' paths are relative to (offline): ``--json`` gives
    absolute paths mounted and unmounted alike (issue 25)."""
    bad = [f for f in findings if not f.ok and f.kind != "no-permission"]
    denied = [f for f in findings if f.kind == "no-permission"]
    if as_json:
        for f in findings:
            js = f.to_json()
            if root is not None and not os.path.isabs(js["path"]):
                js["path"] = os.path.join(root, js["path"])
            print(json.dumps(js))
    for p in problems:
        print(f"ckptfs: metadata: {p}", file=sys.stderr)
    for f in bad:
        print(f"ckptfs: {f.message()}", file=sys.stderr)
    for f in denied:
        print(f"ckptfs: {f.path}: {f.detail}", file=sys.stderr)
    n_ok = len(findings) - len(bad) - len(denied)
    summary = f"{len(findings)} committed file{'s' if len(findings) != 1 else ''} ({n_ok} ok, {len(bad)} corrupt"
    if denied:
        summary += f", {len(denied)} not verified: permission denied"
    if untracked:
        summary += f", {len(untracked)} untracked: no record, not verifiable"
    if problems:
        summary += f", {len(problems)} metadata problems"
    return (1 if bad or problems else 2 if denied else 0), summary + ")"


def _offline(path: str, rate: float, progress: bool, as_json: bool) -> tuple[int, str]:
    root = find_backing_root(path)
    if root is None:
        raise CliError(f"{path}: not inside a ckptfs directory (no {META_DIR} found)")
    rel = os.path.relpath(os.path.abspath(path), root)
    rel = "" if rel == "." else rel
    store = OsBackingStore(root)
    try:
        try:
            state = load_offline(store)
        except CorruptMetadata as e:
            raise CliError(f"{root}: not verified: {e}; run 'ckptfs recover --rebuild {root}'", 2) from None
        except PermissionError:
            raise CliError(f"{root}: not verified: permission denied ({META_DIR}/ is its owner's: "
                           "run as the directory's owner or root)", 2) from None
        recs = select(state.files, rel)
        gen_recs = {}
        from ckptfs.records import FileRecord

        for p, gs in state.generations.items():
            if p in recs:
                for g in gs if isinstance(gs, list) else []:
                    try:
                        gen_recs[g["name"]] = FileRecord.from_json(g["rec"])
                    except (KeyError, ValueError, TypeError):
                        state.problems.append(f"kept generation record of {p!r} untrusted")
        total = sum(r.size for r in recs.values()) + sum(r.size for r in gen_recs.values())
        bar = ProgressBar(total, progress or sys.stderr.isatty())
        limiter = RateLimiter(rate * 1e6 if rate > 0 else None)
        findings = verify_many(store, recs, progress=bar, limiter=limiter, all_records=state.files)
        findings += [f for f in verify_many(store, gen_recs, progress=bar, limiter=limiter) if not f.ok]
        bar.finish()
        untracked = untracked_files(store, state.files, rel)
    finally:
        store.shutdown()
    return _report(findings, state.problems, untracked, as_json, root)


def _walk(path: str) -> list[str]:
    if not os.path.isdir(path):
        return [path]
    out = []
    for d, dirs, files in walk(path):
        dirs.sort()
        out += [os.path.join(d, f) for f in sorted(files)]
    return out


def _mounted(path: str, progress: bool, as_json: bool) -> tuple[int, str]:
    files = []
    for f in _walk(path):
        try:
            st = os.lstat(f)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append((f, st.st_size))
    bar = ProgressBar(sum(s for _, s in files), progress or sys.stderr.isatty())
    findings, untracked = [], []
    for f, size in files:
        bar.set_label(f)
        try:
            status = os.getxattr(f, X_STATUS).decode()
        except OSError:
            status = "untracked"
        if status not in ("committed", "corrupt"):
            if status == "untracked":
                untracked.append(f)
            bar(size)
            continue
        try:
            os.setxattr(f, CONTROL, b"verify")
            findings.append(Finding(f, True))
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):  # not this user's to verify: never "corrupt" (issue 26)
                findings.append(Finding(f, False, "no-permission", "permission",
                                        "not verified: permission denied (verify as its owner or root)"))
                bar(size)
                continue
            try:
                detail = os.getxattr(f, X_ERROR).decode()
            except OSError:
                detail = str(e)
            findings.append(Finding(f, False, "corrupt", "daemon", detail))
        bar(size)
    bar.finish()
    return _report(findings, [], untracked, as_json)


# ---------------------------------------------------------------- commands
def verify_files(a: argparse.Namespace) -> tuple[int, str]:
    """Every committed file at or under ``a.path`` against its digests, through the mount or
    offline; prints each finding; (exit status, summary words) for ``ckptfs verify``'s one line."""
    if not os.path.lexists(a.path):
        raise CliError(f"{a.path}: no such file or directory")
    if find_mount_root(a.path):
        return _mounted(a.path, a.progress, a.json)
    return _offline(a.path, 0.0, a.progress, a.json)


def summary_line(rc: int, words: str, as_json: bool) -> None:
    """The one summary line of a verify or scrub: what was checked, then OK or FAILED (the exit
    status says the same: 0 or 1).  On stderr with --json (stdout holds the findings)."""
    verdict = {0: "OK", 2: "INCOMPLETE (not yours to verify)"}.get(rc, "FAILED")
    print(f"ckptfs: verified {words}: {verdict}", file=sys.stderr if as_json else sys.stdout)


def cmd_scrub(a: argparse.Namespace) -> int:
    d = os.path.abspath(a.dir)
    if not os.path.isdir(d):
        raise CliError(f"{d}: no such directory")
    root = find_mount_root(d)
    if root is None:
        rc, words = _offline(d, a.rate, a.progress, a.json)
        summary_line(rc, words, a.json)
        return rc
    try:
        before = json.loads(os.getxattr(root, X_SCRUB))
        t0 = time.time()
        os.setxattr(root, CONTROL, b"scrub")
    except OSError as e:
        # (the status attributes and control of the root answer its owner and root only)
        why = "permission denied" if e.errno in (errno.EPERM, errno.EACCES, errno.ENODATA) else e.strerror
        raise CliError(f"{root}: scrub refused: {why} (the mount's owner or root may scrub)", 2) from None
    if not a.wait:
        print(f"ckptfs: background scrub of {root} started (see: ckptfs status {root})")
        return 0
    bar = None
    while True:
        info = json.loads(os.getxattr(root, X_SCRUB))
        if info.get("state") == "idle" and info.get("finished", 0) >= t0 and info != before:
            break
        if info.get("state") == "running" and info.get("bytes_total") and (a.progress or sys.stderr.isatty()):
            if bar is None:
                bar = ProgressBar(info["bytes_total"], True)
                bar.set_label("scrub")
            bar(info.get("bytes_done", 0) - bar.done)
        time.sleep(0.1)
    if bar is None and info.get("bytes_total") and (a.progress or sys.stderr.isatty()):
        bar = ProgressBar(info["bytes_total"], True)  # finished before the first look: its end
        bar.set_label("scrub")
    if bar is not None:
        bar(bar.total - bar.done)
        bar.finish()
    print(json.dumps(info, indent=2))
    return 1 if info.get("corrupt") else 0


def cmd_forget(a: argparse.Namespace) -> int:
    """Accept offline changes: drop the records (and kept generations) of FILES, also the one each
    file carries (records.XATTR)."""
    from ckptfs.log.journal import Journal
    from ckptfs.records import XATTR
    from ckptfs.recovery import recover

    d = os.path.abspath(a.dir)
    if is_ckptfs_mount(d):
        raise CliError(f"{d}: is mounted; unmount it first")
    if not os.path.isdir(os.path.join(d, META_DIR)):
        raise CliError(f"{d}: not a ckptfs directory")
    store = OsBackingStore(d)
    try:
        j = Journal(store)
        rep = recover(store, j)
        unknown = 0
        for f in a.files:
            rel = f.strip("/")
            if rep.files.pop(rel, None) is None:
                print(f"ckptfs: {rel}: no record", file=sys.stderr)
                unknown += 1
            for g in rep.generations.pop(rel, []):
                store.unlink(g.name)
            try:  # the record the file itself carries (R1): else the next recovery reads it back
                store.removexattr(rel, XATTR)
            except OSError:
                pass  # none on it (or no file)
        # the same state recovery's own compaction writes: records, aborts, groups, and the kept
        # generations (recover() set j.extra_state to read rep.generations, popped above)
        j.compact(rep.files, rep.aborts, {p: g.to_json() for p, g in rep.groups.items()}, clean=True)
        print(f"ckptfs: {len(rep.files)} committed files remain recorded")
        if unknown:
            return 1  # a path that had no record: the command found a problem (issue 26: it said 0)
    finally:
        store.shutdown()
    return 0
