"""Application side of the real-FUSE model-checker run: torch.save shards, a pointer, rotation.

Usage: mc_app.py DIR OPSFILE STEPS sync|async

Step i: torch.save SHARDS shards to DIR/shards/s_i_k.pt; write DIR/latest.tmp
and rename it over DIR/latest; unlink step i-2's shards; fsync(DIR).  Before
each operation it looks up DIR/.mc-begin-N, after an acknowledgement
DIR/.mc-ack-N (sync: close/rename/unlink returned; async: fsync(DIR)
returned).  OPSFILE receives the operations as JSON ([kind, path, blake3] /
[kind, src, dst]).
"""

from __future__ import annotations

import json
import os
import sys

import blake3
import torch

SHARDS = 2


def main() -> None:
    d, opsfile, steps, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ops: list[list] = []

    def begin(op: list) -> None:
        ops.append(op)
        os.path.exists(os.path.join(d, f".mc-begin-{len(ops)}"))

    def ack() -> None:
        os.path.exists(os.path.join(d, f".mc-ack-{len(ops)}"))

    def done() -> None:
        if commit == "sync":
            ack()

    def digest(path: str) -> str:
        with open(path, "rb") as f:
            return blake3.blake3(f.read()).hexdigest()

    begin(["mkdir", "shards"])
    os.mkdir(os.path.join(d, "shards"))
    done()
    for i in range(steps):
        for k in range(SHARDS):
            p = f"shards/s_{i}_{k}.pt"
            begin(["write", p, ""])
            torch.save({"i": i, "k": k, "t": torch.full((2048 + k,), float(i))}, os.path.join(d, p))
            done()
            ops[-1][2] = digest(os.path.join(d, p))
        begin(["write", "latest.tmp", blake3.blake3(str(i).encode()).hexdigest()])
        with open(os.path.join(d, "latest.tmp"), "w") as f:
            f.write(str(i))
        done()
        begin(["rename", "latest.tmp", "latest"])
        os.replace(os.path.join(d, "latest.tmp"), os.path.join(d, "latest"))
        done()
        if i >= 2:
            for k in range(SHARDS):
                begin(["unlink", f"shards/s_{i - 2}_{k}.pt"])
                os.unlink(os.path.join(d, "shards", f"s_{i - 2}_{k}.pt"))
                done()
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        ack()
    with open(opsfile, "w") as f:
        json.dump(ops, f)


if __name__ == "__main__":
    main()
