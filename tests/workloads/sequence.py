"""Ordered checkpoint workload: shards, a pointer, rotation; acks what returned.

Step i (i = 0, 1, ...):
  1. torch.save(shard(i, k), DIR/shards/s_i_k.pt) for k < SHARDS (3)
  2. write DIR/latest.tmp = "i", rename it over DIR/latest
  3. unlink DIR/shards/s_{i-2}_*.pt          (rotation, i >= 2)
  4. fsync(DIR)  (async mode: waits until everything above is durable)
  5. append "i" to ACKFILE (outside the mount) and fsync it

Usage: sequence.py DIR ACKFILE STEPS [START]   (steps START .. START+STEPS-1)
"""

from __future__ import annotations

import os
import sys

import torch

SHARDS = 3


def shard(i: int, k: int) -> dict:
    return {"i": i, "k": k, "t": torch.full((4096 + 7 * i + k,), float(i)), "idx": torch.arange(i + 1)}


def check_shard(path: str, i: int, k: int) -> None:
    sd = torch.load(path, weights_only=True)
    ref = shard(i, k)
    assert sd["i"] == i and sd["k"] == k, path
    assert torch.equal(sd["t"], ref["t"]) and torch.equal(sd["idx"], ref["idx"]), path


def main() -> None:
    d, ackfile, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    start = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    os.makedirs(os.path.join(d, "shards"), exist_ok=True)
    ack = os.open(ackfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(start, start + steps):
        for k in range(SHARDS):
            torch.save(shard(i, k), os.path.join(d, "shards", f"s_{i}_{k}.pt"))
        with open(os.path.join(d, "latest.tmp"), "w") as f:
            f.write(str(i))
        os.replace(os.path.join(d, "latest.tmp"), os.path.join(d, "latest"))
        if i >= 2:
            for k in range(SHARDS):
                os.unlink(os.path.join(d, "shards", f"s_{i - 2}_{k}.pt"))
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        os.write(ack, f"{i}\n".encode())
        os.fsync(ack)


if __name__ == "__main__":
    main()
