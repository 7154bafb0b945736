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
import shutil

import fw_dcp
import fwlib

fwlib.setup_env()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

SUFFIX = "-unfinished"


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


NEMO = fw_dcp.Layout("model--step={}", save, remove_checkpoint, remove_unfinished)


def rank_main(rank: int, a: dict, job: str) -> None:
    fw_dcp.rank_job(rank, a, job, NEMO)


def train(a: dict) -> None:
    fw_dcp.run_ranks(a, "train", rank_main)


def resume(a: dict) -> None:
    fw_dcp.run_ranks(a, "resume", rank_main)


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS, lambda: fwlib.warm(lambda a: rank_main(0, a, "train"), lambda a: rank_main(0, a, "resume"),
                                             ws=1))
