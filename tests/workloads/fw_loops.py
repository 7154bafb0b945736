"""Hand-written checkpoint loops (no framework): what many training scripts do themselves.

``kind`` (an extra of the campaign's Framework) picks the loop:

* ``ckptn``: ``mkdir ckpt_N; torch.save(model, ckpt_N/model.pt); torch.save(optim, .../optim.pt);
  torch.save(meta, .../meta.pt)``, then ``shutil.rmtree`` of all but the newest two ``ckpt_*``.
  Resume: the highest ``ckpt_N`` listed, loading its three files (natively a kill between two files
  leaves a directory whose resume crashes: FileNotFoundError).
* ``inplace``: ``torch.save(state, model.pt)`` over the previous one, then ``latest.txt`` = N.
  Resume: ``model.pt``.
* ``seed-unsafe`` / ``seed-atomic``: the seed paper's group writer: ``epoch_N/model.bin``,
  ``epoch_N/optim.bin``, ``epoch_N/MANIFEST.json`` (sizes and sha256 of both), then
  ``epoch_N/COMMIT.json``; unsafe writes each in place, atomic writes each as ``.tmp`` + fsync +
  rename (and fsyncs the directory).  Resume: the highest ``epoch_N`` holding ``COMMIT.json``
  whose files match its MANIFEST.

Ledger ``begin`` (digest of the state) before a save, ``end`` after it returned (fwlib).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil

import fwlib

fwlib.setup_env()

import torch  # noqa: E402

DIR_RE = {"ckptn": re.compile(r"ckpt_(\d+)"), "seed-unsafe": re.compile(r"epoch_(\d+)"),
          "seed-atomic": re.compile(r"epoch_(\d+)")}


def initial(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(256, 256, generator=g), "b": torch.randn(256, generator=g)},
            "optim": {"m": torch.zeros(256, 256), "step": 0},
            "meta": {"step": 0, "lr": 0.1}}


def advance(s: dict, step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    w = s["model"]["w"] * 0.99 + torch.randn(256, 256, generator=g) * 0.01
    return {"model": {"w": w, "b": s["model"]["b"] + 1},
            "optim": {"m": s["optim"]["m"] * 0.9 + w * 0.1, "step": step},
            "meta": {"step": step, "lr": 0.1 * 0.99 ** step}}


def _steps(d: str, kind: str) -> list[int]:
    if not os.path.isdir(d):
        return []
    rx = DIR_RE[kind]
    return sorted(int(m.group(1)) for n in os.listdir(d) if (m := rx.fullmatch(n)))


def _blob(obj: object) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def _write(path: str, data: bytes, atomic: bool) -> None:
    if not atomic:
        with open(path, "wb") as f:
            f.write(data)
        return
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(d: str, kind: str, s: dict, step: int) -> None:
    if kind == "ckptn":
        g = os.path.join(d, f"ckpt_{step}")
        os.makedirs(g, exist_ok=True)
        for part in ("model", "optim", "meta"):
            torch.save(s[part], os.path.join(g, f"{part}.pt"))
    elif kind == "inplace":
        torch.save(s, os.path.join(d, "model.pt"))
        with open(os.path.join(d, "latest.txt"), "w") as f:
            f.write(f"{step}\n")
    else:
        atomic = kind == "seed-atomic"
        g = os.path.join(d, f"epoch_{step}")
        os.makedirs(g, exist_ok=True)
        blobs = {"model.bin": _blob(s["model"]), "optim.bin": _blob({"optim": s["optim"], "meta": s["meta"]})}
        for name, data in blobs.items():
            _write(os.path.join(g, name), data, atomic)
        manifest = {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in blobs.items()}
        _write(os.path.join(g, "MANIFEST.json"), json.dumps(manifest).encode(), atomic)
        _write(os.path.join(g, "COMMIT.json"), json.dumps({"step": step}).encode(), atomic)


def rotate(d: str, kind: str) -> None:
    if kind == "ckptn":
        for step in _steps(d, kind)[:-2]:
            shutil.rmtree(os.path.join(d, f"ckpt_{step}"))


def load(d: str, kind: str, ckpt: str | None = None) -> dict | None:
    """The loop's own resume logic; raises where it would crash (a torn checkpoint)."""
    if kind == "ckptn":
        steps = _steps(d, kind)
        g = ckpt or (os.path.join(d, f"ckpt_{steps[-1]}") if steps else None)
        if g is None:
            return None
        return {part: torch.load(os.path.join(g, f"{part}.pt")) for part in ("model", "optim", "meta")}
    if kind == "inplace":
        p = ckpt or os.path.join(d, "model.pt")
        return torch.load(p) if os.path.exists(p) else None
    cands = [ckpt] if ckpt else [os.path.join(d, f"epoch_{s}") for s in reversed(_steps(d, kind))]
    for g in cands:
        if not os.path.exists(os.path.join(g, "COMMIT.json")):
            continue
        with open(os.path.join(g, "MANIFEST.json")) as f:
            manifest = json.load(f)
        blobs = {}
        for name, want in manifest.items():
            with open(os.path.join(g, name), "rb") as f:
                blobs[name] = f.read()
            if hashlib.sha256(blobs[name]).hexdigest() != want["sha256"]:
                raise ValueError(f"{g}/{name} does not match its MANIFEST")
        opt = torch.load(io.BytesIO(blobs["optim.bin"]))
        return {"model": torch.load(io.BytesIO(blobs["model.bin"])), "optim": opt["optim"], "meta": opt["meta"]}
    return None


def train(a: dict) -> None:
    ledger = fwlib.Ledger(a["ledger"])
    kind = a["kind"]
    os.makedirs(a["dir"], exist_ok=True)
    s = load(a["dir"], kind)
    if s is not None:
        ledger.append(ev="resumed", step=s["meta"]["step"], digest=fwlib.digest(s))
    else:
        s = initial(a.get("seed", 0))
    for step in range(s["meta"]["step"] + 1, a.get("steps", 10**6) + 1):
        s = advance(s, step)
        if step % a["save_every"]:
            continue
        ledger.append(ev="begin", step=step, digest=fwlib.digest(s))
        save(a["dir"], kind, s, step)
        ledger.append(ev="end", step=step)
        rotate(a["dir"], kind)


def resume(a: dict) -> None:
    s = load(a["dir"], a["kind"], a.get("ckpt"))
    if s is None:
        fwlib.write_result(a["out"], step=None, digest={})
        return
    fwlib.write_result(a["out"], step=s["meta"]["step"], digest=fwlib.digest(s))


JOBS = {"train": train, "resume": resume}

if __name__ == "__main__":
    import sys

    kind = os.environ.get("CKPTFS_LOOP_KIND", "ckptn")
    fwlib.main_once(JOBS, lambda: fwlib.warm(train, resume, kind=kind))
    sys.exit(0)
