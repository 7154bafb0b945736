"""Per-call client latencies of the W7 pattern, natively and through a ckptfs mount.

    python -m bench.steps --dir D [--groups 100]

Per group: ``mkdir step_N`` + fsync of its parent, then for each of 5 files (128 KiB model, 64 KiB
optimizer, 3 small ones): create ``name.tmp``, write, fsync, close, rename over ``name``, fsync of
the directory (an already-atomic writer, W7).  Prints the median of each call and its total per
group, native against a ``--commit sync`` mount (native transport).  Used to find which call a
W7 change moved (docs/results/performance-analysis.md); the targets live in ``python -m bench``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import daemon


def run(root: Path, groups: int) -> dict[str, tuple[float, float]]:
    """call -> (median ms, total ms per group)."""
    t: dict[str, list[float]] = collections.defaultdict(list)
    model, opt = os.urandom(128 << 10), os.urandom(64 << 10)

    def tm(k: str, f: Callable[..., Any], *a: Any) -> Any:
        t0 = time.perf_counter()
        r = f(*a)
        t[k].append(time.perf_counter() - t0)
        return r

    def fsync_dir(k: str, d: Path) -> None:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            tm(k, os.fsync, fd)
        finally:
            os.close(fd)

    for g in range(groups):
        d = root / f"step_{g:06d}"
        tm("mkdir", os.mkdir, d)
        fsync_dir("fsync parent", root)
        parts = {"model.bin": model, "optim.bin": opt, "rng.json": b"{}", "MANIFEST.json": b"{}", "COMMIT": b"ok"}
        for name, data in parts.items():
            tmp = d / (name + ".tmp")
            fd = tm("create", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            tm("write", os.write, fd, data)
            tm("fsync", os.fsync, fd)
            tm("close", os.close, fd)
            tm("rename", os.replace, tmp, d / name)
            fsync_dir("fsync dir", d)
    return {k: (1e3 * statistics.median(v), 1e3 * sum(v) / groups) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.steps")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--groups", type=int, default=100)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-steps-", dir=a.dir))
    (base / "native").mkdir()
    (base / "ckptfs").mkdir()
    try:
        res = {"native": run(base / "native", a.groups)}
        dm = daemon(base / "ckptfs", "sync")
        try:
            res["ckptfs"] = run(base / "ckptfs", a.groups)
        finally:
            dm.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'call':14} {'native med':>10} {'/group':>8} {'ckptfs med':>10} {'/group':>8}  (ms)")
    for k, (nm, ng) in res["native"].items():
        cm, cg = res["ckptfs"][k]
        print(f"{k:14} {nm:10.3f} {ng:8.3f} {cm:10.3f} {cg:8.3f}")
    print(f"{'total':14} {'':10} {sum(v[1] for v in res['native'].values()):8.3f} "
          f"{'':10} {sum(v[1] for v in res['ckptfs'].values()):8.3f}")


if __name__ == "__main__":
    main()
