"""Generic fork server for kill campaigns: imports torch once, forks workers on demand.

Usage: forkserver.py MODULE...   (modules from this directory, imported once up front)

Protocol on stdin/stdout, one line each (the server first prints "ready"):
  "call MODULE.FUNC JSON_ARGS" -> forks a child that runs FUNC(*args) and exits 0
                                 (1 on any exception, KeyboardInterrupt included);
                                 replies "pid N".  The child's stdout goes to
                                 /dev/null so it can never corrupt the protocol.
  "reap PID"                   -> waits for the child; replies "status S" (raw wait status).

Invariant: the server itself never touches the files the workers write, so a
SIGKILLed child is the only thing interrupted by a campaign's kill.  Torch runs
single-threaded (``set_num_threads(1)``) in every child, which also makes the
training workload deterministic.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import sys
import traceback

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _child(func: str, args: list) -> None:
    code = 0
    # a job started in the background by a non-interactive shell inherits SIGINT ignored; the
    # trials need Python's own handler (Ctrl-C inside torch.save -> KeyboardInterrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        mod, _, name = func.rpartition(".")
        getattr(importlib.import_module(mod), name)(*args)
    except BaseException:  # noqa: BLE001 - KeyboardInterrupt included
        traceback.print_exc()
        code = 1
    os._exit(code)


def warm_up() -> None:
    """Do torch.save/torch.load once here, so children do not each pay the lazy imports."""
    buf = io.BytesIO()
    torch.save({"t": torch.zeros(4), "n": [1]}, buf)
    buf.seek(0)
    torch.load(buf, weights_only=True)


def main() -> None:
    for mod in sys.argv[1:]:
        importlib.import_module(mod)
    warm_up()
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, rest = line.strip().partition(" ")
        if cmd == "call":
            func, _, args = rest.partition(" ")
            pid = os.fork()
            if pid == 0:
                _child(func, json.loads(args or "[]"))
            print(f"pid {pid}", flush=True)
        elif cmd == "reap":
            _, status = os.waitpid(int(rest), 0)
            print(f"status {status}", flush=True)
        else:
            print(f"error unknown command {cmd!r}", flush=True)


if __name__ == "__main__":
    main()
