"""safetensors workload: one ``model.safetensors`` overwritten by ``save_file`` at each save.

train:  loads ``DIR/model.safetensors`` if present (ledger ``resumed``), then each step derives the
        next state from the previous one; every ``save_every`` steps
        ``safetensors.torch.save_file(state, DIR/model.safetensors)`` (safetensors 0.8: hidden
        ``.tmpXXXXXX`` in the same dir, then rename; no fsync).  Ledger ``begin``/``end`` around it.
resume: ``safetensors.torch.load_file`` of that path (or ``ckpt``); the step is a tensor in the file.
"""

from __future__ import annotations

import os

import fwlib

fwlib.setup_env()

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

NAME = "model.safetensors"


def initial(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"step": torch.tensor([0]), "emb": torch.randn(512, 256, generator=g),
            "w": torch.randn(256, 256, generator=g).to(torch.bfloat16), "b": torch.arange(64)}


def advance(sd: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"step": torch.tensor([step]), "emb": sd["emb"] * 0.9 + torch.randn(512, 256, generator=g),
            "w": (sd["w"].float() * 0.5 + 1).to(torch.bfloat16), "b": sd["b"] + step}


def train(a: dict) -> None:
    ledger = fwlib.Ledger(a["ledger"])
    p = os.path.join(a["dir"], NAME)
    os.makedirs(a["dir"], exist_ok=True)
    if os.path.exists(p):
        sd = load_file(p)
        ledger.append(ev="resumed", step=int(sd["step"][0]), digest=fwlib.digest(sd))
    else:
        sd = initial(a.get("seed", 0))
    for step in range(int(sd["step"][0]) + 1, a.get("steps", 10**6) + 1):
        sd = advance(sd, step)
        if step % a["save_every"]:
            continue
        ledger.append(ev="begin", step=step, digest=fwlib.digest(sd))
        save_file(sd, p)
        ledger.append(ev="end", step=step)


def resume(a: dict) -> None:
    p = a.get("ckpt") or os.path.join(a["dir"], NAME)
    if not os.path.exists(p):
        fwlib.write_result(a["out"], step=None, digest={})
        return
    sd = load_file(p)
    fwlib.write_result(a["out"], step=int(sd["step"][0]), digest=fwlib.digest(sd))


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS, lambda: fwlib.warm(train, resume))
