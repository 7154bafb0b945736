"""safetensors workload: one ``model.safetensors`` overwritten in place by ``save_file`` each save.

train:  every ``save_every`` steps ``safetensors.torch.save_file(state, DIR/model.safetensors)``
        (open O_TRUNC, write header + data, close; no fsync, no rename).
resume: ``safetensors.torch.load_file`` of that path; the step is a tensor in the file.
The ledger gets ``begin`` (digest) before and ``end`` after each ``save_file``.
"""

from __future__ import annotations

import os

import fwlib

fwlib.setup_env()

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

NAME = "model.safetensors"


def state(step: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100003 + step)
    return {"step": torch.tensor([step]), "emb": torch.randn(512, 256, generator=g),
            "w": torch.randn(256, 256, generator=g).to(torch.bfloat16), "b": torch.arange(step, step + 64)}


def train(a: dict) -> None:
    ledger = fwlib.Ledger(a["ledger"])
    os.makedirs(a["dir"], exist_ok=True)
    for step in range(1, a["steps"] + 1):
        if step % a["save_every"]:
            continue
        sd = state(step, a.get("seed", 0))
        ledger.append(ev="begin", step=step, digest=fwlib.digest(sd))
        save_file(sd, os.path.join(a["dir"], NAME))
        ledger.append(ev="end", step=step)


def resume(a: dict) -> None:
    p = os.path.join(a["dir"], NAME)
    if not os.path.exists(p):
        fwlib.write_result(a["out"], step=None, digest={})
        return
    sd = load_file(p)
    fwlib.write_result(a["out"], step=int(sd["step"][0]), digest=fwlib.digest(sd))


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS)
