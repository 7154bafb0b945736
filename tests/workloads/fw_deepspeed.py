"""DeepSpeed-style workload written by a plain script (deepspeed itself is not installed).

Mirrors ``DeepSpeedEngine.save_checkpoint`` (deepspeed 0.1x): for tag ``global_stepK``:
  1. ``makedirs(DIR/global_stepK)``
  2. ``torch.save(model states, global_stepK/mp_rank_00_model_states.pt)``
  3. ``torch.save(optimizer shard r, global_stepK/zero_pp_rank_R_mp_rank_00_optim_states.pt)`` for each rank
  4. ``open(DIR/latest, "w").write(tag)`` - in place (truncate + write), no tmp + rename, no fsync
  5. (rotation, as Megatron/DS users script it) ``rmtree`` of tags older than the newest ``KEEP``
resume: DeepSpeed's ``load_checkpoint(tag=None)``: read ``latest``, load that tag's files.
The ledger gets ``begin`` (digest of model + optimizer state) before step 1 and ``end`` after 5.
"""

from __future__ import annotations

import os
import re
import shutil

import fwlib

fwlib.setup_env()

import torch  # noqa: E402

SHARDS = 2
KEEP = 2
TAG_RE = re.compile(r"^global_step(\d+)$")


def model_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    return m, torch.optim.Adam(m.parameters(), lr=1e-3)


def opt_shards(opt: torch.optim.Optimizer) -> list[dict]:
    """ZeRO-like partition: parameter slots round-robin over SHARDS ranks."""
    st = opt.state_dict()
    return [{"optimizer_state_dict": {"state": {k: v for k, v in st["state"].items() if k % SHARDS == r},
                                      "param_groups": st["param_groups"]}, "partition": r} for r in range(SHARDS)]


def state_digest(m: torch.nn.Module, shards: list[dict], step: int) -> dict:
    return fwlib.digest({"module": m.state_dict(), "optim": [s["optimizer_state_dict"]["state"] for s in shards],
                         "step": step})


def save_checkpoint(d: str, m: torch.nn.Module, shards: list[dict], step: int) -> None:
    tag = f"global_step{step}"
    os.makedirs(os.path.join(d, tag), exist_ok=True)
    torch.save({"module": m.state_dict(), "global_steps": step, "dp_world_size": SHARDS},
               os.path.join(d, tag, "mp_rank_00_model_states.pt"))
    for r, sh in enumerate(shards):
        torch.save(sh, os.path.join(d, tag, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    with open(os.path.join(d, "latest"), "w") as fd:
        fd.write(tag)
    tags = sorted(int(mt.group(1)) for n in os.listdir(d) if (mt := TAG_RE.match(n)))
    for old in tags[:-KEEP]:
        shutil.rmtree(os.path.join(d, f"global_step{old}"))


def train(a: dict) -> None:
    m, opt = model_and_opt(a.get("seed", 0))
    ledger = fwlib.Ledger(a["ledger"])
    g = torch.Generator().manual_seed(1)
    os.makedirs(a["dir"], exist_ok=True)
    for step in range(1, a["steps"] + 1):
        x = torch.randn(16, 64, generator=g)
        loss = torch.nn.functional.mse_loss(m(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a["save_every"] == 0:
            shards = opt_shards(opt)
            ledger.append(ev="begin", step=step, digest=state_digest(m, shards, step))
            save_checkpoint(a["dir"], m, shards, step)
            ledger.append(ev="end", step=step)


def resume(a: dict) -> None:
    latest = os.path.join(a["dir"], "latest")
    if not os.path.isfile(latest):
        fwlib.write_result(a["out"], step=None, digest={})
        return
    with open(latest) as f:
        tag = f.read().strip()
    d = os.path.join(a["dir"], tag)
    ms = torch.load(os.path.join(d, "mp_rank_00_model_states.pt"), weights_only=True)
    shards = [torch.load(os.path.join(d, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"), weights_only=True)
              for r in range(ms["dp_world_size"])]
    m, opt = model_and_opt(0)
    m.load_state_dict(ms["module"])
    fwlib.write_result(a["out"], step=ms["global_steps"], tag=tag,
                       digest=state_digest(m, shards, ms["global_steps"]))


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS)
