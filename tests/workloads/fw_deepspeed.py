"""DeepSpeed-style workload written by a plain script (deepspeed itself is not installed).

Mirrors ``DeepSpeedEngine.save_checkpoint`` (deepspeed 0.1x): for tag ``global_stepK``:
  1. ``makedirs(DIR/global_stepK)``
  2. ``torch.save(model states, global_stepK/mp_rank_00_model_states.pt)``
  3. ``torch.save(optimizer shard r, global_stepK/zero_pp_rank_R_mp_rank_00_optim_states.pt)`` for each rank
  4. ``open(DIR/latest, "w").write(tag)`` - in place (truncate + write), no tmp + rename, no fsync
  5. (rotation, as Megatron/DS users script it) ``rmtree`` of tags older than the newest ``KEEP``
train:  resumes like DeepSpeed's ``load_checkpoint(tag=None)`` (read ``latest``, load that tag's
        files; ledger ``resumed``), then trains and saves every ``save_every`` steps; the ledger
        gets ``begin`` (digest of model + optimizer state) before step 1 and ``end`` after 5.
resume: the same load (or tag ``basename(ckpt)``); the restored state is written to ``out``.
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


def load(d: str, tag: str | None) -> tuple[int, torch.nn.Module, torch.optim.Optimizer, dict] | None:
    """DeepSpeed's ``load_checkpoint``: tag from ``latest`` unless given; None if there is no ``latest``."""
    if tag is None:
        if not os.path.isfile(os.path.join(d, "latest")):
            return None
        with open(os.path.join(d, "latest")) as f:
            tag = f.read().strip()
    ms = torch.load(os.path.join(d, tag, "mp_rank_00_model_states.pt"), weights_only=True)
    shards = [torch.load(os.path.join(d, tag, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"), weights_only=True)
              for r in range(ms["dp_world_size"])]
    m, opt = model_and_opt(0)
    m.load_state_dict(ms["module"])
    st = {"state": {}, "param_groups": shards[0]["optimizer_state_dict"]["param_groups"]}
    for sh in shards:
        st["state"].update(sh["optimizer_state_dict"]["state"])
    opt.load_state_dict(st)
    step = ms["global_steps"]
    return step, m, opt, state_digest(m, opt_shards(opt), step)


def train(a: dict) -> None:
    ledger = fwlib.Ledger(a["ledger"])
    os.makedirs(a["dir"], exist_ok=True)
    got = load(a["dir"], None)
    if got:
        step0, m, opt, dg = got
        ledger.append(ev="resumed", step=step0, digest=dg)
    else:
        step0, (m, opt) = 0, model_and_opt(a.get("seed", 0))
    for step in range(step0 + 1, a.get("steps", 10**6) + 1):
        g = torch.Generator().manual_seed(step)
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
    got = load(a["dir"], os.path.basename(a["ckpt"]) if a.get("ckpt") else None)
    if got is None:
        fwlib.write_result(a["out"], step=None, digest={})
    else:
        fwlib.write_result(a["out"], step=got[0], digest=got[3])


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS, lambda: fwlib.warm(train, resume))
