"""Evaluation-job race (issue 25, item 4): a trainer saves checkpoint directories in a loop while
an evaluation job in its own process session (``setsid``, as a scheduler starts one) picks the
newest checkpoint by the trainer's own selection logic and loads every file in it.

Layouts (each trainer as its framework or a hand-written loop writes it):

* ``hf``: ``checkpoint-N/{pytorch_model.bin, optimizer.pt, scheduler.pt, trainer_state.json}``
  (``trainer_state.json`` last); the evaluator picks with HF's ``get_last_checkpoint`` rule (the
  highest ``checkpoint-N`` listed); rotation keeps two.
* ``ckpt_n``: ``ckpt_N/{model.pt, optim.pt, meta.pt}``, rotation by ``shutil.rmtree`` of
  ``ckpt_{N-2}``; the evaluator picks the highest ``ckpt_N`` listed.
* ``latest``: the ``ckpt_n`` loop, and the evaluator runs ``ckptfs latest`` (on the mount; the
  native control picks as ``ckpt_n`` does).

A load error is any exception while loading what the selection named (a directory listed before
its files exist, a file still being written, a directory rotated away between the pick and the
load): natively these happen; through ckptfs an open group is not listed to another job, so 0 is
the target.  Every load is also checked to hold the step its directory name says (no torn mix).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import ROOT, Mount, _env

TRAINER = r"""
import json, os, shutil, sys, time, torch
d, layout, secs, mib, train = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
n_el = int(mib * (1 << 20) / 4)
end = time.monotonic() + secs
step = 0
print("ready", flush=True)
while time.monotonic() < end:
    time.sleep(train)  # the training steps between two saves
    step += 1
    w = torch.full((n_el,), float(step))
    if layout == "hf":
        g = os.path.join(d, f"checkpoint-{step}")
        os.mkdir(g)
        torch.save({"w": w, "step": step}, os.path.join(g, "pytorch_model.bin"))
        torch.save({"m": w[: n_el // 2], "step": step}, os.path.join(g, "optimizer.pt"))
        torch.save({"lr": 0.1, "step": step}, os.path.join(g, "scheduler.pt"))
        with open(os.path.join(g, "trainer_state.json"), "w") as f:
            json.dump({"global_step": step}, f)
        old = os.path.join(d, f"checkpoint-{step - 2}")
    else:
        g = os.path.join(d, f"ckpt_{step}")
        os.mkdir(g)
        torch.save({"w": w, "step": step}, os.path.join(g, "model.pt"))
        torch.save({"m": w[: n_el // 2], "step": step}, os.path.join(g, "optim.pt"))
        torch.save({"step": step}, os.path.join(g, "meta.pt"))
        old = os.path.join(d, f"ckpt_{step - 2}")
    if os.path.isdir(old):
        shutil.rmtree(old)
print(step, flush=True)
"""

EVALUATOR = r"""
import json, os, re, subprocess, sys, time, torch
d, layout, secs, use_latest, ckptfs_cmd = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:]
pat = re.compile(r"checkpoint-(\d+)$" if layout == "hf" else r"ckpt_(\d+)$")
ok = 0; errors = {}; nothing = 0; end = time.monotonic() + secs
def pick():
    if use_latest:
        r = subprocess.run([*ckptfs_cmd, "latest", d], capture_output=True, text=True)
        p = r.stdout.strip()
        return p if r.returncode == 0 and p else None
    best = None
    for name in os.listdir(d):
        m = pat.fullmatch(name)
        if m and os.path.isdir(os.path.join(d, name)) and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), os.path.join(d, name))
    return best[1] if best else None
while time.monotonic() < end:
    g = pick()
    if g is None:
        nothing += 1; time.sleep(0.02); continue
    want = int(re.search(r"(\d+)$", g.rstrip("/")).group(1))
    try:
        names = (["pytorch_model.bin", "optimizer.pt", "scheduler.pt", "trainer_state.json"] if layout == "hf"
                 else ["model.pt", "optim.pt", "meta.pt"])
        for n in names:
            p = os.path.join(g, n)
            if n.endswith(".json"):
                got = json.load(open(p))["global_step"]
            else:
                got = torch.load(p, weights_only=True)["step"]
            if got != want:
                raise ValueError(f"{n} holds step {got}, its directory says {want}")
        ok += 1
    except Exception as e:
        k = type(e).__name__; errors[k] = errors.get(k, 0) + 1
    time.sleep(0.02)
print(json.dumps({"loads": ok, "errors": errors, "nothing_yet": nothing}), flush=True)
"""


def race(d: Path, layout: str, seconds: float, mib: float, use_latest: bool = False,
         train: float = 0.2) -> dict[str, Any]:
    """One trainer (``train`` seconds of training between saves) and one evaluator (its own
    session) for ``seconds``; their counts."""
    env = _env()
    t = subprocess.Popen([sys.executable, "-c", TRAINER, str(d), "hf" if layout == "hf" else "ckpt_n",
                          str(seconds), str(mib), str(train)], stdout=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    e = None
    try:
        assert t.stdout is not None
        if t.stdout.readline().strip() != "ready":
            raise RuntimeError("trainer failed to start")
        e = subprocess.Popen([sys.executable, "-c", EVALUATOR, str(d), "hf" if layout == "hf" else "ckpt_n",
                              str(seconds), "1" if use_latest else "0", sys.executable, "-m", "ckptfs"],
                             stdout=subprocess.PIPE, text=True, env=env, start_new_session=True, cwd=ROOT)
        saves = int(t.stdout.readline().strip())
        out, _ = e.communicate(timeout=seconds + 120)
        assert t.wait(60) == 0
    finally:
        for p in (t, e):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    return {"saves": saves, **json.loads(out.strip().splitlines()[-1])}


ROWS = [("hf", False), ("ckpt_n", False), ("ckpt_n", True)]


def run(seconds: float, mib: float, train: float = 0.2) -> list[dict[str, Any]]:
    """Every layout natively and through a fresh mount, back to back."""
    rows = []
    for layout, latest in ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            nat = Path(tmp) / "native"
            nat.mkdir()
            n = race(nat, layout, seconds, mib, train=train)
            d = Path(tmp) / "ckpts"
            d.mkdir()
            with Mount(d).start():
                m = race(d, layout, seconds, mib, use_latest=latest, train=train)
        rows.append({"layout": layout, "selection": "ckptfs latest" if latest else "listing", "native": n, "ckptfs": m})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], seconds: float, mib: float, train: float, commit: str) -> str:
    lines = [f"Written by `scripts/eval_race_campaign` (`campaigns/evalrace.py`), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}: a trainer saves "
             f"{mib:g} MiB checkpoints in a loop for {seconds:g} s ({train:g} s of training between saves, "
             "rotation keeps two) while an evaluation "
             "job in its own session picks the newest by the trainer's own logic every 20 ms and loads "
             "every file; natively, then through a fresh mount.", "",
             "| layout | selection | saves (native / ckptfs) | loads native | load errors native | "
             "loads ckptfs | load errors ckptfs |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        n, m = r["native"], r["ckptfs"]
        ne = sum(n["errors"].values())
        me = sum(m["errors"].values())
        sel = r["selection"] if r["selection"] == "listing" else "`ckptfs latest` (native: listing)"
        lines.append(f"| {r['layout']} | {sel} | {n['saves']} / {m['saves']} | {n['loads']} | {ne} "
                     f"{n['errors'] or ''} | {m['loads']} | {me} {m['errors'] or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--mib", type=float, default=8.0)
    ap.add_argument("--train", type=float, default=0.2, help="seconds of training between two saves")
    ap.add_argument("--out", help="write the JSON rows here")
    a = ap.parse_args(argv)
    rows = run(a.seconds, a.mib, a.train)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    print(markdown(rows, a.seconds, a.mib, a.train, commit))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 1 if any(sum(r["ckptfs"]["errors"].values()) for r in rows) else 0
