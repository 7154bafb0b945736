"""Reader/writer race workload (tests/test_readers.py): one process saves a checkpoint over the
same path N times, another loads the path in a loop.

    race.py write KIND PATH N MODE      # MODE: inplace | new (unlink, then save as a new file)
    race.py read KIND PATH STOPFILE OUT # loads until STOPFILE exists, then writes a JSON report

KIND: torch (torch.save/torch.load), torch-mmap (torch.load(mmap=True): MAP_PRIVATE), npy-mmap
(np.save / np.load(mmap_mode="r"): MAP_SHARED), safetensors (save_file/load_file: MAP_PRIVATE), dcp
(a DCP checkpoint directory, dcp.save/dcp.load; PATH is the directory).  Every version's tensors are filled with its
generation number, so a load is "some committed version" iff all its values are one generation.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import torch

NUMEL = 5 * 1024 * 1024 // 2  # two tensors of 10 MiB each: 20 MiB per version


def state(gen: int) -> dict[str, torch.Tensor]:
    return {"a": torch.full((NUMEL,), float(gen)), "b": torch.full((NUMEL,), float(gen))}


def save(kind: str, path: str, gen: int) -> None:
    if kind in ("torch", "torch-mmap"):
        torch.save(state(gen), path)
    elif kind == "npy-mmap":
        import numpy as np
        np.save(path, torch.cat(list(state(gen).values())).numpy())
    elif kind == "safetensors":
        from safetensors.torch import save_file
        save_file(state(gen), path)
    else:
        import torch.distributed.checkpoint as dcp
        dcp.save(state(gen), checkpoint_id=path)


def load(kind: str, path: str) -> dict[str, torch.Tensor]:
    if kind == "torch":
        return torch.load(path, weights_only=True)
    if kind == "torch-mmap":
        return {k: t.clone() for k, t in torch.load(path, weights_only=True, mmap=True).items()}
    if kind == "npy-mmap":
        import numpy as np
        a = torch.from_numpy(np.array(np.load(path, mmap_mode="r")))
        return {"a": a[:NUMEL], "b": a[NUMEL:]}
    if kind == "safetensors":
        from safetensors.torch import load_file
        return load_file(path)
    import torch.distributed.checkpoint as dcp
    sd = {"a": torch.empty(NUMEL), "b": torch.empty(NUMEL)}
    dcp.load(sd, checkpoint_id=path)
    return sd


def generation(sd: dict[str, torch.Tensor]) -> int | None:
    """The one generation all values carry, or None for a mixed (torn) load."""
    a, b = sd["a"], sd["b"]
    g = float(a[0])
    if a.shape != (NUMEL,) or b.shape != (NUMEL,) or not bool((a == g).all()) or not bool((b == g).all()):
        return None
    return int(g)


def write(kind: str, path: str, n: int, mode: str) -> None:
    for gen in range(1, n + 1):
        if mode == "new" and os.path.lexists(path):
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        save(kind, path, gen)


def read(kind: str, path: str, stopfile: str, out: str) -> None:
    rep = {"loads": 0, "errors": [], "absent": 0, "torn": 0, "gens": []}
    while not os.path.exists(stopfile):
        try:
            sd = load(kind, path)
        except FileNotFoundError:
            rep["absent"] += 1  # between an unlink and the next save's commit: not a load error
            time.sleep(0.002)
            continue
        except (Exception, BaseException) as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if kind == "dcp" and ("No such file or directory" in str(e) and "/.metadata" in str(e)
                                  or not os.path.exists(os.path.join(path, ".metadata"))):
                # DCP removes .metadata when a save over the directory starts (torch 2.13 overwrite=True),
                # and MODE=new the directory: no checkpoint there until the save ends, natively too
                rep["absent"] += 1
                continue
            msg = str(e)  # DCP's CheckpointException carries the rank's traceback: keep its last lines
            rep["errors"].append(f"{type(e).__name__}: {msg[:200]}" + (f" ... {msg[-400:]}" if len(msg) > 200 else ""))
            continue
        rep["loads"] += 1
        g = generation(sd)
        if g is None:
            rep["torn"] += 1
        else:
            rep["gens"].append(g)
    with open(out, "w") as f:
        json.dump(rep, f)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        read(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
