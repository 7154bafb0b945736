"""The workloads of issue 6 (W1-W6), W7 (W1 by an already-atomic writer) and
W8 (everyday tools).  Each takes a directory (native or a ckptfs mount) and,
where it writes checkpoints, a write mode (one of the paper's three, or
``ckptfs`` = plain writes, the filesystem seals) and returns timings in seconds.

Invariant: every workload leaves its directory as it found it (it removes what
it wrote), so repetitions start from the same state.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

from .common import drop_caches, fsync_path, write_file


def w1(root: Path, mode: str, groups: int, durable_wait: bool) -> list[float]:
    """The paper's group: per group a directory with 128 KiB model + 64 KiB
    optimizer + rng JSON (native modes add MANIFEST + COMMIT).  Returns the
    latency of each group.  ``durable_wait``: async mount, the last group also
    waits for ``fsync(dir)`` (everything durable)."""
    model, opt = os.urandom(128 << 10), os.urandom(64 << 10)
    os.sync()  # start from a quiet disk (earlier modes' dirty pages written back)
    lat = []
    for g in range(groups):
        t0 = time.perf_counter()
        d = root / f"step_{g:06d}"
        d.mkdir()
        if mode == "atomic_dirsync":
            fsync_path(root, directory=True)
        parts = {"model.bin": model, "optim.bin": opt, "rng.json": json.dumps({"seed": g}).encode()}
        for name, data in parts.items():
            write_file(d / name, data, mode)
        if mode != "ckptfs":
            manifest = json.dumps({n: len(b) for n, b in parts.items()}).encode()
            write_file(d / "MANIFEST.json", manifest, mode)
            write_file(d / "COMMIT", b"ok", mode)
        lat.append(time.perf_counter() - t0)
    if durable_wait:
        t0 = time.perf_counter()
        fsync_path(root, directory=True)
        lat[-1] += time.perf_counter() - t0
    return lat


def w2(root: Path, sd: dict, mode: str, durable_wait: bool) -> dict[str, float]:
    """One torch.save of ``sd`` made durable at ``root/model.pt`` (kept for W4)."""
    import torch  # here, not at the top: a run without W2-W4 does not pay for importing torch

    p = root / "model.pt"
    os.sync()
    t0 = time.perf_counter()
    if mode in ("unsafe", "ckptfs"):
        torch.save(sd, p)
    else:
        tmp = root / "model.pt.tmp"
        with open(tmp, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        if mode == "atomic_dirsync":
            fsync_path(root, directory=True)
    stall = time.perf_counter() - t0
    if durable_wait:
        fsync_path(root, directory=True)
    return {"stall_s": stall, "durable_s": time.perf_counter() - t0}


def w3(root: Path, buf: memoryview, shards: int, mode: str, durable_wait: bool) -> float:
    """DCP-style save: ``buf`` split into ``shards`` files, then ``.metadata``
    last; per-file in the given mode.  Returns seconds until durable."""
    d = root / f"dcp_{shards}"
    per = len(buf) // shards
    os.sync()
    t0 = time.perf_counter()
    d.mkdir()
    if mode == "atomic_dirsync":
        fsync_path(root, directory=True)
    index = {}
    for i in range(shards):
        name = f"__{i}_0.distcp"
        write_file(d / name, buf[i * per:(i + 1) * per], mode)
        index[name] = per
    write_file(d / ".metadata", pickle.dumps({"storage": index, "planner": "bench"}), mode)
    if durable_wait:
        fsync_path(d, directory=True)
    took = time.perf_counter() - t0
    shutil.rmtree(d)
    return took


def w4(path: Path) -> dict[str, float]:
    """torch.load of ``path`` cold (page cache dropped, where permitted) and warm."""
    import torch

    out: dict[str, float] = {}
    cold = drop_caches()
    t0 = time.perf_counter()
    sd = torch.load(path, weights_only=True)
    out["cold_s" if cold else "first_s"] = time.perf_counter() - t0
    del sd
    t0 = time.perf_counter()
    sd = torch.load(path, weights_only=True)
    out["warm_s"] = time.perf_counter() - t0
    del sd
    return out


def w5_prepare(d: Path, n: int = 1000) -> None:
    """Create ``n`` small files in ``d`` (done natively, before mounting)."""
    d.mkdir()
    for i in range(n):
        with open(d / f"f{i:05d}", "wb") as f:
            f.write(b"x")


def w5(d: Path, rounds: int, xattr: bool = False) -> dict[str, float]:
    """Metadata rates in ``d`` (1000 entries): ops/s of stat, open+close, and
    readdirs/s of the whole directory; with ``xattr`` (ckptfs mounts only) also
    ops/s of ``getxattr(user.ckptfs.status)`` per file.  Median over ``rounds``."""
    names = [str(d / n) for n in sorted(os.listdir(d))]
    res: dict[str, list[float]] = {"stat_ops": [], "openclose_ops": [], "readdir_ops": []}
    if xattr:
        res["getxattr_ops"] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for p in names:
            os.stat(p)
        res["stat_ops"].append(len(names) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for p in names:
            os.close(os.open(p, os.O_RDONLY))
        res["openclose_ops"].append(len(names) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(10):
            assert len(os.listdir(d)) == len(names)
        res["readdir_ops"].append(10 / (time.perf_counter() - t0))
        if xattr:
            t0 = time.perf_counter()
            for p in names:
                os.getxattr(p, "user.ckptfs.status")
            res["getxattr_ops"].append(len(names) / (time.perf_counter() - t0))
    return {k: sorted(v)[len(v) // 2] for k, v in res.items()}


def w7(root: Path, groups: int) -> list[float]:
    """W1 written by an application that is already atomic: the paper's group
    (128 KiB model + 64 KiB optimizer + rng JSON + MANIFEST + COMMIT), every
    file written ``name.tmp``, fsynced, renamed over ``name``, directory fsynced
    (``write_file(..., "atomic_dirsync")``), the group directory's parent
    fsynced after ``mkdir``.  Run natively and through each mount: what ckptfs
    costs a writer that needs none of its help.  Returns per-group latencies."""
    return w1(root, "atomic_dirsync", groups, False)


TOOLS = ("tar_xf", "ls_lR", "du_s", "git_add", "rm_rf")
_GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-c", "init.defaultBranch=main"]


def tools_prepare(base: Path, dirs: int, files: int, seed: int = 6) -> Path:
    """Create ``base/tools.tar`` once: ``dirs`` directories of ``files`` files of
    1-4 KiB of random bytes each (the tree is removed; every mode extracts the
    same archive).  Returns the archive's path."""
    rng = random.Random(seed)
    src = base / "tools-src"
    for i in range(dirs):
        d = src / f"d{i:03d}"
        d.mkdir(parents=True)
        for j in range(files):
            (d / f"f{j:04d}.dat").write_bytes(rng.randbytes(rng.randint(1 << 10, 4 << 10)))
    tar = base / "tools.tar"
    subprocess.run(["tar", "cf", str(tar), "-C", str(src), "."], check=True)
    shutil.rmtree(src)
    return tar


def _durable_files(top: Path, since: float = 0.0) -> None:
    """Per-file durability, natively: every regular file under ``top`` modified at or after
    ``since`` fsynced, then its directory fsynced (one directory fsync per file, as a tool that
    made each file durable itself would: the yardstick of issue 27 for sync-mode tools)."""
    for dirpath, _dirs, files in os.walk(top):
        dfd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in files:
                p = os.path.join(dirpath, name)
                if os.lstat(p).st_mtime < since:
                    continue
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.fsync(dfd)
        finally:
            os.close(dfd)


def tools(root: Path, archive: Path, durable: bool = False) -> dict[str, float]:
    """Everyday tools on a small-file tree, one invocation each, seconds
    (wall clock of the subprocess): ``tar xf`` of ``archive`` into
    ``root/tree``, ``ls -lR`` of it (to /dev/null), ``du -s``, ``git add -A``
    in a fresh ``git init`` repository of the tree (the init is not timed),
    and ``rm -rf`` of the whole tree (the directory is left as found).
    ``durable`` (native only): each tool that writes is followed, within its time, by the per-file
    durability a sync-mode mount gives (``_durable_files``; after ``rm -rf``, the parent's fsync)."""
    tree = root / "tree"
    tree.mkdir()
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    out: dict[str, float] = {}

    def timed(key: str, argv: list[str], cwd: Path | None = None, then=None) -> None:
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
        if durable and then is not None:
            then()
        out[key] = time.perf_counter() - t0

    os.sync()
    timed("tar_xf", ["tar", "xf", str(archive), "-C", str(tree)], then=lambda: _durable_files(tree))
    timed("ls_lR", ["ls", "-lR", str(tree)])
    timed("du_s", ["du", "-s", str(tree)])
    subprocess.run([*_GIT, "init", "-q"], cwd=tree, env=env, check=True)
    t_git = time.time() - 1.0
    timed("git_add", [*_GIT, "add", "-A"], cwd=tree, then=lambda: _durable_files(tree / ".git", t_git))
    timed("rm_rf", ["rm", "-rf", str(tree)], then=lambda: fsync_path(root, directory=True))
    return out


def stream_write(p: Path, size_mib: int, sample) -> float:
    """Write ``size_mib`` MiB in 1 MiB writes (small client memory), close;
    call ``sample()`` every 64 MiB.  Returns seconds."""
    block = os.urandom(1 << 20)
    os.sync()
    t0 = time.perf_counter()
    with open(p, "wb") as f:
        for i in range(size_mib):
            f.write(block)
            if i % 64 == 0:
                sample()
    sample()
    took = time.perf_counter() - t0
    return took


_DD_RE = re.compile(r"([\d.]+) s, ([\d.]+) ([kMG]?B)/s")


def raw_disk(d: Path, size_mib: int) -> dict[str, float]:
    """Sequential durable write bandwidth of the backing disk with dd:
    buffered + fdatasync at the end, and O_DIRECT + fdatasync.  MB/s (10^6)."""
    out: dict[str, float] = {}
    f = d / "raw.dd"
    for label, flags in (("dd_fdatasync_MBps", ["conv=fdatasync"]),
                         ("dd_direct_MBps", ["oflag=direct", "conv=fdatasync"])):
        r = subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={size_mib}", *flags],
                           capture_output=True, text=True)
        m = _DD_RE.search(r.stderr)
        if r.returncode == 0 and m:
            out[label] = size_mib * (1 << 20) / float(m.group(1)) / 1e6
        f.unlink(missing_ok=True)
    return out


def disk_probe(d: Path, mib: int = 64) -> float:
    """The disk's state right now: MB/s of a ``mib`` MiB buffered write + fdatasync (dd).  The disk
    of this machine kind switches between two speeds; each W2/W3 pair records it."""
    return raw_disk(d, mib).get("dd_fdatasync_MBps", float("nan"))


def pairs(base: Path, sd: dict, buf: memoryview, n: int, shards: int) -> list[dict[str, float]]:
    """Issue 27's bulk-save measure: ``n`` back-to-back native/ckptfs pairs of W2 (sync: ckptfs-sync
    durable against native atomic_dirsync; async: ckptfs-async's stall against native unsafe) and
    of W3 with ``shards`` shards (sync), the order inside a pair alternating, the disk probed
    before each pair.  Returns one dict per pair."""
    out = []
    for i in range(n):
        row: dict[str, float] = {"disk_MBps": disk_probe(base / "atomic_dirsync")}
        for ref, mine, aw, key in (("atomic_dirsync", "ckptfs-sync", False, "durable_s"),
                                   ("unsafe", "ckptfs-async", True, "stall_s")):
            for m in ((ref, mine) if i % 2 == 0 else (mine, ref)):
                d = base / m / f"pair{i}"
                d.mkdir()
                x = w2(d, sd, "ckptfs" if m == mine else m, aw)
                row[f"w2_{m}_{key if m == mine else 'durable_s'}"] = x[key if m == mine else "durable_s"]
                os.unlink(d / "model.pt")
                if aw:
                    fsync_path(d, directory=True)  # the async backlog drained, untimed
        for m in (("atomic_dirsync", "ckptfs-sync") if i % 2 == 0 else ("ckptfs-sync", "atomic_dirsync")):
            d = base / m / f"pair{i}"
            row[f"w3_{m}_s"] = w3(d, buf, shards, "ckptfs" if m == "ckptfs-sync" else m, False)
        out.append(row)
        print(f"pair {i}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    return out
