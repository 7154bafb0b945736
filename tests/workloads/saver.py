"""Fork server for kill campaigns: imports torch once, forks savers on demand.

Protocol on stdin/stdout, one line each:
  "save PATH GEN0 COUNT"  -> forks a child that torch.saves generations
                             GEN0+1 .. GEN0+COUNT to PATH; replies "pid N".
                             The child prints nothing; it exits 0 when done.
  "reap PID"              -> waits for the child; replies "status S".
Tensors for generation g are deterministic (see ``state``) so a checker can
tell exactly which generation a file holds.
"""

from __future__ import annotations

import os
import sys

import torch

SIZE = int(os.environ.get("SAVER_NUMEL", str(2 << 20)))  # 2 Mi float32 = 8 MiB per save


def state(gen: int) -> dict:
    return {"gen": gen, "w": torch.full((SIZE,), float(gen)), "b": torch.arange(64) + gen,
            "opt": [torch.full((1000,), float(-gen)) for _ in range(8)]}


def check(path: str) -> int:
    """Load path and return its generation; raise if it is not exactly state(gen)."""
    sd = torch.load(path, weights_only=True)
    g = sd["gen"]
    ref = state(g)
    assert torch.equal(sd["w"], ref["w"]) and torch.equal(sd["b"], ref["b"])
    assert all(torch.equal(a, b) for a, b in zip(sd["opt"], ref["opt"], strict=True))
    return g


def main() -> None:
    cache: dict[int, dict] = {}
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "save":
            path, gen0, count = cmd[1], int(cmd[2]), int(cmd[3])
            states = [cache.setdefault(g, state(g)) for g in range(gen0 + 1, gen0 + count + 1)]
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    for sd in states:
                        torch.save(sd, path)
                except BaseException:  # noqa: BLE001 - KeyboardInterrupt included
                    code = 1
                os._exit(code)
            print(f"pid {pid}", flush=True)
        elif cmd[0] == "reap":
            _, status = os.waitpid(int(cmd[1]), 0)
            print(f"status {status}", flush=True)
        if len(cache) > 64:
            cache.clear()


if __name__ == "__main__":
    main()
