"""I/O-error sweep: fail the N-th mutating backing call of an overwrite, for every N.

No mount: ``CkptFS`` directly over a ``FaultyStore`` (the same code the daemon
runs).  For each N the N-th mutating backing-store call during an overwrite of
``a.bin`` fails with EIO or ENOSPC.  Required (``tests/test_faults_unit.py``
asserts it per call, the report counts it): the error reaches the caller; the
path holds the old version, or - only when the failing call was the directory
fsync after the atomic rename - the complete new one, never anything partial;
staging is reclaimed; other paths keep working; recovery after a restart agrees.

One call may absorb its error by design: ENOSPC from setting the record on the staged file
(``records.XATTR``, engine/commit.py step 1) is what ext4 answers when the file's extended-attribute
block is full; the install then journals the record before the rename instead and succeeds.  That
outcome (no error, the complete new version, recovery agreeing) is counted as ``absorbed``.

A second one: a call after the install's directory fsync, i.e. the unsynced journal entry saying
the install is done (engine/commit.py step 6, written only when the record travelled with the file
and no intent was journaled).  The new version is in place and durable and its file carries its
record, so the save succeeded and the caller is told so (a warning is logged).  Counted as
``after_install``; it must leave the complete new version and a recovery that agrees.  ``keep``
(``--keep-generations``): with a kept generation the install journals an intent instead and
writes no such entry, so both are swept.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

from ckptfs import META_DIR
from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS
from ckptfs.records import XATTR
from ckptfs_testing.faults import FaultyStore

OLD = b"old-version " * 5000
NEW = b"NEW-VERSION! " * 9000
ERRORS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC}


def save(fs: CkptFS, path: str, data: bytes) -> None:
    fh = fs.open(path, os.O_WRONLY | os.O_TRUNC) if fs._lexists(path) else fs.create(path, 0o644)
    try:
        for off in range(0, len(data), 16384):
            fs.write(fh, data[off:off + 16384], off)
        fs.flush(fh)
    finally:
        fs.release(fh)


def read(fs: CkptFS, path: str) -> bytes:
    fh = fs.open(path, os.O_RDONLY)
    try:
        return fs.read(fh, 1 << 24, 0)
    finally:
        fs.release(fh)


def count_calls(d: Path, mode: str, keep: int | None = None) -> int:
    """Mutating backing calls of one overwrite (not the shutdown's compaction)."""
    d.mkdir()
    store = FaultyStore(OsBackingStore(str(d)))
    fs = CkptFS(store, commit_mode=mode, keep_generations=keep)
    save(fs, "a.bin", OLD)
    fs.fsyncdir("")
    store.arm(None)
    save(fs, "a.bin", NEW)
    fs.fsyncdir("")
    calls = store.calls
    fs.shutdown()
    return calls


def fail_call(d: Path, mode: str, err: int, n: int, keep: int | None = None) -> dict:
    """Overwrite with the n-th mutating call failing; return what the caller and disk saw."""
    d.mkdir()
    store = FaultyStore(OsBackingStore(str(d)))
    fs = CkptFS(store, commit_mode=mode, keep_generations=keep)
    save(fs, "a.bin", OLD)
    fs.fsyncdir("")
    store.arm(n, err)
    failed: OSError | None = None
    try:
        save(fs, "a.bin", NEW)
        fs.fsyncdir("")  # async mode reports commit-time failures here
    except OSError as e:
        failed = e
    content = read(fs, "a.bin")
    save(fs, "b.bin", b"other")
    others_ok = read(fs, "b.bin") == b"other"
    fs.shutdown()
    staging_left = os.listdir(d / META_DIR / "staging")
    fs2 = CkptFS(OsBackingStore(str(d)), keep_generations=keep)  # restart: recovery
    recovered = read(fs2, "a.bin")
    rec_size = fs2.records["a.bin"].size
    fs2.shutdown()
    return {"n": n, "fired": store.fired[0] if store.fired else None,
            "xattr": store.fired[1][1] if store.fired and store.fired[0] == "fsetxattr" else None,
            "errno": failed.errno if failed is not None else None,
            "content": "old" if content == OLD else "new" if content == NEW else "partial",
            "others_ok": others_ok, "staging_left": len(staging_left),
            "recovery_agrees": recovered == content and rec_size == len(content)}


def sweep(base: Path, mode: str, err: int, keep: int | None = None) -> list[dict]:
    """Every N from 1 to the overwrite's call count; one fresh directory each."""
    tag = f"{mode}-{err}-{keep}"
    total = count_calls(base / f"probe-{tag}", mode, keep)
    out = [fail_call(base / f"{tag}-{n}", mode, err, n, keep) for n in range(1, total + 1)]
    synced = [i for i, o in enumerate(out) if o["fired"] == "fsync_dir"]
    for i, o in enumerate(out):
        o["after_install"] = bool(synced) and i > synced[-1]
    return out


def absorbed(o: dict, err: int) -> bool:
    """The first designed exception (module docstring): ENOSPC setting the record on the staged
    file, the install journaled the record instead and completed."""
    return (o["fired"] == "fsetxattr" and o.get("xattr") == XATTR and err == errno.ENOSPC
            and o["errno"] is None and o["content"] == "new")


def after_install(o: dict) -> bool:
    """The second (module docstring): a call after the install was durable, the save succeeded."""
    return bool(o.get("after_install")) and o["errno"] is None and o["content"] == "new"


def violations(outcomes: list[dict], err: int) -> list[str]:
    """Per-call breaches of the invariants in the module docstring."""
    bad = []
    for o in outcomes:
        # the only fsync_dir of an install follows its rename; the calls after it follow the install
        after_rename = o["fired"] == "fsync_dir" or bool(o.get("after_install"))
        if o["fired"] is None:
            bad.append(f"call {o['n']} never happened")
        if absorbed(o, err) or after_install(o):
            pass  # (the journaled fallback, or the bookkeeping after a durable install: checked below)
        elif o["errno"] != err:
            bad.append(f"call {o['n']} ({o['fired']}): caller saw errno {o['errno']}, not {err}")
        if o["content"] == "partial" or (o["content"] == "new" and not after_rename and not absorbed(o, err)):
            bad.append(f"call {o['n']} ({o['fired']}): path holds {o['content']} content")
        if not o["others_ok"] or o["staging_left"] or not o["recovery_agrees"]:
            bad.append(f"call {o['n']} ({o['fired']}): others_ok={o['others_ok']} "
                       f"staging_left={o['staging_left']} recovery_agrees={o['recovery_agrees']}")
    return bad


def summary(outcomes: list[dict]) -> dict:
    """The report's columns for one (error, commit mode) sweep."""
    return {"calls_swept": len(outcomes), "errors_surfaced": sum(o["errno"] is not None for o in outcomes),
            "absorbed_by_fallback": sum(absorbed(o, errno.ENOSPC) for o in outcomes),
            "after_install": sum(after_install(o) for o in outcomes),
            "partial_visible": sum(o["content"] == "partial" for o in outcomes),
            "old_intact": sum(o["content"] == "old" for o in outcomes),
            "new_complete_after_rename": sum(o["content"] == "new" for o in outcomes),
            "staging_leaks": sum(o["staging_left"] > 0 for o in outcomes),
            "recovery_disagrees": sum(not o["recovery_agrees"] for o in outcomes),
            "ops": sorted({o["fired"] for o in outcomes if o["fired"]})}


def run(base: Path) -> dict:
    """The whole matrix: {EIO, ENOSPC} x {sync, async} x {no kept generation (the default for a
    file outside groups), --keep-generations 1}."""
    rows, bad = [], []
    quiet = logging.getLogger("ckptfs")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the injected errors are expected; their log lines are noise here
    try:
        for name, err in ERRORS.items():
            for mode in ("sync", "async"):
                for keep in (None, 1):
                    out = sweep(base, mode, err, keep)
                    rows.append({"error": name, "commit": mode, "keep_generations": keep or 0, **summary(out)})
                    bad += [f"{name}/{mode}/keep={keep}: {v}" for v in violations(out, err)]
    finally:
        quiet.setLevel(level)
    return {"campaign": "faults", "trials": sum(r["calls_swept"] for r in rows), "conditions": rows,
            "violations": bad, "date": time.strftime("%Y-%m-%d %H:%M")}
