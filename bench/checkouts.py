"""Small durable files through two checkouts of ckptfs, back to back.

    python -m bench.checkouts OLD NEW [--files N] [--pairs P] [--dir D] [--json OUT]

``OLD`` and ``NEW`` are checkouts (``git worktree add``) of two commits.  Each pair mounts one
checkout, then the other (alternating which goes first), sync commit, and writes ``--files`` files
of 3,000 bytes, each closed (durable at close).  Per run: the close latency's median, the disk's
written KiB per file (``/sys/block/<dev>/stat``: machine-wide, so run it alone), the daemon's CPU
per file, and the blocks each file takes (``du``).  Prints each run and the medians of the
per-pair latency ratios (new / old).  Issue 27's compact record (``records.COMPACT``) was measured
with it: docs/results/performance-analysis.md, fifth session.

Invariant: every mount is unmounted and its daemon stopped by PID; the scratch directory is
removed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZE = 3000


def _disk_stat() -> Path | None:
    """The block device holding the current directory's file system, as /sys/block/<dev>/stat."""
    dev = os.stat(".").st_dev
    for d in Path("/sys/block").glob("*"):
        for p in [d, *d.glob(f"{d.name}*")]:
            try:
                if (p / "dev").read_text().strip() == f"{os.major(dev)}:{os.minor(dev)}":
                    return d / "stat"
            except OSError:
                continue
    return None


def _sectors_written(stat: Path | None) -> int:
    return int(stat.read_text().split()[6]) if stat is not None else 0


def _cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def one(tree: Path, d: Path, files: int, stat: Path | None) -> dict[str, float]:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.Popen([sys.executable, "-m", "ckptfs", "mount", "-f", str(d)], cwd=tree, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            try:
                os.getxattr(d, "user.ckptfs.pid")
                break
            except OSError:
                time.sleep(0.05)
        data = os.urandom(SIZE)
        (d / "warm.txt").write_bytes(b"w")  # the journal's first write: no file's own cost
        os.sync()
        time.sleep(0.3)
        s0, c0, lat = _sectors_written(stat), _cpu(p.pid), []
        for i in range(files):
            t = time.perf_counter()
            with open(d / f"f{i}.dat", "wb") as f:
                f.write(data)
            lat.append(time.perf_counter() - t)
        s1, c1 = _sectors_written(stat), _cpu(p.pid)
    finally:
        subprocess.run(["fusermount3", "-u", str(d)], capture_output=True)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    blocks = sum(os.stat(d / f"f{i}.dat").st_blocks for i in range(files))
    shutil.rmtree(d, ignore_errors=True)
    return {"p50_us": statistics.median(lat) * 1e6, "disk_kib_per_file": (s1 - s0) * 512 / 1024 / files,
            "daemon_cpu_us_per_file": (c1 - c0) / files * 1e6, "du_kib_per_file": blocks / files / 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--dir", type=Path, default=Path.cwd() / "bench-checkouts")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    stat = _disk_stat()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    try:
        for pair in range(a.pairs):
            order = [("old", a.old), ("new", a.new)]
            for tag, tree in order if pair % 2 == 0 else order[::-1]:
                r = one(tree.resolve(), a.dir / tag, a.files, stat)
                runs[tag].append(r)
                print(f"pair {pair} {tag}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    ratios = [n["p50_us"] / o["p50_us"] for o, n in zip(runs["old"], runs["new"], strict=True)]
    out = {"ratios_p50": ratios, "median_ratio_p50": statistics.median(ratios), "runs": runs,
           "old": str(a.old), "new": str(a.new), "files": a.files}
    print(f"p50 new/old per pair {[round(x, 2) for x in ratios]}, median {out['median_ratio_p50']:.2f}")
    for k in ("disk_kib_per_file", "du_kib_per_file"):
        print(f"{k}: old {statistics.median(r[k] for r in runs['old']):.1f}, "
              f"new {statistics.median(r[k] for r in runs['new']):.1f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
