"""torch.distributed.checkpoint workload: ``ws`` gloo ranks on CPU, FSDP-style sharded DTensors.

train:  the job forks ``ws`` rank processes (same process group as the job, so a kill of the
        job kills every rank); each joins a gloo group (FileStore outside the mount) and a
        1-D device mesh.  The state is a dict of DTensors sharded on dim 0 (model + Adam-like
        moments) plus a replicated step; it changes every step.  Every ``save_every`` steps all
        ranks call ``dcp.save(state, checkpoint_id=DIR/step-K)`` (FileSystemWriter); rank 0 then
        keeps the newest ``KEEP`` step dirs (torchtitan's ``keep_latest_k`` purge, rmtree).
        Rank 0 appends ``begin`` (digest of the full tensors) before and ``end`` after the save.
resume: torchtitan-style choice of the newest ``step-K`` dir (no completeness check of its own),
        ``dcp.load`` into freshly sharded tensors, rank 0 records the gathered digest.
"""

from __future__ import annotations

import os
import re
import shutil

import fwlib

fwlib.setup_env()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

ROWS, COLS = 256, 512  # 512 KiB per full fp32 tensor
KEEP = 2
STEP_RE = re.compile(r"^step-(\d+)$")


def full_state(step: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100003 + step)
    return {name: torch.randn(ROWS, COLS, generator=g) for name in ("model.w1", "model.w2", "opt.m", "opt.v")}


def sharded(full: dict[str, torch.Tensor], step: int, mesh) -> dict:  # noqa: ANN001
    rank, ws = mesh.get_local_rank(), mesh.size()
    rows = ROWS // ws
    st = {k: DTensor.from_local(v[rank * rows:(rank + 1) * rows].clone(), mesh, [Shard(0)], run_check=False)
          for k, v in full.items()}
    return {"state": st, "step": torch.tensor(step)}


def gathered_digest(state: dict) -> dict:
    return fwlib.digest({"state": {k: v.full_tensor() for k, v in state["state"].items()}, "step": state["step"]})


def newest_step(d: str) -> int | None:
    """torchtitan-style choice: the highest ``step-K`` directory."""
    steps = [int(m.group(1)) for n in (os.listdir(d) if os.path.isdir(d) else []) if (m := STEP_RE.match(n))]
    return max(steps) if steps else None


def rank_main(rank: int, a: dict, job: str) -> None:
    dist.init_process_group("gloo", init_method="file://" + a["store"], rank=rank, world_size=a["ws"])
    mesh = init_device_mesh("cpu", (a["ws"],))
    ledger = fwlib.Ledger(a["ledger"]) if rank == 0 and job == "train" else None
    seed = a.get("seed", 0)
    if job == "train":
        for step in range(1, a["steps"] + 1):
            state = sharded(full_state(step, seed), step, mesh)  # one "training step"
            if step % a["save_every"]:
                continue
            dg = gathered_digest(state)
            if ledger:
                ledger.append(ev="begin", step=step, digest=dg)
            dcp.save(state, checkpoint_id=os.path.join(a["dir"], f"step-{step}"))
            if rank == 0:
                kept = sorted(int(m.group(1)) for n in os.listdir(a["dir"]) if (m := STEP_RE.match(n)))
                for old in kept[:-KEEP]:
                    shutil.rmtree(os.path.join(a["dir"], f"step-{old}"))
            dist.barrier()
            if ledger:
                ledger.append(ev="end", step=step)
    else:
        step = newest_step(a["dir"])
        if step is None:
            if rank == 0:
                fwlib.write_result(a["out"], step=None, digest={})
        else:
            state = sharded({k: torch.zeros_like(v) for k, v in full_state(0, 0).items()}, -1, mesh)
            dcp.load(state, checkpoint_id=os.path.join(a["dir"], f"step-{step}"))
            dg = gathered_digest(state)
            if rank == 0:
                fwlib.write_result(a["out"], step=int(state["step"]), digest=dg)
    dist.destroy_process_group()


def run_ranks(a: dict, job: str) -> None:
    """Fork ``ws`` ranks, wait for all; raise if any failed."""
    if os.path.exists(a["store"]):
        os.unlink(a["store"])
    pids = []
    for r in range(a["ws"]):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                rank_main(r, a, job)
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                code = 3
            os._exit(code)
        pids.append(pid)
    bad = [st for st in (os.waitpid(p, 0)[1] for p in pids) if st != 0]
    if bad:
        raise RuntimeError(f"rank(s) failed: {bad}")


def train(a: dict) -> None:
    run_ranks(a, "train")


def resume(a: dict) -> None:
    run_ranks(a, "resume")


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS)
