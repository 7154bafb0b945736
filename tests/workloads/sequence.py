"""Ordered checkpoint workload: shards, a pointer, rotation; acks what returned.

Step i (i = 0, 1, ...):
  1. torch.save(shard(i, k), DIR/shards/s_i_k.pt) for k < SHARDS (3)
  2. write DIR/latest.tmp = "i", rename it over DIR/latest
  3. unlink DIR/shards/s_{j}_*.pt for j <= i-2 (rotation)
  4. fsync(DIR)  (async mode: waits until everything above is durable)
  5. append "i" to ACKFILE (outside the mount) and fsync it

Usage: sequence.py DIR ACKFILE STEPS [START]   (steps START .. START+STEPS-1),
or ``run(DIR, ACKFILE, STEPS, START)`` from the fork server.  ``check_prefix_state``
is the checker for a directory this workload wrote and a crash interrupted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

SHARDS = 3


def shard(i: int, k: int) -> dict:
    return {"i": i, "k": k, "t": torch.full((4096 + 7 * i + k,), float(i)), "idx": torch.arange(i + 1)}


def check_shard(path: str, i: int, k: int) -> None:
    sd = torch.load(path, weights_only=True)
    ref = shard(i, k)
    assert sd["i"] == i and sd["k"] == k, path
    assert torch.equal(sd["t"], ref["t"]) and torch.equal(sd["idx"], ref["idx"]), path


def run(d: str, ackfile: str, steps: int, start: int = 0) -> None:
    os.makedirs(os.path.join(d, "shards"), exist_ok=True)
    ack = os.open(ackfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(start, start + steps):
        for k in range(SHARDS):
            torch.save(shard(i, k), os.path.join(d, "shards", f"s_{i}_{k}.pt"))
        # (SEQ_POINTER_TMP: another temporary name, whose rename journals a synced intent: fs.py I8)
        tmp = os.path.join(d, os.environ.get("SEQ_POINTER_TMP", "latest.tmp"))
        with open(tmp, "w") as f:
            f.write(str(i))
        os.replace(tmp, os.path.join(d, "latest"))
        # rotation keeps the last two steps; it also removes what a crash during
        # an earlier rotation left behind (steps < i-2), as a resumed trainer does
        for name in os.listdir(os.path.join(d, "shards")):
            if int(name[2:-3].split("_")[0]) <= i - 2:
                os.unlink(os.path.join(d, "shards", name))
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        os.write(ack, f"{i}\n".encode())
        os.fsync(ack)


def read_acks(ackfile: Path) -> list[int]:
    if not ackfile.exists():
        return []
    return [int(x) for x in ackfile.read_text().split()]


def check_prefix_state(d: Path, acked: list[int]) -> int:
    """Assert the workload's invariants on a (re)mounted dir; return latest.

    Prefix: the pointer never survives without all the shards it names, the step
    before it is complete, nothing beyond the step after the pointer exists,
    rotation only ran behind it, every visible shard loads bit-exact.
    Acknowledged: ``latest`` >= every acked step.
    """
    names = set(os.listdir(d))
    assert names <= {"shards", "latest", "latest.tmp", "latest.new"}, names
    latest = int((d / "latest").read_text()) if "latest" in names else -1
    if acked:
        assert latest >= max(acked), f"acked step {max(acked)} lost (latest={latest})"
    files = [n[2:-3].split("_") for n in os.listdir(d / "shards")] if "shards" in names else []
    present: dict[int, set[int]] = {}
    for i, k in ((int(a), int(b)) for a, b in files):
        check_shard(str(d / "shards" / f"s_{i}_{k}.pt"), i, k)  # every visible file is whole
        present.setdefault(i, set()).add(k)
    shards = set(present)
    full = set(range(SHARDS))
    if latest >= 0:
        assert present.get(latest) == full, (latest, present)
        assert latest == 0 or present.get(latest - 1) == full, (latest, present)
    assert all(i <= latest + 1 for i in shards), (latest, shards)
    # rotation: an acknowledged step's rotation is durable (nothing <= ack-2 survives).  In one
    # uninterrupted run this is "nothing below latest-2" (step latest-1 was acked before latest
    # began); across resumed runs, leftovers of two interrupted rotations may legitimately remain
    floor = max(acked) - 2 if acked else -1
    assert all(i > floor for i in shards), (latest, max(acked, default=None), shards)
    for tmp in {"latest.tmp", "latest.new"} & names:
        assert int((d / tmp).read_text()) in (latest, latest + 1)
    return latest


def main() -> None:
    start = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]), start)


if __name__ == "__main__":
    main()
