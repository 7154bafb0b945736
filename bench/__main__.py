"""ckptfs benchmarks against the seed paper's three native write modes.

    python -m bench [--groups 400] [--size-mib 1024] [--out docs/results/performance.md]
    python -m bench --smoke --out /tmp/perf.md      # tiny, for CI (no timing asserts)

Everything runs in one invocation on the same backing filesystem, so results
are read as ratios.  Workloads so far (issue 6 lists the full set):

W1  the paper's group: 128 KiB model + 64 KiB optimizer + rng JSON per group.
    Native modes write their own MANIFEST + COMMIT files as the paper does;
    through ckptfs the application writes only the three parts plainly.
W2  one torch.save of SIZE MiB made durable; in async mode also the stall
    (time until torch.save returns).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptfs.cli import is_ckptfs_mount  # noqa: E402


def fsync_path(p: Path, directory: bool = False) -> None:
    fd = os.open(p, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(p: Path, data: bytes, mode: str) -> None:
    """Write data at p in one of the paper's modes (or plain for ckptfs)."""
    if mode in ("unsafe", "ckptfs"):
        with open(p, "wb") as f:
            f.write(data)
        return
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    if mode == "atomic_dirsync":
        fsync_path(p.parent, directory=True)


def w1(root: Path, mode: str, groups: int) -> list[float]:
    model, opt = os.urandom(128 << 10), os.urandom(64 << 10)
    lat = []
    for g in range(groups):
        t0 = time.perf_counter()
        d = root / f"step_{g:06d}"
        d.mkdir()
        if mode == "atomic_dirsync":
            fsync_path(root, directory=True)
        parts = {"model.bin": model, "optim.bin": opt, "rng.json": json.dumps({"seed": g}).encode()}
        for name, data in parts.items():
            write_file(d / name, data, mode)
        if mode != "ckptfs":
            manifest = json.dumps({n: len(b) for n, b in parts.items()}).encode()
            write_file(d / "MANIFEST.json", manifest, mode)
            write_file(d / "COMMIT", b"ok", mode)
        lat.append(time.perf_counter() - t0)
    return lat


def w2(root: Path, mode: str, size_mib: int, async_mount: bool) -> dict[str, float]:
    sd = {"w": torch.randn((size_mib << 20) // 4 // 8, 8)}
    p = root / "model.pt"
    t0 = time.perf_counter()
    if mode in ("unsafe", "ckptfs"):
        torch.save(sd, p)
    else:
        tmp = root / "model.pt.tmp"
        with open(tmp, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        if mode == "atomic_dirsync":
            fsync_path(root, directory=True)
    stall = time.perf_counter() - t0
    if async_mount:
        fsync_path(root, directory=True)  # wait until durable
    return {"stall_s": stall, "durable_s": time.perf_counter() - t0}


class Daemon:
    def __init__(self, d: Path, commit: str) -> None:
        self.d = d
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.p = subprocess.Popen([sys.executable, "-m", "ckptfs", "mount", "-f", str(d), "--commit", commit],
                                  env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not is_ckptfs_mount(str(d)):
            if time.monotonic() > deadline or self.p.poll() is not None:
                raise RuntimeError("ckptfs did not mount")
            time.sleep(0.02)

    def stop(self) -> None:
        if subprocess.run(["fusermount3", "-u", str(self.d)]).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(self.d)])
        self.p.wait(300)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--groups", type=int, default=400)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--dir", default=None, help="backing filesystem to test (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "performance.md"))
    a = ap.parse_args()
    if a.smoke:
        a.groups, a.size_mib = 10, 8
    base = Path(tempfile.mkdtemp(prefix="ckptfs-bench-", dir=a.dir))
    modes = ["unsafe", "atomic_nodirsync", "atomic_dirsync", "ckptfs-sync", "ckptfs-async"]
    res: dict[str, dict] = {}
    for mode in modes:
        d = base / mode
        d.mkdir()
        daemon = Daemon(d, mode.split("-")[1]) if mode.startswith("ckptfs") else None
        try:
            wmode = "ckptfs" if daemon else mode
            (d / "w1").mkdir()
            lat = w1(d / "w1", wmode, a.groups)
            if mode == "ckptfs-async":
                t0 = time.perf_counter()
                fsync_path(d / "w1", directory=True)
                lat[-1] += time.perf_counter() - t0
            (d / "w2").mkdir()
            r2 = w2(d / "w2", wmode, a.size_mib, mode == "ckptfs-async")
        finally:
            if daemon:
                daemon.stop()
        res[mode] = {"w1_p50_ms": 1e3 * statistics.median(lat), "w1_p90_ms": 1e3 * pct(lat, 0.9),
                     "w1_p99_ms": 1e3 * pct(lat, 0.99), **r2}
        print(mode, json.dumps({k: round(v, 4) for k, v in res[mode].items()}), flush=True)
    subprocess.run(["rm", "-rf", str(base)])
    ref = res["atomic_dirsync"]
    lines = [
        "# Performance results", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}. "
        f"Command: `python -m bench --groups {a.groups} --size-mib {a.size_mib}`"
        + (" (smoke)" if a.smoke else "") + f". Date: {time.strftime('%Y-%m-%d')}.", "",
        f"W1: {a.groups} groups (128 KiB + 64 KiB + rng JSON). W2: one torch.save of {a.size_mib} MiB, durable.", "",
        "| mode | W1 p50 ms | W1 p90 ms | W1 p99 ms | W1 p50 / atomic_dirsync | W2 durable s | W2 stall s "
        "| W2 / atomic_dirsync |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in res.items():
        lines.append(f"| {mode} | {r['w1_p50_ms']:.2f} | {r['w1_p90_ms']:.2f} | {r['w1_p99_ms']:.2f} | "
                     f"{r['w1_p50_ms'] / ref['w1_p50_ms']:.2f} | {r['durable_s']:.3f} | {r['stall_s']:.3f} | "
                     f"{r['durable_s'] / ref['durable_s']:.2f} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
