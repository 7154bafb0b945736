"""NeMo-style workload (NeMo itself is not installed): ``NeMoModelCheckpoint`` with a distributed
(torch_dist) checkpoint, ``ws`` gloo ranks on CPU, the tensors of ``fw_dcp``.

Mirrors NeMo 2.x ``NeMoModelCheckpoint._save_checkpoint`` / ``_remove_checkpoint`` and
``remove_unfinished_checkpoints``, for ``DIR/model--step=K`` (``ckpt_to_dir`` of ``…step=K.ckpt``):
  1. rank 0 creates the empty marker ``DIR/model--step=K-unfinished``; barrier
  2. rank 0 ``torch.save``s ``common.pt``; every rank ``dcp.save`` (shards, then ``.metadata`` by the
     coordinator); rank 0 writes ``metadata.json`` (Megatron-Core's sharded-backend config) last
  3. barrier; rank 0 removes the marker (the checkpoint is finished)
  4. top-k: rank 0 marks each older checkpoint unfinished, ``rmtree``s it, removes that marker
train:  at start, rank 0 deletes every checkpoint directory that has a marker, then the markers
        (NeMo's cleanup); resume from the highest ``model--step=K`` directory (ledger ``resumed``);
        then every ``save_every`` steps ``begin`` (digest) before 1 and ``end`` after 4.
resume: the same choice (or ``ckpt``); rank 0 writes the gathered digest to ``out``.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import fw_dcp
import fwlib

fwlib.setup_env()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

KEEP = 2
SUFFIX = "-unfinished"
DIR_RE = re.compile(r"^model--step=(\d+)$")


def marker(path: str) -> str:
    return path + SUFFIX


def remove_unfinished(d: str) -> None:
    """NeMo's ``remove_unfinished_checkpoints``: directories with a marker go, then the markers."""
    if not os.path.isdir(d):
        return
    markers = [n for n in os.listdir(d) if n.endswith(SUFFIX)]
    for n in markers:
        ck = os.path.join(d, n[: -len(SUFFIX)])
        if os.path.isdir(ck):
            shutil.rmtree(ck)
    for n in markers:
        os.remove(os.path.join(d, n))


def newest(d: str) -> str | None:
    steps = [int(m.group(1)) for n in (os.listdir(d) if os.path.isdir(d) else []) if (m := DIR_RE.match(n))]
    return f"{d}/model--step={max(steps)}" if steps else None


def save(path: str, state: dict, rank: int) -> None:
    if rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(marker(path), "w").close()
    dist.barrier()
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        torch.save({"step": int(state["step"]), "sharded_backend": "torch_dist"}, f"{path}/common.pt")
    dist.barrier()
    dcp.save(state, checkpoint_id=path)
    if rank == 0:
        with open(f"{path}/metadata.json", "w") as f:
            json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, f)
    dist.barrier()
    if rank == 0:
        os.remove(marker(path))


def remove_checkpoint(path: str) -> None:
    open(marker(path), "w").close()
    shutil.rmtree(path)
    os.remove(marker(path))


def rank_main(rank: int, a: dict, job: str) -> None:
    dist.init_process_group("gloo", init_method="file://" + a["store"], rank=rank, world_size=a["ws"])
    mesh = init_device_mesh("cpu", (a["ws"],))
    d, seed = a["dir"], a.get("seed", 0)
    if job == "train" and rank == 0:
        remove_unfinished(d)
    dist.barrier()
    chosen = a.get("ckpt") or newest(d)
    step0, full = fw_dcp.load(chosen, mesh) if chosen else (0, {k: torch.zeros(fw_dcp.ROWS, fw_dcp.COLS)
                                                                for k in fw_dcp.NAMES})
    dg = fwlib.digest({"state": full, "step": torch.tensor(step0)})
    if job == "resume":
        if rank == 0:
            fwlib.write_result(a["out"], step=step0 if chosen else None, digest=dg if chosen else {})
    else:
        ledger = fwlib.Ledger(a["ledger"]) if rank == 0 else None
        if ledger and chosen:
            ledger.append(ev="resumed", step=step0, digest=dg)
        for step in range(step0 + 1, a.get("steps", 10**6) + 1):
            full = fw_dcp.advance(full, step, seed)
            if step % a["save_every"]:
                continue
            state = fw_dcp.shard(full, step, mesh)
            saved = fwlib.digest({"state": fw_dcp.gather(state), "step": state["step"]})
            if ledger:
                ledger.append(ev="begin", step=step, digest=saved)
            save(f"{d}/model--step={step}", state, rank)
            if rank == 0:
                kept = sorted(int(m.group(1)) for n in os.listdir(d) if (m := DIR_RE.match(n)))
                for old in kept[:-KEEP]:
                    remove_checkpoint(f"{d}/model--step={old}")
            dist.barrier()
            if ledger:
                ledger.append(ev="end", step=step)
    dist.destroy_process_group()


def train(a: dict) -> None:
    fw_dcp.run_ranks(a, "train", rank_main)


def resume(a: dict) -> None:
    fw_dcp.run_ranks(a, "resume", rank_main)


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS, lambda: fwlib.warm(lambda a: rank_main(0, a, "train"), lambda a: rank_main(0, a, "resume"),
                                             ws=1))
