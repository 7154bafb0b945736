"""ckptfs benchmarks against the seed paper's three native write modes.

    python -m bench                                   # full run, writes docs/results/performance.md
    python -m bench --smoke --dir D --out D/perf.md   # tiny, for CI (no timing asserts)

Everything runs in one invocation on the same backing filesystem: the three
native modes (unsafe, atomic without / with directory fsync) in plain
directories and ckptfs in sync and async commit mode, each mounted in place
over its own directory, all interleaved per repetition.  Workloads (see
bench/workloads.py): W1 the paper's group, W2 one durable torch.save, W3 a
DCP-style sharded save, W4 torch.load cold/warm, W5 metadata rates, W6 daemon
RSS and CPU, plus the raw disk limit (dd).

Invariant: both daemons are unmounted and stopped by PID and the scratch
directory is removed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .common import CKPTFS, MODES, ROOT, Mount, daemon, fsync_path
from .report import write_markdown
from .workloads import raw_disk, stream_write, w1, w2, w3, w4, w5, w5_prepare


def _machine() -> dict[str, str]:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / (1 << 20)
    return {"cpu": cpu, "mem_gib": f"{mem:.0f}"}


def _fs_of(path: Path) -> tuple[str, str]:
    r = subprocess.run(["df", "--output=source,fstype", str(path)], capture_output=True, text=True)
    src, fstype = r.stdout.splitlines()[-1].split()
    return fstype, src


def run(a: argparse.Namespace, base: Path) -> dict:
    fstype, device = _fs_of(base)
    res: dict = {"groups": a.groups, "size_mib": a.size_mib, "reps": a.reps, "w6_mib": a.w6_mib,
                 "w3_shards": a.shards, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
                 "fstype": fstype, "device": device, **_machine(),
                 "modes": {m: {"w1": [], "w2": [], "w3": {str(n): [] for n in a.shards}, "w4": []} for m in MODES}}
    for m in MODES:
        (base / m).mkdir()
    for m in ("unsafe", *CKPTFS):
        w5_prepare(base / m / "w5")  # natively, before the mounts cover it
    res["raw_disk"] = raw_disk(base, a.size_mib)
    print("raw disk", res["raw_disk"], flush=True)
    daemons: dict[str, Mount] = {}
    try:
        for m in CKPTFS:
            daemons[m] = daemon(base / m, m.split("-")[1])
        sd = {"w": torch.randn((a.size_mib << 20) // 4 // 8, 8)}
        buf = memoryview(sd["w"].numpy()).cast("B")
        for rep in range(a.reps):
            for m in MODES:
                wmode = "ckptfs" if m in CKPTFS else m
                aw = m == "ckptfs-async"
                r = res["modes"][m]
                d = base / m / f"rep{rep}"
                d.mkdir()
                (d / "w1").mkdir()
                r["w1"].extend(w1(d / "w1", wmode, a.groups, aw))
                r["w2"].append(w2(d, sd, wmode, aw))
                if m in (*CKPTFS, "atomic_dirsync"):
                    r["w4"].append(w4(d / "model.pt"))
                os.unlink(d / "model.pt")
                for n in a.shards:
                    r["w3"][str(n)].append(w3(d, buf, n, wmode, aw))
                print(f"rep {rep} {m}: w1 p50 {1e3 * sorted(r['w1'])[len(r['w1']) // 2]:.2f} ms, w2 {r['w2'][-1]}, "
                      f"w3 {[r['w3'][str(n)][-1] for n in a.shards]}, w4 {r['w4'][-1] if r['w4'] else '-'}",
                      flush=True)
        del buf, sd
        res["w5"] = {m: w5(base / m / "w5", a.w5_rounds) for m in ("unsafe", *CKPTFS)}
        print("w5", res["w5"], flush=True)
        res["w6"] = {}
        for m, dm in daemons.items():
            before_cpu, before_bytes = dm.cpu_s(), dm.stats().get("bytes_written", 0)
            rss: list[int] = []
            took = stream_write(base / m / "w6.bin", a.w6_mib, lambda dm=dm, rss=rss: rss.append(dm.rss_kib()[0]))
            if m == "ckptfs-async":
                fsync_path(base / m, directory=True)
            cpu, written = dm.cpu_s(), dm.stats().get("bytes_written", 0)
            os.unlink(base / m / "w6.bin")
            res["w6"][m] = {
                "peak_rss_mib": dm.rss_kib()[1] / 1024, "stream_rss_max_mib": max(rss) / 1024,
                "stream_cpu_s_per_gib": (cpu - before_cpu) / ((written - before_bytes) / (1 << 30)),
                "run_cpu_s_per_gib": cpu / (written / (1 << 30)), "stream_s": took, "bytes_written": written,
            }
        print("w6", res["w6"], flush=True)
    finally:
        for dm in daemons.values():
            dm.stop()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--groups", type=int, default=400, help="W1 groups per repetition")
    ap.add_argument("--size-mib", type=int, default=1024, help="W2/W3/W4 checkpoint size")
    ap.add_argument("--shards", type=int, nargs="+", default=[64, 512], help="W3 shard counts")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (interleaved across modes)")
    ap.add_argument("--w5-rounds", type=int, default=5)
    ap.add_argument("--w6-mib", type=int, default=4096, help="W6 streamed file size")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--dir", default=None, help="backing filesystem to test (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "performance.md"))
    a = ap.parse_args()
    if a.smoke:
        a.groups, a.size_mib, a.shards, a.reps, a.w5_rounds, a.w6_mib = 10, 8, [4, 16], 1, 1, 16
    base = Path(tempfile.mkdtemp(prefix="ckptfs-bench-", dir=a.dir))
    try:
        res = run(a, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    cmd = "python -m bench " + " ".join(sys.argv[1:])
    write_markdown(res, out, cmd.strip())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
