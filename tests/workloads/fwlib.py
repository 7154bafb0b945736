"""Shared pieces of the framework workloads: environment, digests, ledger, fork server.

Invariants this module provides to the workloads and to the checkers:

* ``digest(obj)`` is a pure function of the *values* (dtype, shape, bytes) of
  every tensor and scalar in a nested dict/list structure, keyed by the path of
  each leaf; two states are bit-exact iff their digests are equal.
* ``Ledger.append`` returns only after the record is durable (``fsync``) in a
  file OUTSIDE the mount, so a killed workload never leaves a ledger claiming
  more than it did.  A workload appends ``begin`` (with the digest of the state
  it is about to save) before calling the framework's save and ``end`` only
  after that call returned.
* The fork server runs each job in a forked child that is the leader of its own
  process group, so ``os.killpg(pid, SIGKILL)`` kills the job with every rank /
  helper process it forked, as a scheduler's kill of a job would.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONWARNINGS": "ignore",
}


def setup_env() -> None:
    """Offline, single-threaded, quiet: call before importing torch/transformers/lightning."""
    os.environ.update(OFFLINE_ENV)
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)


def digest(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten ``obj`` into {leaf path: sha256 of dtype, shape and bytes (or repr for scalars)}."""
    import torch

    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            out.update(digest(obj[k], f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(digest(v, f"{prefix}[{i}]"))
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        out[prefix] = h.hexdigest()
    elif hasattr(obj, "numpy") and hasattr(obj, "dtype"):  # numpy arrays
        out[prefix] = hashlib.sha256(repr((str(obj.dtype), obj.shape)).encode() + obj.tobytes()).hexdigest()
    elif isinstance(obj, (int, float, str, bool)) or obj is None:
        out[prefix] = repr(obj)
    return out


class Ledger:
    """Append-only JSON-lines side channel outside the mount; every append is fsynced."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, **rec: Any) -> None:
        rec.setdefault("t", time.monotonic())
        rec.setdefault("wall", time.time())  # (a torn group's created_at is wall time: which attempt it was)
        os.write(self.fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fsync(self.fd)

    @staticmethod
    def read(path: str) -> list[dict]:
        """All complete records.  A record cut short by a kill (a fatal signal ends a multi-page
        ``write`` between pages) is ignored: at the end of the file, or glued to the front of the next
        process's record on the same line, which is then parsed from its own start."""
        if not os.path.exists(path):
            return []
        recs = []
        dec = json.JSONDecoder()
        with open(path, errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    continue
                line = line.strip()
                for i in [0] + [k for k in range(1, len(line)) if line.startswith('{"', k)]:
                    try:
                        rec, end = dec.raw_decode(line, i)
                    except ValueError:
                        continue
                    if end == len(line) and isinstance(rec, dict):
                        recs.append(rec)
                        break
        return recs


def write_result(path: str, **res: Any) -> None:
    """Write a job's result file atomically (tmp + rename + fsync), outside the mount."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


Job = Callable[[dict], None]


def serve(jobs: dict[str, Job]) -> None:
    """Fork server loop on stdin/stdout.

    ``run NAME JSON`` forks a child (own process group) that calls ``jobs[NAME](args)``
    and exits 0, or 3 on an exception (traceback on stderr); replies ``pid N``.  The child's
    stdout is redirected to stderr, so only the server writes the protocol channel.
    ``reap PID`` waits for that child and replies ``status S`` (raw wait status).
    """
    for line in sys.stdin:
        cmd, _, rest = line.strip().partition(" ")
        if cmd == "run":
            name, _, arg = rest.partition(" ")
            args = json.loads(arg)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                if args.get("own_session"):
                    os.setsid()  # a job of its own, as a scheduler's restart is (its own process group too)
                else:
                    os.setpgid(0, 0)
                os.dup2(2, 1)  # the job's prints must not reach the protocol channel
                code = 0
                try:
                    jobs[name](args)
                except BaseException:  # noqa: BLE001 - report everything, exit with a code
                    traceback.print_exc()
                    code = 3
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            print(f"pid {pid}", flush=True)
        elif cmd == "reap":
            _, status = os.waitpid(int(rest), 0)
            print(f"status {status}", flush=True)
        elif cmd == "ping":
            print("pong", flush=True)


def warm(train: Job, resume: Job, **extra: Any) -> None:
    """Run a tiny ``train`` + ``resume`` in this process, in a temporary directory.

    The fork server calls this once before serving: many libraries import lazily on first use
    (the first ``Adam.step`` costs ~5 s of imports here), and a forked child's imports are lost
    when it exits, so without it every trial would pay them inside the measured save window."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a = {"dir": os.path.join(tmp, "ckpt"), "ledger": os.path.join(tmp, "ledger"), "steps": 2, "save_every": 1,
             "out": os.path.join(tmp, "out"), "store": os.path.join(tmp, "store"), **extra}
        train(a)
        resume(a)


def main_once(jobs: dict[str, Job], warmup: Callable[[], None] | None = None) -> None:
    """``prog NAME JSON`` runs one job in this process (used by the strace tracer); else warm up and serve."""
    if len(sys.argv) >= 3:
        jobs[sys.argv[1]](json.loads(sys.argv[2]))
    else:
        if warmup is not None:
            import contextlib

            with contextlib.redirect_stdout(sys.stderr):  # stdout is the protocol channel
                warmup()
        serve(jobs)
