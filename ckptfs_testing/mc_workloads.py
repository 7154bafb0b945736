"""Workloads and known-bad protocol variants for the power-loss model checker.

A :class:`~ckptfs_testing.modelcheck.Workload` is a function driving CkptFS through a
:class:`~ckptfs_testing.modelcheck.Driver` plus a list of invariants on the recovered
visible tree.  The workloads (:data:`WORKLOADS`): single files, overwrites, checkpoint groups
sealed by a marker (HF), DCP steps, a pointer rotation, files added after a seal, re-saves of a
sealed group (rollback), and logs and checkpoints whose writers are killed (V2); a new one plugs in
by adding a builder there and, where needed, an
invariant such as :func:`group_whole`.

Every file written is a real ``torch.save`` archive (``.pt``), JSON, or opaque
bytes (DCP-like ``.distcp`` shards), so ckptfs's format checks run as in
production.  Versions of one path have equal sizes where possible, so a record
describing the wrong version cannot hide behind a size mismatch.

:class:`BadCommit` is test-only: the real commit path with one install step (or the namespace
op) overridden by a deliberate defect (``variant``), which the checker must catch.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
from collections.abc import Callable

import blake3

from ckptfs.engine.commit import CommitEngine
from ckptfs.fs import CkptFS
from ckptfs.layout import parent
from ckptfs_testing.modelcheck import Driver, Invariant, Workload

SHARDS = 3


def torch_bytes(seed: int, n: int = 256) -> bytes:
    """A real torch.save archive (same size for the same ``n``)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    buf = io.BytesIO()
    torch.save({"w": torch.randn(n, generator=g), "step": seed % 10}, buf)
    return buf.getvalue()


def opaque(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def b3(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


# --------------------------------------------------------------------------- invariants
def group_whole(marker: str) -> Invariant:
    """A directory holding ``marker`` (JSON {"files": {name: blake3}}) holds all those files, intact."""

    def check(vis: dict[str, tuple], contents: dict[str, bytes]) -> list[str]:
        out = []
        for path, v in vis.items():
            if os.path.basename(path) != marker or v[0] != "f":
                continue
            d = os.path.dirname(path)
            try:
                listed = json.loads(contents[path])["files"]
            except (ValueError, KeyError) as e:
                out.append(f"{path} unreadable: {e}")
                continue
            for name, digest in listed.items():
                p = f"{d}/{name}" if d else name
                if vis.get(p) != ("f", digest):
                    out.append(f"group {d or '.'} committed ({marker}) but {name} is "
                               f"{'missing' if p not in vis else 'not the listed version'}")
        return out

    return check


def pointer_valid(shards: dict[tuple[int, int], bytes]) -> Invariant:
    """``latest`` names a step whose shards are all present; the step before it was not rotated away."""

    def check(vis: dict[str, tuple], contents: dict[str, bytes]) -> list[str]:
        if "latest" not in vis:
            return []
        i = int(contents["latest"])
        out = []
        for step in (i, i - 1):
            for k in range(SHARDS):
                p = f"shards/s_{step}_{k}.pt"
                if step >= 0 and vis.get(p) != ("f", b3(shards[(step, k)])):
                    out.append(f"latest={i} but {p} is missing or wrong")
        return out

    return check


# --------------------------------------------------------------------------- workloads
def single(mode: str = "sync") -> Workload:
    """One torch.save of a new file."""
    data = torch_bytes(1, 1024)
    return Workload("single", mode, lambda d: d.save("model.pt", data))


def overwrite(mode: str = "sync", versions: int = 3) -> Workload:
    """Repeated torch.save over the same path (equal sizes).  With ``--keep-generations 1``: a file
    outside groups keeps no generation by default, and this workload is the one that checks an
    install that keeps one (intent, link, rename) for every crash state."""
    vs = [torch_bytes(10 + i, 1024) for i in range(versions)]

    def run(d: Driver) -> None:
        for v in vs:
            d.save("model.pt", v)
        if not d.sync:
            d.fsyncdir()

    return Workload("overwrite", mode, run, fs_kwargs={"keep_generations": 1})


def group(mode: str = "sync", steps: int = 2) -> Workload:
    """Checkpoint group per step: model.pt, optim.pt, then COMMIT (JSON listing both) last."""
    def run(d: Driver) -> None:
        for s in range(steps):
            files = {"model.pt": torch_bytes(100 + s), "optim.pt": torch_bytes(200 + s, 512)}
            d.mkdir(f"step_{s}")
            for name, data in files.items():
                d.save(f"step_{s}/{name}", data)
            commit = json.dumps({"files": {n: b3(b) for n, b in files.items()}}).encode()
            d.save(f"step_{s}/COMMIT", commit)
            if not d.sync:
                d.fsyncdir()

    return Workload("group", mode, run, [group_whole("COMMIT")])


def late(mode: str = "sync") -> Workload:
    """A sealed group (model.pt, optim.pt, COMMIT), then two files added to it after the seal (G10:
    HF's rng_state.pth after trainer_state.json): a crash never hides the sealed group."""
    def run(d: Driver) -> None:
        files = {"model.pt": torch_bytes(300), "optim.pt": torch_bytes(400, 512)}
        d.mkdir("step_0")
        for name, data in files.items():
            d.save(f"step_0/{name}", data)
        d.save("step_0/COMMIT", json.dumps({"files": {n: b3(b) for n, b in files.items()}}).encode())
        d.save("step_0/rng_state.pt", torch_bytes(500))
        d.save("step_0/notes.json", b'{"late": true}', fsync=not d.sync)

    return Workload("late" if mode == "sync" else "async_late", mode, run, [group_whole("COMMIT")])


def resave(mode: str = "sync", by_rename: bool = False) -> Workload:
    """A sealed group (model.pt, optim.pt, COMMIT), then a re-save into the same directory (both
    files rewritten, then COMMIT): a crash inside the re-save shows the first seal (G11).
    ``by_rename``: the re-save writes each file as ``.tmp`` and renames it over the old one."""
    def run(d: Driver) -> None:
        d.mkdir("step_0")
        for v in (0, 1):
            files = {"model.pt": torch_bytes(600 + v), "optim.pt": torch_bytes(700 + v, 512)}
            for name, data in files.items():
                if v and by_rename:
                    d.save(f"step_0/{name}.tmp", data)
                    d.rename(f"step_0/{name}.tmp", f"step_0/{name}")
                else:
                    d.save(f"step_0/{name}", data)
            d.save("step_0/COMMIT", json.dumps({"files": {n: b3(b) for n, b in files.items()}}).encode(),
                   fsync=not d.sync)

    name = "resave_rename" if by_rename else "resave"
    return Workload(name if mode == "sync" else "async_" + name, mode, run, [group_whole("COMMIT")])


def dcp(mode: str = "sync", steps: int = 2, shards: int = 6) -> Workload:
    """DCP-like save: ckpt/step_s/__i_0.distcp shards (opaque bytes), ``.metadata`` last."""
    def run(d: Driver) -> None:
        d.mkdir("ckpt")
        for s in range(steps):
            d.mkdir(f"ckpt/step_{s}")
            listed = {}
            for i in range(shards):
                data = opaque(1000 * s + i, 20000 + 1000 * i)
                d.save(f"ckpt/step_{s}/__{i}_0.distcp", data, chunk=8192)
                listed[f"__{i}_0.distcp"] = b3(data)
            # async mode: fsync(.metadata) acknowledges the whole step (commits are in close order)
            d.save(f"ckpt/step_{s}/.metadata", json.dumps({"files": listed}).encode(), fsync=not d.sync)

    return Workload("dcp", mode, run, [group_whole(".metadata")])


def atomic_group(mode: str = "sync", steps: int = 2) -> Workload:
    """W7, an application that is already atomic, saving a checkpoint group per step: ``mkdir
    step_s`` and an fsync of its parent, then each file (model.pt, optim.pt, and COMMIT last)
    written as ``name.tmp``, fsynced, renamed over ``name``, the directory fsynced.  Its renames
    are of temporary names inside an open group (I8 with R2: one sync each)."""
    def run(d: Driver) -> None:
        for s in range(steps):
            files = {"model.pt": torch_bytes(800 + s), "optim.pt": torch_bytes(900 + s, 512)}
            step = f"step_{s}"
            d.mkdir(step)
            d.fsyncdir()
            listed = {n: b3(b) for n, b in files.items()}
            for name, data in [*files.items(), ("COMMIT", json.dumps({"files": listed}).encode())]:
                d.save(f"{step}/{name}.tmp", data, fsync=True)
                d.rename(f"{step}/{name}.tmp", f"{step}/{name}")
                d.fsyncdir(step)

    return Workload("atomic_group" if mode == "sync" else "async_atomic_group", mode, run, [group_whole("COMMIT")])


def pointer_rotation(mode: str = "sync", steps: int = 4, compact_every: int = 12) -> Workload:
    """Per step: SHARDS torch.save shards, latest.tmp + rename over latest, unlink step-2, fsync(dir).

    Journal compaction every ``compact_every`` entries is switched on so its
    crash points are covered too.
    """
    shard_data = {(i, k): torch_bytes(1000 + 10 * i + k) for i in range(steps) for k in range(SHARDS)}

    def run(d: Driver) -> None:
        d.mkdir("shards")
        for i in range(steps):
            for k in range(SHARDS):
                d.save(f"shards/s_{i}_{k}.pt", shard_data[(i, k)])
            d.save("latest.tmp", str(i).encode())
            d.rename("latest.tmp", "latest")
            if i >= 2:
                for k in range(SHARDS):
                    d.unlink(f"shards/s_{i - 2}_{k}.pt")
            d.fsyncdir()

    name = "pointer_rotation" if mode == "sync" else "async_pointer_rotation"
    return Workload(name, mode, run, [pointer_valid(shard_data)], fs_kwargs={"compact_every": compact_every})


def append_log(mode: str = "sync") -> Workload:
    """Logs and checkpoints next to each other, their writers killed (V2): a log appended by a
    process killed with SIGKILL keeps its lines; a killed truncating rewrite of the log and a killed
    torch.save over model.pt and over a log-looking name that holds a checkpoint leave the old
    content."""
    def run(d: Driver) -> None:
        head = b"step,loss\n"
        d.save("train.log", head)
        model = torch_bytes(800, 512)
        d.save("model.pt", model)
        lines = b"".join(b"%d,%f\n" % (i, 1.0 / (i + 1)) for i in range(40))
        d.killed_writer("train.log", head, lines, append=True)  # kept
        d.killed_writer("train.log", head + lines, b"step,loss\n0,9\n", append=False)  # rewrite: not kept
        d.killed_writer("model.pt", model, torch_bytes(801, 512), append=False)  # complete, yet not kept
        d.killed_writer("model.pt", model, b"appended junk", append=True)  # a checkpoint file: not kept
        if not d.sync:
            d.fsyncdir()

    return Workload("append_log" if mode == "sync" else "async_append_log", mode, run)


def tree(mode: str = "async", files: int = 2) -> Workload:
    """Plain files (no checkpoint group) closed back to back in two directories, then a sync
    point; then an unlink, an overwrite and a new file, and another sync point.  Async mode holds
    the committer until each sync point (``Committer.held``), so the closes before it install as
    one group commit (engine/commit.py C5): a power loss leaves a prefix of them, and an unlink
    acknowledged after a batch stays done (no staging name comes back)."""
    first = {f"{d}/f{i}.dat": opaque(2000 + 10 * i + (d == "b"), 3000 + 500 * i) for i in range(files)
             for d in ("a", "b")}

    def run(d: Driver) -> None:
        if not d.sync:
            d.fs.commit.committer.held = True
        d.mkdir("a")
        d.mkdir("b")
        for path, data in first.items():
            d.save(path, data)
        d.fsyncdir("a")
        d.unlink("a/f0.dat")
        d.fsyncdir("a")  # (acknowledged with no group commit since: the batch's staging names are gone)
        d.save("b/f0.dat", opaque(2100, 2500))
        d.save("a/new.dat", opaque(2200, 1800))
        d.fsyncdir("b")

    return Workload("tree" if mode == "sync" else "async_tree", mode, run)


def held(w: Workload) -> Workload:
    """``w`` (async) with the committer held until each sync point: its closes install as group
    commits (engine/commit.py C5) deterministically."""
    inner = w.run

    def run(d: Driver) -> None:
        d.fs.commit.committer.held = True
        inner(d)

    return dataclasses.replace(w, name=with_async_name(w).name + "_held", run=run)


def workloads(scale: str = "bounded") -> list[Workload]:
    """The representative workloads; ``full`` is larger than ``bounded`` (the test suite's).  An
    async workload's name starts with ``async_``."""
    return [with_async_name(w) for w in _workloads(scale)]


def _workloads(scale: str) -> list[Workload]:
    if scale == "full":
        return [single(), overwrite(versions=4), group(steps=3), dcp(steps=3, shards=8),
                pointer_rotation(steps=6), pointer_rotation("async", steps=6),
                dcp("async", steps=3, shards=8), late(), late("async"), resave(), resave("async"),
                resave(by_rename=True), append_log(), append_log("async"), tree("async", files=3),
                held(group("async")), held(dcp("async", steps=2, shards=4)), held(pointer_rotation("async", steps=4)),
                atomic_group(steps=2), atomic_group("async", steps=2)]
    return [single(), overwrite(), group(steps=1), dcp(steps=2, shards=3), pointer_rotation(steps=3),
            pointer_rotation("async", steps=3), late(), resave(), append_log(), tree("async"),
            held(group("async", steps=1)), atomic_group(steps=1)]


def with_async_name(w: Workload) -> Workload:
    if w.mode == "async" and not w.name.startswith("async"):
        return dataclasses.replace(w, name="async_" + w.name)
    return w


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "single": single, "overwrite": overwrite, "group": group, "dcp": dcp, "pointer_rotation": pointer_rotation,
    "late": late, "resave": resave, "append_log": append_log, "atomic_group": atomic_group,
}


# --------------------------------------------------------------------------- known-bad variants
BAD_VARIANTS = (
    "no_dir_fsync",          # install: no fsync of the parent directory after the rename
    "rename_before_fsync",   # install: rename (and dir fsync) before the staged data is fsynced
    "rename_before_intent",  # install: rename before the journal intent is written
    "no_journal_sync",       # install: intent appended without fdatasync
    "ns_no_dir_fsync",       # namespace ops (rename/unlink/mkdir): directories not fsynced
    "temp_rename_no_dir_fsync",  # I8: a temporary name renamed over its name, directory not fsynced
    "prefix_any",            # V2 wrong: whatever a killed writer wrote is committed (checkpoints too)
    "record_not_carried",    # install: no intent, and the record is not set on the staged file (R1 broken)
    "no_settle",             # install: no intent, and unsynced journal entries (a group opened) not settled
    "seal_unsynced",         # G12: a first seal's journal entry appended without fdatasync
    "seal_not_deferred",     # G12: a first seal's unsynced files not made durable before a compaction
    "batch_no_intent",       # C5: a group commit's renames without its journal intent
    "batch_no_staging_sync",  # C5: staging/ not fsynced after a group commit's renames
)
#: variants only the weak model catches: ext4 orders metadata, so a missing directory fsync is
#: covered by the next fsync of anything, and a group commit's renames land in order, each with its
#: staging name gone (ordering bugs, caught under both, are the rest)
WEAK_ONLY = ("no_dir_fsync", "ns_no_dir_fsync", "temp_rename_no_dir_fsync", "batch_no_intent",
             "batch_no_staging_sync")


class BadCommit(CommitEngine):
    """The commit path with one deliberate protocol defect: one install step (engine/commit.py)
    or the namespace op overridden, the rest the real code.  TEST ONLY: proves the checker catches it."""

    variant = ""

    def carry_record(self, v, rec) -> bool:  # type: ignore[no-untyped-def]
        if self.variant == "record_not_carried":
            return len(rec.chunks) <= 64 * 32  # claims it travels, sets nothing
        if self.variant in ("rename_before_intent", "no_journal_sync"):
            return False  # defects of the journaled intent: every install takes that path (a record too
            # large to travel, a backing fs without user xattrs), as every install did before R1
        return super().carry_record(v, rec)

    def sync_data(self, v) -> None:  # type: ignore[no-untyped-def]
        if self.variant == "no_settle":
            self.journal.owed = False  # (install calls settle after this: it finds nothing owed)
        if self.variant != "rename_before_fsync":
            super().sync_data(v)

    def log_intent(self, v, entry):  # type: ignore[no-untyped-def]
        if self.variant == "rename_before_intent":
            super().put_in_place(v)
        if self.variant == "no_journal_sync":
            return self.journal.append(entry, sync=False)
        return super().log_intent(v, entry)

    def put_in_place(self, v) -> None:  # type: ignore[no-untyped-def]
        if self.variant != "rename_before_intent":
            super().put_in_place(v)

    def sync_name(self, v) -> None:  # type: ignore[no-untyped-def]
        if self.variant != "no_dir_fsync":
            super().sync_name(v)
        if self.variant == "rename_before_fsync":
            self.store.fsync(v.fd)  # the data only after the rename (and its directory) are durable

    def ns_op(self, entry: dict, do, dirs: list[str], after: bool = False) -> None:  # type: ignore[no-untyped-def]
        if self.variant == "temp_rename_no_dir_fsync" and after and entry.get("op") == "rename":
            dirs = []
        super().ns_op(entry, do, [] if self.variant == "ns_no_dir_fsync" else dirs, after)

    def log_batch(self, entry: dict) -> None:
        if self.variant != "batch_no_intent":
            super().log_batch(entry)

    def sync_batch_names(self, vs) -> None:  # type: ignore[no-untyped-def]
        if self.variant != "batch_no_staging_sync":
            super().sync_batch_names(vs)
            return
        for d in dict.fromkeys(parent(v.path) for v in vs):
            self.store.fsync_dir(d)


class BadCkptFS(CkptFS):
    """CkptFS whose commit engine is a :class:`BadCommit` (or, ``prefix_any``, whose killed-writer
    rule keeps every killed writer's bytes)."""

    variant = ""

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        if self.variant == "prefix_any":
            self.vis.keeps_prefix = lambda v, head: True  # type: ignore[method-assign]
        if self.variant == "seal_unsynced":
            append = self.journal.append

            def unsynced_seal(entry: dict, sync: bool = True) -> int:
                return append(entry, sync=sync and entry.get("op") != "group_seal")

            self.journal.append = unsynced_seal  # type: ignore[method-assign]
        if self.variant == "seal_not_deferred":
            self.journal.defer_durable = lambda names, directory: None  # type: ignore[method-assign]


def bad_factory(variant: str) -> type[CkptFS]:
    if variant not in BAD_VARIANTS:
        raise ValueError(variant)
    engine = type(f"BadCommit_{variant}", (BadCommit,), {"variant": variant})
    return type(f"Bad_{variant}", (BadCkptFS,), {"variant": variant, "commit_engine": engine})


def bad_workload(variant: str) -> Workload:
    """The workload that exposes ``variant``: an overwrite (install defects), a pointer update, or
    the group that exercises it."""
    if variant == "prefix_any":
        w = append_log()
    elif variant in ("no_settle", "seal_unsynced"):
        w = group(steps=1)
    elif variant.startswith("batch_"):
        w = tree("async")
    elif variant == "seal_not_deferred":
        w = dataclasses.replace(group(steps=2), fs_kwargs={"compact_every": 4})
    elif variant == "temp_rename_no_dir_fsync":
        w = atomic_group(steps=1)  # (renames of temporary names inside an unsealed group: I8)
    else:
        w = pointer_rotation(steps=1) if variant == "ns_no_dir_fsync" else overwrite(versions=2)
    return dataclasses.replace(w, name=f"{w.name}[bad:{variant}]", fs_factory=bad_factory(variant))
