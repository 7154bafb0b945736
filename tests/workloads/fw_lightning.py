"""Lightning workload: ``ModelCheckpoint(save_top_k=2, save_last=True, every_n_train_steps=N)``.

train:  ``Trainer.fit(ckpt_path="last")`` (Lightning's own choice: newest ``last*.ckpt`` by mtime;
        starts fresh if there is none) of a tiny MLP up to ``steps`` steps; checkpoints
        ``step=K.ckpt`` (top 2 by step) and ``last.ckpt`` in ``dir``.  Ledger: ``resumed`` at
        ``on_train_start`` (weights, optimizer, global_step restored), ``begin`` (digest of model +
        optimizer state + global_step) before the stock ``on_train_batch_end`` (which saves and
        rotates) and ``end`` after it returned.  ``save_last`` may be ``"link"``.
resume: the same choice (or ``ckpt_path=ckpt``); the restored state is written to ``out``.
Unmodified Lightning code; the subclass only wraps the public hook.
"""

from __future__ import annotations

import fwlib

fwlib.setup_env()

import logging  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class Stop(Exception):
    """Raised once the restored state is recorded."""


def state_digest(module: pl.LightningModule, trainer: pl.Trainer) -> dict:
    opt = trainer.optimizers[0].state_dict()["state"] if trainer.optimizers else {}
    return fwlib.digest({"model": module.state_dict(), "opt": opt, "step": trainer.global_step})


class Net(pl.LightningModule):
    def __init__(self, out: str | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
        self.out = out

    def training_step(self, batch: tuple, idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def on_train_start(self) -> None:
        dg = state_digest(self, self.trainer)
        if self.out:
            loaded = self.trainer.ckpt_path is not None  # None: Lightning found no checkpoint, started fresh
            fwlib.write_result(self.out, step=self.trainer.global_step if loaded else None, digest=dg if loaded else {})
            raise Stop
        ledger = self.trainer.checkpoint_callback.ledger
        if ledger and self.trainer.global_step:
            ledger.append(ev="resumed", step=self.trainer.global_step, digest=dg)


class MarkedCheckpoint(ModelCheckpoint):
    """Stock ModelCheckpoint; ledger marks around its train-batch-end save."""

    def __init__(self, ledger: fwlib.Ledger | None, **kw) -> None:  # noqa: ANN003
        super().__init__(**kw)
        self.ledger = ledger

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        saving = self.ledger is not None and trainer.global_step % self._every_n_train_steps == 0
        if saving:
            self.ledger.append(ev="begin", step=trainer.global_step, digest=state_digest(pl_module, trainer))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if saving:
            self.ledger.append(ev="end", step=trainer.global_step)


def make(a: dict, ledger: fwlib.Ledger | None, max_steps: int) -> pl.Trainer:
    torch.manual_seed(a.get("seed", 0))
    ck = MarkedCheckpoint(ledger, dirpath=a["dir"], filename="{step}", save_top_k=2, monitor="step", mode="max",
                          save_last=a.get("save_last", True), every_n_train_steps=a["save_every"])
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, callbacks=[ck],
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.flip(1)), batch_size=8)


def train(a: dict) -> None:
    make(a, fwlib.Ledger(a["ledger"]), a.get("steps", 10**6)).fit(Net(), data(), ckpt_path="last")


def resume(a: dict) -> None:
    try:
        # room to train: fit() never reaches on_train_start once global_step >= max_steps
        make(a, None, 10**6).fit(Net(out=a["out"]), data(), ckpt_path=a.get("ckpt") or "last")
    except Stop:
        pass


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    fwlib.main_once(JOBS, lambda: fwlib.warm(train, resume))
