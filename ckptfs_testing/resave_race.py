"""The re-save race (RS1, engine/sealedview.py): a trainer saves the same sealed ``checkpoint-1/``
again and again (``model.bin`` and ``optim.bin`` 10 ms apart, in place and by tmp + fsync + rename
in turn, then the marker ``trainer_state.json``) while evaluation jobs in their own sessions
(``setsid``) list it and read its three files as fast as they can.  A reader's pass during which the
group's seal did not change (its ``manifest_blake3``, read before and after) must show one save
whole: the three files of one step and no tmp file.  Used by ``scripts/resave_race_campaign`` and
``tests/test_group_evidence.py``.  Test tooling only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ckptfs_testing.mount import Mount, child_env

RESAVE_LOOP = r"""
import json, os, sys, time
root, secs = sys.argv[1], float(sys.argv[2])
g = root + "/checkpoint-1"
os.makedirs(g, exist_ok=True)
def put(p, data, atomic):
    if atomic:
        with open(p + ".tmp", "wb") as f:
            f.write(data); f.flush(); os.fsync(f.fileno())
        os.rename(p + ".tmp", p)
    else:
        with open(p, "wb") as f:
            f.write(data)
end = time.time() + secs
k = 0
while time.time() < end:
    k += 1
    atomic = k % 2 == 0
    for name in ("model.bin", "optim.bin"):
        put(g + "/" + name, (b"%08d" % k) * (4096 * (1 + k % 3)), atomic)
        time.sleep(0.01)
    put(g + "/trainer_state.json", json.dumps({"global_step": k}).encode(), False)
print(k)
"""

RESAVE_READER = r"""
import json, os, sys, time
root, secs = sys.argv[1], float(sys.argv[2])
g = root + "/checkpoint-1"
def seal():
    return json.loads(os.getxattr(g, "user.ckptfs.group"))["manifest_blake3"]
end = time.time() + secs
n = bad = same = mixed = errors = 0
errs = []
while time.time() < end:
    if "checkpoint-1" not in os.listdir(root):
        continue
    try:
        s1 = seal()
        names = sorted(os.listdir(g))
        vals = {}
        for name in ("model.bin", "optim.bin"):
            b = open(g + "/" + name, "rb").read()
            v = int(b[:8])
            if b != (b"%08d" % v) * (4096 * (1 + v % 3)):
                raise ValueError(f"{name} torn: {len(b)} bytes of {v}")
            vals[name] = v
        vals["state"] = json.load(open(g + "/trainer_state.json"))["global_step"]
        s2 = seal()
    except Exception as e:
        bad += 1; errors += 1; errs.append(f"{type(e).__name__}: {e}"[:200]); continue
    n += 1
    if s1 == s2:
        same += 1
        if len(set(vals.values())) != 1 or names != ["model.bin", "optim.bin", "trainer_state.json"]:
            bad += 1; mixed += 1; errs.append(f"mixed within one seal: {vals} names {names}")
print(json.dumps({"reads": n, "within_one_seal": same, "bad": bad, "mixed": mixed, "errors": errors,
                  "errs": errs[:5]}))
"""


def run(d: Path, seconds: float = 5.0, readers: int = 2, variant: str | None = None,
        extra_args: list[str] | None = None) -> dict[str, Any]:
    """One race on a fresh mount of ``d`` (made); its counts: ``saves``, ``passes``,
    ``passes_within_one_seal``, ``mixed`` (passes within one seal that mixed two saves) and
    ``errors`` (reader exceptions, by message), with examples."""
    d.mkdir(parents=True, exist_ok=True)
    secs = str(seconds)
    with Mount(d, variant=variant, extra_args=extra_args).start():
        w = subprocess.Popen([sys.executable, "-c", RESAVE_LOOP, str(d), secs], env=child_env(),
                             stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        rs = [subprocess.Popen(["setsid", "-w", sys.executable, "-c", RESAVE_READER, str(d), secs],
                               env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(readers)]
        saves = int(w.communicate(timeout=300)[0].strip())
        outs = [json.loads(r.communicate(timeout=300)[0]) for r in rs]
    return {"saves": saves, "passes": sum(o["reads"] for o in outs),
            "passes_within_one_seal": sum(o["within_one_seal"] for o in outs),
            "mixed": sum(o["mixed"] for o in outs), "errors": sum(o["errors"] for o in outs),
            "examples": [e for o in outs for e in o["errs"]][:5]}
