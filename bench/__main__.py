"""ckptfs benchmarks against the seed paper's three native write modes.

    python -m bench                                   # full run, writes docs/results/performance.md
    python -m bench --only W1,W7                      # a subset (raw,W1..W8; W8 = tools)
    python -m bench --smoke --dir D --out D/perf.md   # tiny, for CI (no timing asserts)

Everything runs in one invocation on the same backing filesystem: the three
native modes (unsafe, atomic without / with directory fsync) in plain
directories and ckptfs, each mounted in place over its own directory: sync and
async commit on the kernel transport (``--transport kernel``: our /dev/fuse
session, kernel caching, passthrough) and sync commit on the libfuse path
(``--transport mfusepy``), all interleaved per repetition.  Workloads (see
bench/workloads.py): W1 the paper's group, W2 one durable torch.save, W3 a
DCP-style sharded save, W4 torch.load cold/warm, W5 metadata rates, W6 daemon
RSS and CPU, W7 W1 written by an already-atomic writer, W8 everyday tools (tar,
ls -lR, du, git add, rm -rf on a small-file tree), plus the raw disk limit (dd).

Invariant: every daemon is unmounted and stopped by PID and the scratch
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
from importlib.metadata import version
from pathlib import Path

from .common import CKPTFS, MODES, MOUNTS, ROOT, Mount, daemon, fsync_path
from .report import write_markdown
from .workloads import pairs, raw_disk, stream_write, tools, tools_prepare, w1, w2, w3, w4, w5, w5_prepare, w7

WORKLOADS = ("raw", "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8")
W7_MODES = ("atomic_dirsync", *CKPTFS)  # the native atomic writer, then the same writer through each mount
TOOL_MODES = ("atomic_dirsync", *CKPTFS)  # the directory tools run in natively ("native"), then each mount


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
    on = set(a.only)
    res: dict = {"groups": a.groups, "size_mib": a.size_mib, "reps": a.reps, "w6_mib": a.w6_mib,
                 "w3_shards": a.shards, "w7_groups": a.groups, "tools_files": a.tool_dirs * a.tool_files,
                 "only": [w for w in WORKLOADS if w in on], "torch": version("torch"),
                 "date": time.strftime("%Y-%m-%d %H:%M"), "fstype": fstype, "device": device,
                 "cache_timeout": a.cache_timeout, **_machine(),
                 "modes": {m: {"w1": [], "w2": [], "w3": {str(n): [] for n in a.shards}, "w4": [], "w7": [],
                               "tools": []} for m in MODES}}
    for m in MODES:
        (base / m).mkdir()
    if "W5" in on:
        for m in ("unsafe", *CKPTFS):
            w5_prepare(base / m / "w5")  # natively, before the mounts cover it
    archive = tools_prepare(base, a.tool_dirs, a.tool_files) if "W8" in on else None
    res["raw_disk"] = raw_disk(base, a.size_mib) if on & {"raw", "W2"} else {}
    print("raw disk", res["raw_disk"], flush=True)
    daemons: dict[str, Mount] = {}
    try:
        for m in CKPTFS:
            commit, transport = MOUNTS[m]
            daemons[m] = daemon(base / m, commit, transport, a.cache_timeout)
        sd = buf = None
        if on & {"W2", "W3", "W4"}:
            import torch

            sd = {"w": torch.randn((a.size_mib << 20) // 4 // 8, 8)}
            buf = memoryview(sd["w"].numpy()).cast("B")
        for rep in range(a.reps):
            for m in MODES:
                wmode = "ckptfs" if m in CKPTFS else m
                aw = m == "ckptfs-async"
                r = res["modes"][m]
                d = base / m / f"rep{rep}"
                d.mkdir()
                if "W1" in on:
                    (d / "w1").mkdir()
                    r["w1"].extend(w1(d / "w1", wmode, a.groups, aw))
                if on & {"W2", "W4"}:
                    x = w2(d, sd, wmode, aw)  # W4 loads what W2 saved
                    if "W2" in on:
                        r["w2"].append(x)
                    if "W4" in on and m in (*CKPTFS, "atomic_dirsync"):
                        r["w4"].append(w4(d / "model.pt"))
                    os.unlink(d / "model.pt")
                if "W3" in on:
                    for n in a.shards:
                        r["w3"][str(n)].append(w3(d, buf, n, wmode, aw))
                if "W7" in on and m in W7_MODES:
                    (d / "w7").mkdir()
                    r["w7"].extend(w7(d / "w7", a.groups))
                if "W8" in on and m in TOOL_MODES:
                    r["tools"].append(tools(d, archive))
                    if m == "atomic_dirsync":  # the yardstick of sync-mode tools (issue 27)
                        r.setdefault("tools_durable", []).append(tools(d, archive, durable=True))
                    if aw:
                        fsync_path(base / m, directory=True)  # drain the async backlog, untimed
                print(f"rep {rep} {m}: " + _progress(r), flush=True)
        if "W2" in on and "W3" in on and a.pairs:
            res["pairs"] = pairs(base, sd, buf, a.pairs, max(a.shards))  # type: ignore[arg-type]
        del buf, sd
        res["w5"] = {m: w5(base / m / "w5", a.w5_rounds, xattr=m in CKPTFS)
                     for m in ("unsafe", *CKPTFS)} if "W5" in on else {}
        print("w5", res["w5"], flush=True)
        res["w6"] = {}
        for m, dm in daemons.items() if "W6" in on else ():
            before_cpu, before_bytes = dm.cpu_s(), _written(dm.stats())
            rss: list[int] = []
            took = stream_write(base / m / "w6.bin", a.w6_mib, lambda dm=dm, rss=rss: rss.append(dm.rss_kib()[0]))
            if m == "ckptfs-async":
                fsync_path(base / m, directory=True)
            cpu, written = dm.cpu_s(), _written(dm.stats())
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


def _progress(r: dict) -> str:
    """One line of what a mode measured in the last repetition."""
    out = []
    if r["w1"]:
        out.append(f"w1 p50 {1e3 * sorted(r['w1'])[len(r['w1']) // 2]:.2f} ms")
    if r["w2"]:
        out.append(f"w2 {r['w2'][-1]['durable_s']:.3f} s")
    if any(r["w3"].values()):
        out.append(f"w3 {[round(v[-1], 3) for v in r['w3'].values()]}")
    if r["w4"]:
        out.append(f"w4 {r['w4'][-1]}")
    if r["w7"]:
        out.append(f"w7 p50 {1e3 * sorted(r['w7'])[len(r['w7']) // 2]:.2f} ms")
    if r["tools"]:
        out.append("tools " + " ".join(f"{k} {v:.2f}" for k, v in r["tools"][-1].items()))
    return ", ".join(out) or "-"


def _only(text: str) -> list[str]:
    names = {w.lower(): w for w in WORKLOADS} | {"tools": "W8"}
    out = []
    for w in text.split(","):
        if w.strip().lower() not in names:
            raise argparse.ArgumentTypeError(f"unknown workload {w!r} (choose from {','.join(WORKLOADS)},tools)")
        out.append(names[w.strip().lower()])
    return out


def _written(st: dict) -> int:
    """Bytes the daemon committed for writers: those it wrote (WRITE requests) and those the kernel
    wrote into a staging file itself (writer passthrough)."""
    return st.get("bytes_written", 0) + st.get("bytes_passed_through", 0)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--groups", type=int, default=400, help="W1 groups per repetition")
    ap.add_argument("--size-mib", type=int, default=1024, help="W2/W3/W4 checkpoint size")
    ap.add_argument("--shards", type=int, nargs="+", default=[64, 512], help="W3 shard counts")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (interleaved across modes)")
    ap.add_argument("--w5-rounds", type=int, default=5)
    ap.add_argument("--w6-mib", type=int, default=4096, help="W6 streamed file size")
    ap.add_argument("--tool-dirs", type=int, default=50, help="W8 tree: directories")
    ap.add_argument("--tool-files", type=int, default=100, help="W8 tree: files (1-4 KiB) per directory")
    ap.add_argument("--cache-timeout", type=float, default=None,
                    help="kernel transport's cache timeout, seconds (default: the daemon's own)")
    ap.add_argument("--only", type=_only, default=list(WORKLOADS),
                    help="comma-separated subset of " + ",".join(WORKLOADS) + " (W8 = tools); default all")
    ap.add_argument("--pairs", type=int, default=5,
                    help="W2/W3 back-to-back native/ckptfs pairs (issue 27's bulk measure; 0: none)")
    ap.add_argument("--no-ledger", action="store_true", help="skip the per-operation ledger (bench.ledger)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--dir", default=None, help="backing filesystem to test (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "performance.md"))
    a = ap.parse_args()
    if a.smoke:
        a.groups, a.size_mib, a.shards, a.reps, a.w5_rounds, a.w6_mib = 10, 8, [4, 16], 1, 1, 16
        a.tool_dirs, a.tool_files, a.pairs = 2, 50, 2
    base = Path(tempfile.mkdtemp(prefix="ckptfs-bench-", dir=a.dir))
    try:
        res = run(a, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if not a.no_ledger and not a.smoke and shutil.which("strace"):
        from .ledger import measure  # the same run's exact counts (issue 27: targets in counts)

        lbase = Path(tempfile.mkdtemp(prefix="ckptfs-ledger-", dir=a.dir))
        try:
            res["ledger"] = measure(lbase)
        finally:
            shutil.rmtree(lbase, ignore_errors=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    cmd = "python -m bench " + " ".join(sys.argv[1:])
    write_markdown(res, out, cmd.strip())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
