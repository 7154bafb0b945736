"""The atomic-replace race (issue 24): a writer replaces ``NAME`` by ``write NAME.part; rename`` in a
loop while a reader opens, fstats and reads ``NAME`` in a loop, both as separate processes.

Natively the reader never fails: a rename over an existing name is one atomic step, so every open
finds the old file or the new one.  :func:`race` returns the counts for one name, so a test or the
campaign compares a mount with a native directory (and reports the writer's rate against native's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptfs_testing.mount import child_env

WRITER = r"""
import io, os, sys, time
d, name, secs, me = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
def content(n):
    if name.endswith(".pt"):
        import torch; b = io.BytesIO(); torch.save({"n": n}, b); return b.getvalue()
    if name.endswith(".safetensors"):
        import torch, safetensors.torch as st; return st.save({"n": torch.tensor([n])})
    return (b"step %d\n" % n) * 100
blobs = [content(i) for i in range(4)]
target = os.path.join(d, name); part = target + ".part" + me
if me == "0":
    with open(target, "wb") as f:
        f.write(blobs[0])
print("ready", flush=True)
sys.stdin.readline()
n = 0; end = time.monotonic() + secs
while time.monotonic() < end:
    with open(part, "wb") as f:
        f.write(blobs[n % 4])
    os.rename(part, target); n += 1
print(n, flush=True)
"""

READER = r"""
import json, os, sys, time
p, secs = sys.argv[1], float(sys.argv[2])
ok = 0; errs = {}; end = time.monotonic() + secs
while time.monotonic() < end:
    stage = "open"
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            stage = "fstat"; os.fstat(fd); stage = "read"
            data = b""
            while True:
                b = os.read(fd, 1 << 16)
                if not b:
                    break
                data += b
            if not data:
                raise OSError(0, "empty read")
        finally:
            os.close(fd)
        ok += 1
    except OSError as e:
        k = f"{stage}:{e.errno}"; errs[k] = errs.get(k, 0) + 1
print(json.dumps({"reads": ok, "errors": errs}), flush=True)
"""


def race(directory: Path, name: str, seconds: float = 3.0, writers: int = 1, readers: int = 1) -> dict:
    """{"renames", "reads", "errors": {"stage:errno": count}} for ``writers`` writers (each with its
    own ``.part`` name) and ``readers`` readers of one name, summed."""
    env = child_env()
    ws: list[subprocess.Popen] = []
    rs: list[subprocess.Popen] = []
    try:
        for i in range(writers):
            ws.append(subprocess.Popen([sys.executable, "-c", WRITER, str(directory), name, str(seconds), str(i)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
        for w in ws:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError(f"writer failed to start for {name}")
        for _ in range(readers):
            rs.append(subprocess.Popen([sys.executable, "-c", READER, str(directory / name), str(seconds)],
                                       stdout=subprocess.PIPE, text=True, env=env))
        for w in ws:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        renames = 0
        for w in ws:
            assert w.stdout is not None
            renames += int(w.stdout.readline().strip())
        reads, errors = 0, {}
        for r in rs:
            out, _ = r.communicate(timeout=seconds + 120)
            got = json.loads(out.strip().splitlines()[-1])
            reads += got["reads"]
            for k, v in got["errors"].items():
                errors[k] = errors.get(k, 0) + v
    finally:
        for p in ws + rs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return {"renames": renames, "reads": reads, "errors": errors}
