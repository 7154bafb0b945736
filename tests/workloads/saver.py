"""Writer workloads for kill campaigns: single-file torch.save and group saves,
through ckptfs or in one of the seed paper's three native write modes.

Run by ``forkserver.py`` (``call saver.save_gens [...]`` / ``call saver.save_group [...]``).

Modes (``mode`` argument):
  ``ckptfs`` / ``unsafe``   write the file in place (open with O_TRUNC, write) - what
                            frameworks do; through a ckptfs mount this is the whole story
  ``atomic_nodirsync``      write ``PATH.tmp``, fsync it, rename it over PATH
  ``atomic_dirsync``        the same, then fsync the parent directory

Content is deterministic (``state`` / ``shard``) so a checker can tell exactly
which generation or step a file holds and that it holds all of it.

Group layout in DIR (step s):  ``step_<s>/shard_<k>.pt`` (k < SHARDS), then
``step_<s>/manifest.json`` ({"step", "sizes"}), then the pointer ``latest``
("s"), then rotation removes ``step_<j>`` for every j <= s-2.  Resume logic: read ``latest``,
load that step's shards.  Invariant checked by ``check_group``: the pointer names
a step whose shards and manifest are all complete, and no visible shard or
manifest anywhere is torn.
"""

from __future__ import annotations

import json
import os

import torch

SIZE = int(os.environ.get("SAVER_NUMEL", str(2 << 20)))  # 2 Mi float32 = 8 MiB per save
SHARDS = 3
MODES = ("ckptfs", "unsafe", "atomic_nodirsync", "atomic_dirsync")


def state(gen: int) -> dict:
    return {"gen": gen, "w": torch.full((SIZE,), float(gen)), "b": torch.arange(64) + gen,
            "opt": [torch.full((1000,), float(-gen)) for _ in range(8)]}


def check(path: str) -> int:
    """Load path and return its generation; raise if it is not exactly state(gen)."""
    sd = torch.load(path, weights_only=True)
    g = sd["gen"]
    ref = state(g)
    assert torch.equal(sd["w"], ref["w"]) and torch.equal(sd["b"], ref["b"])
    assert all(torch.equal(a, b) for a, b in zip(sd["opt"], ref["opt"], strict=True))
    return g


def shard(step: int, k: int) -> dict:
    n = SIZE // SHARDS
    return {"step": step, "k": k, "t": torch.full((n + k,), float(step) + 0.25 * k), "i": torch.arange(k + step % 7)}


def check_shard(path: str, step: int, k: int) -> None:
    sd = torch.load(path, weights_only=True)
    ref = shard(step, k)
    assert sd["step"] == step and sd["k"] == k, (path, sd.get("step"), sd.get("k"))
    assert torch.equal(sd["t"], ref["t"]) and torch.equal(sd["i"], ref["i"]), path


def _fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(obj: object, path: str, mode: str) -> None:
    """torch.save obj (or write bytes) at path in ``mode`` (see module docstring)."""
    assert mode in MODES, mode
    if mode in ("ckptfs", "unsafe"):
        if isinstance(obj, bytes):
            with open(path, "wb") as f:
                f.write(obj)
        else:
            torch.save(obj, path)
        return
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        if isinstance(obj, bytes):
            f.write(obj)
        else:
            torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if mode == "atomic_dirsync":
        _fsync_dir(os.path.dirname(path))


def save_gens(path: str, gen0: int, count: int, mode: str = "ckptfs", marker: str | None = None) -> None:
    """torch.save generations gen0+1 .. gen0+count to path.  ``marker``: a FIFO to which one byte
    is written each time the file is open and its save about to begin (a test aims kills there)."""
    if marker is None:
        for g in range(gen0 + 1, gen0 + count + 1):
            write(state(g), path, mode)
        return
    mfd = os.open(marker, os.O_WRONLY)
    for g in range(gen0 + 1, gen0 + count + 1):
        obj = state(g)
        with open(path, "wb") as f:
            os.write(mfd, b"x")
            torch.save(obj, f)


def step_dir(d: str, step: int) -> str:
    return os.path.join(d, f"step_{step:06d}")


def save_group(d: str, step: int, mode: str = "ckptfs") -> None:
    """Write group ``step`` in d: shards, manifest, pointer, then rotate step-2 away."""
    sd = step_dir(d, step)
    os.makedirs(sd, exist_ok=True)
    if mode == "atomic_dirsync":
        _fsync_dir(d)
    sizes = {}
    for k in range(SHARDS):
        p = os.path.join(sd, f"shard_{k}.pt")
        write(shard(step, k), p, mode)
        sizes[f"shard_{k}.pt"] = os.path.getsize(p)
    write(json.dumps({"step": step, "sizes": sizes}).encode(), os.path.join(sd, "manifest.json"), mode)
    write(str(step).encode(), os.path.join(d, "latest"), mode)
    # keep the last two steps; also remove what an interrupted earlier rotation left behind
    for name in os.listdir(d):
        if name.startswith("step_") and int(name[5:]) <= step - 2:
            old = os.path.join(d, name)
            for n in os.listdir(old):
                os.unlink(os.path.join(old, n))
            os.rmdir(old)


def _check_manifest(path: str, step: int) -> None:
    with open(path, "rb") as f:
        m = json.loads(f.read())
    assert m["step"] == step, (path, m)
    d = os.path.dirname(path)
    for name, size in m["sizes"].items():
        assert os.path.getsize(os.path.join(d, name)) == size, (path, name)


def check_group(d: str) -> dict:
    """Resume from d as a trainer would, and inspect every visible file.

    Returns {"step": the step the pointer names and whose group loads bit-exact
    (None if resume fails), "error": why resume failed, "torn": visible shard or
    manifest files that are not complete, "tmp": leftover ``*.tmp`` files}.
    """
    out: dict = {"step": None, "error": None, "torn": [], "tmp": 0}
    names = os.listdir(d)
    for name in names:
        if name.endswith(".tmp"):
            out["tmp"] += 1
        if not name.startswith("step_"):
            continue
        s = int(name[5:])
        for f in os.listdir(os.path.join(d, name)):
            p = os.path.join(d, name, f)
            if f.endswith(".tmp"):
                out["tmp"] += 1
                continue
            try:
                if f == "manifest.json":
                    with open(p, "rb") as fh:
                        assert json.loads(fh.read())["step"] == s
                else:
                    check_shard(p, s, int(f[6:-3]))
            except Exception as e:  # noqa: BLE001 - any failure to load is a torn file
                out["torn"].append(f"{name}/{f}: {type(e).__name__}")
    try:
        with open(os.path.join(d, "latest"), "rb") as f:
            step = int(f.read())
        sd = step_dir(d, step)
        for k in range(SHARDS):
            check_shard(os.path.join(sd, f"shard_{k}.pt"), step, k)
        _check_manifest(os.path.join(sd, "manifest.json"), step)
        out["step"] = step
    except Exception as e:  # noqa: BLE001 - resume failed, whatever the reason
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    return out
