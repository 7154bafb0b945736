"""Multi-node DCP saves simulated on one machine: world size N (gloo), rank r writing through mount r.

``python -m ckptfs_testing.dcp_ranks --rank R --world N --port P --dir MOUNT_R --steps 1 2 [--mib M]``
is one rank: it joins the process group and, for each step, saves ``{"rank<r>.w": tensor}`` with
``torch.distributed.checkpoint.save`` into ``MOUNT_R/step_<s>`` (each rank its own
``__<r>_0.distcp``; rank 0 also ``.metadata``).  :func:`expected` regenerates every rank's tensor
of a step; :func:`check_loadable` loads a restored step directory without a process group and
compares bit for bit.  Used by tests/test_mirror.py and scripts/multinode_campaign.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def tensor(step: int, rank: int, mib: float):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(int(mib * (1 << 20)) // 4, generator=g)


def expected(step: int, world: int, mib: float) -> dict:
    return {f"rank{r}.w": tensor(step, r, mib) for r in range(world)}


def check_loadable(step_dir: str, step: int, world: int, mib: float) -> str:
    """"" if ``step_dir`` loads (DCP, no process group) to exactly the tensors saved at ``step``."""
    import torch
    import torch.distributed.checkpoint as dcp

    want = expected(step, world, mib)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    try:
        dcp.load(got, checkpoint_id=step_dir)
    except Exception as e:
        return f"load failed: {type(e).__name__}: {e}"
    bad = [k for k in want if not torch.equal(want[k], got[k])]
    return f"tensors differ: {bad}" if bad else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, nargs="+", required=True)
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between steps")
    a = ap.parse_args()
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world)
    try:
        for s in a.steps:
            state = {f"rank{a.rank}.w": tensor(s, a.rank, a.mib)}
            dcp.save(state, checkpoint_id=os.path.join(a.dir, f"step_{s}"))
            print(f"rank {a.rank} saved step {s}", flush=True)
            if a.pause:
                time.sleep(a.pause)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
