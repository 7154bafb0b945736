"""Cost of the native transport's node-table walks (ckptfs/fuse/nodes.py T4), no mount.

    python -m bench.nodes [--mapped 5000 100000]

With N names mapped elsewhere in the table (``data/dNNN/fNNNNN``), times the three walks that
run on request or commit threads: ``under`` (every event, e.g. each commit's PUBLISHED),
``move`` (every rename) and ``unmap(subtree=True)`` (every rmdir) on a small checkpoint group.
Before the child index each of them scanned every mapped path (1.2 ms at 5,000, 22 ms at
100,000, measured on a666d56); results: docs/results/performance-analysis.md.
"""

from __future__ import annotations

import argparse
import time

from ckptfs.fuse.nodes import Nodes


def _us(fn, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e6


def run(mapped: int, reps: int = 2000) -> dict[str, float]:
    nodes = Nodes()
    for i in range(mapped):
        nodes.looked_up(f"data/d{i // 1000}/f{i}")
    group = ["run", "run/ckpt-1", *(f"run/ckpt-1/shard{j}.pt" for j in range(8))]
    for p in group:
        nodes.looked_up(p)

    def rename_twice() -> None:
        nodes.move("run/ckpt-1", "run/ckpt-x")
        nodes.move("run/ckpt-x", "run/ckpt-1")

    def rmdir_and_back() -> None:
        nodes.unmap("run/ckpt-1", subtree=True)
        for p in group[1:]:
            nodes.looked_up(p)

    return {"under_us": _us(lambda: nodes.under("run/ckpt-1"), reps),
            "move_us": _us(rename_twice, reps) / 2,
            "unmap_subtree_us": _us(rmdir_and_back, reps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mapped", type=int, nargs="+", default=[5000, 100_000])
    args = ap.parse_args()
    print("| names mapped | under (us) | move (us) | unmap subtree + 9 lookups (us) |")
    print("|---|---|---|---|")
    for n in args.mapped:
        r = run(n)
        print(f"| {n:,} | {r['under_us']:.1f} | {r['move_us']:.1f} | {r['unmap_subtree_us']:.1f} |")


if __name__ == "__main__":
    main()
