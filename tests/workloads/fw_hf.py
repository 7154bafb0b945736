"""HF ``Trainer`` workload: tiny random GPT-2 (2 layers, vocab 64) built from a config, synthetic data.

train:  ``Trainer(save_steps=save_every, save_total_limit=2, max_steps=steps)`` into ``dir``,
        resuming with ``resume_from_checkpoint=True`` when HF's ``get_last_checkpoint`` finds one.
        Callbacks append to the ledger: ``resumed`` (step + digest of the restored model and
        optimizer state, at ``on_train_begin``), ``begin`` (same digest, when the Trainer is about
        to save) and ``end`` (after it saved and rotated, ``on_save``).
resume: the same resume, or ``resume_from_checkpoint=ckpt`` for an explicit group; the restored
        state is written to ``out`` and training stops.
Unmodified transformers code; only public ``TrainerCallback`` hooks are used.
"""

from __future__ import annotations

import os

import fwlib

fwlib.setup_env()

import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
SEQ = 16


class Stop(Exception):
    """Raised by the resume callback once the restored state is recorded."""


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 64, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, step: int) -> dict:
    opt = optimizer.state_dict()["state"] if optimizer is not None else {}
    return fwlib.digest({"model": model.state_dict(), "opt": opt, "step": step})


class Marks(TrainerCallback):
    """Ledger records through the public callback API; ``out`` set: record the restored state and stop."""

    def __init__(self, ledger: fwlib.Ledger | None, out: str | None = None) -> None:
        self.ledger, self.out = ledger, out

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):  # noqa: ANN001
        dg = state_digest(model, optimizer, state.global_step)
        if self.out:
            fwlib.write_result(self.out, step=state.global_step, digest=dg)
            raise Stop
        if self.ledger and state.global_step:
            self.ledger.append(ev="resumed", step=state.global_step, digest=dg)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):  # noqa: ANN001
        if control.should_save and self.ledger:
            self.ledger.append(ev="begin", step=state.global_step,
                               digest=state_digest(model, optimizer, state.global_step))

    def on_save(self, args, state, control, **kw):  # noqa: ANN001
        if self.ledger:
            self.ledger.append(ev="end", step=state.global_step)


def make_trainer(a: dict, cb: TrainerCallback) -> Trainer:
    seed = a.get("seed", 0)
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    args = TrainingArguments(
        output_dir=a["dir"], max_steps=a.get("steps", 10**6), save_steps=a["save_every"], save_total_limit=2,
        per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], logging_strategy="no", use_cpu=True,
        dataloader_num_workers=0, seed=seed, disable_tqdm=True,
    )
    return Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=Data(), callbacks=[cb])


def has_checkpoint(d: str) -> bool:
    return os.path.isdir(d) and get_last_checkpoint(d) is not None


def train(a: dict) -> None:
    make_trainer(a, Marks(fwlib.Ledger(a["ledger"]))).train(resume_from_checkpoint=has_checkpoint(a["dir"]) or None)


def resume(a: dict) -> None:
    ckpt = a.get("ckpt") or (True if has_checkpoint(a["dir"]) else None)
    if ckpt is None:
        fwlib.write_result(a["out"], step=None, digest={})
        return
    try:
        make_trainer(a, Marks(None, a["out"])).train(resume_from_checkpoint=ckpt)
    except Stop:
        pass


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS, lambda: fwlib.warm(train, resume))
