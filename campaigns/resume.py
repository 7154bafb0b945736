"""Resume-exactness campaign: kill -9 a training run at random times, resume, compare.

The workload is ``tests/workloads/train.py`` (deterministic CPU training with
dropout, AdamW, StepLR, a DataLoader cursor and torch/numpy/python RNG state,
checkpointing every 5 steps through the mount with a ``latest`` pointer).

1. Reference: one uninterrupted run in a plain directory.  Window W: the
   duration of one uninterrupted run through the mount (another directory).
2. Through a ckptfs mount: ``kills`` times, start the run (it resumes from the
   newest visible checkpoint), SIGKILL it after U(0, 2R/k) where R is W scaled
   to the steps still to go and k the kills still to do (so the kills spread over
   the whole run), reap it.  Then one run to completion.
3. Invariants: every resume found a loadable checkpoint (a run that cannot load
   what the pointer names exits non-zero), every resume is at or after the
   newest checkpoint the previous attempt had acknowledged, and the final model
   and optimizer tensors are bit-identical (``torch.equal``) to the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

from .common import ROOT, ForkServer, Mount, dump, interruptible, killed_by, machine, no_fuse_mounts_under, workload

train = workload("train")


def read_ack(ackfile: Path) -> list[tuple[str, int]]:
    if not ackfile.exists():
        return []
    out = []
    for ln in ackfile.read_text().splitlines():
        kind, _, n = ln.partition(" ")
        out.append((kind, int(n) if n else -1))
    return out


def compare(ref: str, got: str) -> list[str]:
    """Names of tensors that differ (or are missing) between two FINAL files."""
    import torch

    a, b = train.tensors(ref), train.tensors(got)
    bad = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
    return bad + [k for k in b if k not in a]


def run(kills: int, seed: int = 3, total: int = 300, omit: tuple[str, ...] = (), base: Path | None = None) -> dict:
    t0 = time.perf_counter()
    rng = random.Random(seed)
    own = base is None
    base = Path(tempfile.mkdtemp(prefix="ckptfs-resume-")) if base is None else base
    violations: list[str] = []
    ref_dir, d = base / "reference", base / "ckpts"
    ref_dir.mkdir(parents=True)
    d.mkdir()
    m = Mount(d)
    done_kills = interrupted = resumes = 0
    try:
        with ForkServer("train") as fs:
            fs.run("train.train", str(ref_dir), total, str(base / "ref.ack"), str(base / "ref.pt"))
            m.start()
            calib = d / "calibration"  # an uninterrupted run through the mount: its duration is the window
            calib.mkdir()
            window = fs.run("train.train", str(calib), total, str(base / "calib.ack"), str(base / "calib.pt"))
            shutil.rmtree(calib)
            aborts0 = json.loads(os.getxattr(str(d), "user.ckptfs.stats")).get("aborts", 0)
            ack = base / "run.ack"
            last_ckpt = progress = 0
            for k in range(kills + 1):
                final_run = k == kills
                if final_run:
                    progress = last_ckpt
                pid = fs.call("train.train", str(d), total, str(ack), str(base / "final.pt"), list(omit))
                if not final_run:
                    # spread the kills over what is left of the run: mean kill time = remaining / kills left
                    remaining = window * (total - last_ckpt) / total
                    time.sleep(rng.uniform(0.0, 2 * remaining / (kills - k)))
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                status = fs.reap(pid)
                lines = read_ack(ack)
                ack.unlink(missing_ok=True)
                if not final_run:
                    done_kills += 1
                    interrupted += killed_by(status) == signal.SIGKILL and ("done", -1) not in lines
                if killed_by(status) is None and status != 0:
                    violations.append(f"attempt {k}: run failed (wait status {status}): unloadable checkpoint?")
                for kind, n in lines:
                    if kind == "resume":
                        resumes += 1
                        if n < last_ckpt:
                            violations.append(f"attempt {k}: resumed at {n}, but step {last_ckpt} was acknowledged")
                    elif kind == "ckpt":
                        last_ckpt = max(last_ckpt, n)
                if ("done", -1) in lines and not final_run:
                    progress = last_ckpt
                    break  # finished before the remaining kills; counted honestly below
            aborts = json.loads(os.getxattr(str(d), "user.ckptfs.stats")).get("aborts", 0) - aborts0
            if not (base / "final.pt").exists():
                violations.append("final run did not finish")
            else:
                diff = compare(str(base / "ref.pt"), str(base / "final.pt"))
                if diff:
                    violations.append(f"final tensors differ from the uninterrupted run: {diff[:6]} "
                                      f"({len(diff)} tensors)")
            ntensors = len(train.tensors(str(base / "ref.pt")))
    finally:
        m.stop()
        if own:
            assert no_fuse_mounts_under(base), f"mount left under {base}"
            shutil.rmtree(base, ignore_errors=True)
    return {"campaign": "resume", "seed": seed, "trials": done_kills, "kills": done_kills,
            "killed_while_running": interrupted, "resumes": resumes, "total_steps": total,
            "step_reached_before_final_run": progress,
            "checkpoint_every": train.EVERY, "ckptfs_aborts": aborts, "tensors_compared": ntensors,
            "bit_identical": not any("differ" in v for v in violations), "omit": list(omit),
            "mounted_run_s": round(window, 2), "violations": violations, "machine": machine(),
            "wall_s": round(time.perf_counter() - t0, 1), "date": time.strftime("%Y-%m-%d %H:%M")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/resume_campaign", description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "raw" / "resume.json"))
    a = ap.parse_args(argv)
    interruptible()
    res = run(a.kills, seed=a.seed, total=a.steps)
    res["command"] = f"scripts/resume_campaign --kills {a.kills} --steps {a.steps} --seed {a.seed}"
    dump(res, a.json)
    return 1 if res["violations"] else 0
