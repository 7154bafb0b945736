"""HF ``Trainer`` workload: tiny random GPT-2 (2 layers, vocab 64) built from a config, synthetic data.

train:  ``Trainer(save_steps=SAVE, save_total_limit=2)`` for ``steps`` steps into ``dir``;
        a callback appends ``begin`` (step + digest of model and optimizer state) when the
        Trainer is about to save, ``end`` after it saved and rotated (``on_save``).
resume: ``trainer.train(resume_from_checkpoint=True)`` - HF's own ``get_last_checkpoint``
        picks the checkpoint; at ``on_train_begin`` (model, optimizer and global_step
        restored) the result records the step and digest, then training stops.
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
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
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


def make_trainer(d: str, steps: int, save_every: int, seed: int, cb: TrainerCallback) -> Trainer:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=d, max_steps=steps, save_steps=save_every, save_total_limit=2, per_device_train_batch_size=4,
        learning_rate=1e-3, report_to=[], logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
        seed=seed, disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=Data(), callbacks=[cb])


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, step: int) -> dict:
    opt = optimizer.state_dict()["state"] if optimizer is not None else {}
    return fwlib.digest({"model": model.state_dict(), "opt": opt, "step": step})


class Marks(TrainerCallback):
    """begin/end ledger marks around each save (public callback API)."""

    def __init__(self, ledger: fwlib.Ledger) -> None:
        self.ledger = ledger

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):  # noqa: ANN001
        if control.should_save:
            self.ledger.append(ev="begin", step=state.global_step,
                               digest=state_digest(model, optimizer, state.global_step))

    def on_save(self, args, state, control, **kw):  # noqa: ANN001
        self.ledger.append(ev="end", step=state.global_step)


class Record(TrainerCallback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):  # noqa: ANN001
        fwlib.write_result(self.out, step=state.global_step, digest=state_digest(model, optimizer, state.global_step))
        raise Stop


def train(a: dict) -> None:
    t = make_trainer(a["dir"], a["steps"], a["save_every"], a.get("seed", 0), Marks(fwlib.Ledger(a["ledger"])))
    t.train()


def resume(a: dict) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    if not os.path.isdir(a["dir"]) or get_last_checkpoint(a["dir"]) is None:
        fwlib.write_result(a["out"], step=None, digest={})
        return
    t = make_trainer(a["dir"], a["steps"], a["save_every"], a.get("seed", 0), Record(a["out"]))
    try:
        t.train(resume_from_checkpoint=True)
    except Stop:
        pass


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS)
