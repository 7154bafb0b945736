"""Deterministic CPU training that checkpoints every few steps and resumes exactly.

``train(CKPT_DIR, TOTAL, ACKFILE, FINAL)`` (run by ``forkserver.py``, or
``python train.py CKPT_DIR TOTAL ACKFILE FINAL``):

* a small MLP with dropout, AdamW, a StepLR schedule, a DataLoader whose
  sampler is a resumable cursor (epoch, batch index; the epoch's permutation comes
  from its own seeded generator), input noise from numpy's global RNG and a random
  sign flip from Python's ``random``: every source of state a resume must restore;
* every ``EVERY`` steps: ``torch.save`` of model, optimizer, scheduler, cursor and
  the torch / numpy / python RNG states to ``CKPT_DIR/ckpt_<step>.pt``, then the
  ``latest`` pointer is rewritten in place, then ``ckpt_<step - 2*EVERY>`` is
  removed; then ``ckpt <step>`` is appended to ACKFILE (outside the checkpoint
  directory);
* on start: if ``latest`` exists, load that checkpoint and restore everything
  (``resume <step>`` is appended to ACKFILE); a pointer that names an unloadable
  checkpoint raises, so a torn checkpoint fails the run;
* at the end: ``torch.save({"model", "optim"}, FINAL)`` and ``done`` in ACKFILE.

Invariant the resume campaign checks: killed at any moment and resumed any
number of times, the final model and optimizer tensors are bit-identical to
those of an uninterrupted run.  ``omit`` drops parts of the restored state
(``rng``, ``cursor``), a negative control showing the comparison can fail.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

# at import: the first call imports torch._inductor (seconds), which a fork server pays once
torch.use_deterministic_algorithms(True)

SEED = 1234
N, D_IN, CLASSES, BATCH, EVERY = 512, 32, 10, 16, 5


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D_IN, generator=g)
    y = (x[:, :CLASSES] * 3).argmax(dim=1)
    return TensorDataset(x, y)


class CursorSampler(Sampler[int]):
    """Epoch ``epoch``'s permutation (seeded by the epoch), from sample ``start`` on."""

    def __init__(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(SEED + self.epoch))
        return iter(perm[self.start:].tolist())

    def __len__(self) -> int:
        return N - self.start


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(D_IN, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 128), nn.ReLU(),
                         nn.Dropout(0.2), nn.Linear(128, CLASSES))


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "numpy_rest": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    name, pos, has_gauss, gauss = s["numpy_rest"]
    np.random.set_state((name, s["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    py = s["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


def _ack(ackfile: str, line: str) -> None:
    fd = os.open(ackfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def train(ckpt_dir: str, total: int, ackfile: str, final: str, omit: list[str] | tuple[str, ...] = ()) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    random.seed(SEED)
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=40, gamma=0.8)
    step, epoch, batch_idx = 0, 0, 0
    pointer = os.path.join(ckpt_dir, "latest")
    if os.path.exists(pointer):
        with open(pointer) as f:
            step = int(f.read())
        ck = torch.load(os.path.join(ckpt_dir, f"ckpt_{step:06d}.pt"), weights_only=True)
        assert ck["step"] == step, (ck["step"], step)
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        sched.load_state_dict(ck["sched"])
        if "cursor" not in omit:
            epoch, batch_idx = ck["epoch"], ck["batch_idx"]
        if "rng" not in omit:
            set_rng_state(ck["rng"])
        _ack(ackfile, f"resume {step}")
    data = dataset()
    net.train()
    while step < total:
        # a private generator for the loader's base seed keeps the global RNG untouched
        loader = DataLoader(data, batch_size=BATCH, sampler=CursorSampler(epoch, batch_idx * BATCH),
                            generator=torch.Generator().manual_seed(0))
        for x, y in loader:
            x = x + 0.01 * torch.from_numpy(np.random.standard_normal(x.shape)).float()
            if random.random() < 0.5:
                x = -x
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            batch_idx += 1
            if step % EVERY == 0:
                save(ckpt_dir, step, net, opt, sched, epoch, batch_idx)
                _ack(ackfile, f"ckpt {step}")
            if step >= total:
                break
        else:
            epoch, batch_idx = epoch + 1, 0
    torch.save({"model": net.state_dict(), "optim": opt.state_dict()}, final)
    _ack(ackfile, "done")


def save(ckpt_dir: str, step: int, net: nn.Module, opt: torch.optim.Optimizer, sched: object, epoch: int,
         batch_idx: int) -> None:
    ck = {"step": step, "model": net.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
          "epoch": epoch, "batch_idx": batch_idx, "rng": rng_state()}
    torch.save(ck, os.path.join(ckpt_dir, f"ckpt_{step:06d}.pt"))
    with open(os.path.join(ckpt_dir, "latest"), "w") as f:
        f.write(str(step))
    old = os.path.join(ckpt_dir, f"ckpt_{step - 2 * EVERY:06d}.pt")
    if os.path.exists(old):
        os.unlink(old)


def tensors(final: str) -> dict[str, torch.Tensor]:
    """Every tensor of a FINAL file, keyed by its path in the state dicts."""
    sd = torch.load(final, weights_only=True)
    out = {f"model.{k}": v for k, v in sd["model"].items()}
    for pid, st in sd["optim"]["state"].items():
        out.update({f"optim.{pid}.{k}": v for k, v in st.items() if isinstance(v, torch.Tensor)})
    return out


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
