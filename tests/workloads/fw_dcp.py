"""torch.distributed.checkpoint workload: ``ws`` gloo ranks on CPU, FSDP-style sharded DTensors.

The job forks ``ws`` rank processes (in the job's process group, so killing the job kills every
rank); each joins a gloo group (FileStore outside the mount) and a 1-D CPU device mesh.  The state
is a dict of DTensors sharded on dim 0 (model + Adam-like moments) plus a replicated step.

train:  torchtitan-style resume: the highest ``step-K`` dir in ``dir`` (no completeness check of
        its own) is ``dcp.load``ed if there is one (ledger ``resumed``: digest of the gathered
        tensors); then each step updates the state from the previous one, and every ``save_every``
        steps all ranks ``dcp.save(state, checkpoint_id=DIR/step-K)`` (FileSystemWriter) and rank 0
        keeps the newest ``KEEP`` step dirs (torchtitan's ``keep_latest_k`` purge, rmtree).  Rank 0
        appends ``begin`` (digest) before and ``end`` after each save + purge.
resume: the same choice (or ``ckpt``), rank 0 writes the gathered digest to ``out``.
"""

from __future__ import annotations

import os
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import fwlib

fwlib.setup_env()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

ROWS, COLS = 256, 512  # 512 KiB per full fp32 tensor
NAMES = ("model.w1", "model.w2", "opt.m", "opt.v")
KEEP = 2


def shard(full: dict[str, torch.Tensor], step: int, mesh: DeviceMesh) -> dict:
    rank, rows = mesh.get_local_rank(), ROWS // mesh.size()
    st = {k: DTensor.from_local(v[rank * rows:(rank + 1) * rows].clone(), mesh, [Shard(0)], run_check=False)
          for k, v in full.items()}
    return {"state": st, "step": torch.tensor(step)}


def gather(state: dict) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in state["state"].items()}


def advance(full: dict[str, torch.Tensor], step: int, seed: int) -> dict[str, torch.Tensor]:
    """One "training step": the new state depends on the old one (a wrong load propagates)."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    return {k: v * 0.9 + torch.randn(ROWS, COLS, generator=g) for k, v in full.items()}


@dataclass(frozen=True)
class Layout:
    """How a DCP-based framework names, saves and retires its step checkpoints in ``dir``."""

    fmt: str  # the directory of step N: fmt.format(N)
    save: Callable[[str, dict, int], None]  # (path, state, rank): every rank calls it
    remove: Callable[[str], None] = shutil.rmtree  # rank 0, for each step beyond the newest KEEP
    prepare: Callable[[str], None] | None = None  # rank 0, before a train job chooses its checkpoint

    def steps(self, d: str) -> list[int]:
        rx = re.compile("^" + re.escape(self.fmt).replace(r"\{\}", r"(\d+)") + "$")
        return sorted(int(m.group(1)) for n in (os.listdir(d) if os.path.isdir(d) else []) if (m := rx.match(n)))

    def newest(self, d: str) -> str | None:
        """torchtitan-style choice: the highest step directory (no completeness check of its own)."""
        s = self.steps(d)
        return f"{d}/{self.fmt.format(s[-1])}" if s else None


DCP = Layout("step-{}", lambda path, state, rank: dcp.save(state, checkpoint_id=path))


def load(path: str, mesh: DeviceMesh) -> tuple[int, dict[str, torch.Tensor]]:
    state = shard({k: torch.zeros(ROWS, COLS) for k in NAMES}, -1, mesh)
    dcp.load(state, checkpoint_id=path)
    return int(state["step"]), gather(state)


def rank_job(rank: int, a: dict, job: str, layout: Layout = DCP) -> None:
    dist.init_process_group("gloo", init_method="file://" + a["store"], rank=rank, world_size=a["ws"])
    mesh = init_device_mesh("cpu", (a["ws"],))
    d, seed = a["dir"], a.get("seed", 0)
    if job == "train" and layout.prepare and rank == 0:
        layout.prepare(d)
    dist.barrier()
    chosen = a.get("ckpt") or layout.newest(d)
    step0, full = load(chosen, mesh) if chosen else (0, {k: torch.zeros(ROWS, COLS) for k in NAMES})
    dg = fwlib.digest({"state": full, "step": torch.tensor(step0)})
    if job == "resume":
        if rank == 0:
            fwlib.write_result(a["out"], step=step0 if chosen else None, digest=dg if chosen else {})
    else:
        ledger = fwlib.Ledger(a["ledger"]) if rank == 0 else None
        if ledger and chosen:
            ledger.append(ev="resumed", step=step0, digest=dg)
        for step in range(step0 + 1, a.get("steps", 10**6) + 1):
            full = advance(full, step, seed)
            if step % a["save_every"]:
                continue
            state = shard(full, step, mesh)
            saved = fwlib.digest({"state": gather(state), "step": state["step"]})  # a collective: every rank
            if ledger:
                ledger.append(ev="begin", step=step, digest=saved)
            layout.save(f"{d}/{layout.fmt.format(step)}", state, rank)
            if rank == 0:
                for old in layout.steps(d)[:-KEEP]:
                    layout.remove(f"{d}/{layout.fmt.format(old)}")
            dist.barrier()
            if ledger:
                ledger.append(ev="end", step=step)
    dist.destroy_process_group()


def rank_main(rank: int, a: dict, job: str) -> None:
    rank_job(rank, a, job, DCP)


def run_ranks(a: dict, job: str, main: Callable[[int, dict, str], None] | None = None) -> None:
    """Fork ``ws`` ranks running ``main`` (default: this workload's), wait for all; raise if any failed."""
    main = main or rank_main
    if os.path.exists(a["store"]):
        os.unlink(a["store"])
    pids = []
    for r in range(a["ws"]):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                main(r, a, job)
            except BaseException:  # noqa: BLE001
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
    # warm up in-process as a world of 1 (the group is destroyed again before any fork)
    fwlib.main_once(JOBS, lambda: fwlib.warm(lambda a: rank_main(0, a, "train"), lambda a: rank_main(0, a, "resume"),
                                             ws=1))
