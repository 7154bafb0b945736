"""Turn the raw benchmark results into ``performance.md`` (tables, targets)
and PNG plots (matplotlib).

Invariant: every number written here is computed from the raw results dict
of one run (also saved as JSON next to the Markdown); nothing is typed in.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from .common import CKPTFS, MODES, median, pct

REF = "atomic_dirsync"


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Medians / percentiles per mode from the raw per-repetition lists."""
    s: dict[str, Any] = {}
    for m in MODES:
        r = res["modes"][m]
        lat = r["w1"]
        d: dict[str, float] = {
            "w1_p50_ms": 1e3 * pct(lat, 0.5), "w1_p90_ms": 1e3 * pct(lat, 0.9), "w1_p99_ms": 1e3 * pct(lat, 0.99),
            "w2_durable_s": median([x["durable_s"] for x in r["w2"]]),
            "w2_stall_s": median([x["stall_s"] for x in r["w2"]]),
        }
        for n, xs in r["w3"].items():
            d[f"w3_{n}_s"] = median(xs)
        for k in ("cold_s", "first_s", "warm_s"):
            xs = [x[k] for x in r.get("w4", []) if k in x]
            if xs:
                d[f"w4_{k}"] = median(xs)
        s[m] = d
    return s


def targets(s: dict[str, Any], res: dict[str, Any]) -> list[tuple[str, float, float, bool]]:
    """(target, measured ratio or value, limit, met) for each issue-6 target."""
    ref, uns = s[REF], s["unsafe"]
    out = [
        ("W2 sync durable / native atomic_dirsync", s["ckptfs-sync"]["w2_durable_s"] / ref["w2_durable_s"], 1.10),
        ("W2 async stall / native unsafe", s["ckptfs-async"]["w2_stall_s"] / uns["w2_durable_s"], 1.25),
        ("W1 sync p50 / native atomic_dirsync p50", s["ckptfs-sync"]["w1_p50_ms"] / ref["w1_p50_ms"], 1.0),
        ("W1 sync p99 / native atomic_dirsync p99", s["ckptfs-sync"]["w1_p99_ms"] / ref["w1_p99_ms"], 1.5),
    ]
    for n in res["w3_shards"]:
        out.append((f"W3 {n} shards sync / native atomic_dirsync",
                    s["ckptfs-sync"][f"w3_{n}_s"] / ref[f"w3_{n}_s"], 1.0))
    for k in ("cold_s", "first_s", "warm_s"):
        if f"w4_{k}" in ref:
            out.append((f"W4 torch.load {k[:-2]} ckptfs-sync / native", s["ckptfs-sync"][f"w4_{k}"] / ref[f"w4_{k}"],
                        1.3))
    peak = max(res["w6"][m]["peak_rss_mib"] for m in CKPTFS)
    out.append(("W6 daemon peak RSS MiB (any size in this run)", peak, 200.0))
    return [(name, val, lim, val <= lim) for name, val, lim in out]


def _plots(res: dict[str, Any], s: dict[str, Any], outdir: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in MODES:
        xs = sorted(1e3 * x for x in res["modes"][m]["w1"])
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=m)
    ax.set_xscale("log")
    ax.set_xlabel("per-group latency (ms, log)")
    ax.set_ylabel("fraction of groups")
    ax.set_title("W1: paper's group (128 KiB + 64 KiB + rng json)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    names.append(f"{stem}-w1-cdf.png")
    fig.savefig(outdir / names[-1], dpi=110)
    plt.close(fig)

    cols = [("w2_durable_s", "W2 durable"), ("w2_stall_s", "W2 stall")]
    cols += [(f"w3_{n}_s", f"W3 {n} shards") for n in res["w3_shards"]]
    cols += [(f"w4_{k}", f"W4 load {k[:-2]}") for k in ("cold_s", "first_s", "warm_s") if f"w4_{k}" in s[REF]]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(MODES)
    for i, m in enumerate(MODES):
        vals = [s[m].get(c, 0.0) for c, _ in cols]
        ax.bar([j + i * width for j in range(len(cols))], vals, width, label=m)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))])
    ax.set_xticklabels([lbl for _, lbl in cols], rotation=20)
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"W2-W4: {res['size_mib']} MiB checkpoints")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    names.append(f"{stem}-bulk.png")
    fig.savefig(outdir / names[-1], dpi=110)
    plt.close(fig)
    return names


def write_markdown(res: dict[str, Any], out: Path, command: str) -> None:
    s = summarize(res)
    ref, uns = s[REF], s["unsafe"]
    raw = res["raw_disk"]
    gb = res["size_mib"] * (1 << 20) / 1e9
    lim = raw.get("dd_fdatasync_MBps")
    plots = _plots(res, s, out.parent, out.stem)
    L = [
        "# Performance results", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores ({res['cpu']}), {res['mem_gib']} GiB RAM, "
        f"Linux {platform.release()}, backing fs {res['fstype']} on {res['device']}, Python "
        f"{platform.python_version()}, torch {res['torch']}.  Other engineers share the 2 cores (noisy); "
        "all modes ran interleaved in one invocation, so read ratios.", "",
        f"Command: `{command}`  ", f"Date: {res['date']}; {res['reps']} repetitions per workload "
        f"(W1: {res['groups']} groups each, percentiles over all groups; others: medians).  "
        f"Raw numbers: `{out.stem}.json`.  Analysis: `performance-analysis.md`.", "",
        "## Raw disk limit (dd, 1 MiB blocks)", "",
        "| test | MB/s |", "|---|---|",
        *[f"| {k} | {v:.0f} |" for k, v in raw.items()], "",
        "## Targets (issue 6)", "",
        "| target | measured | limit | status |", "|---|---|---|---|",
    ]
    for name, val, limit, met in targets(s, res):
        L.append(f"| {name} | {val:.2f} | {limit:.2f} | {'met' if met else 'MISSED'} |")
    L += ["", "## W1: paper's group, per-group latency", "",
          "| mode | p50 ms | p90 ms | p99 ms | p50 / atomic_dirsync | p99 / atomic_dirsync |",
          "|---|---|---|---|---|---|"]
    for m in MODES:
        r = s[m]
        L.append(f"| {m} | {r['w1_p50_ms']:.2f} | {r['w1_p90_ms']:.2f} | {r['w1_p99_ms']:.2f} | "
                 f"{r['w1_p50_ms'] / ref['w1_p50_ms']:.2f} | {r['w1_p99_ms'] / ref['w1_p99_ms']:.2f} |")
    L += ["", f"## W2: one torch.save of {res['size_mib']} MiB, made durable", "",
          "| mode | durable s | stall s | durable / atomic_dirsync | stall / unsafe | GB/s durable | of dd limit |",
          "|---|---|---|---|---|---|---|"]
    for m in MODES:
        r = s[m]
        bw = gb / r["w2_durable_s"]
        L.append(f"| {m} | {r['w2_durable_s']:.3f} | {r['w2_stall_s']:.3f} | "
                 f"{r['w2_durable_s'] / ref['w2_durable_s']:.2f} | {r['w2_stall_s'] / uns['w2_durable_s']:.2f} | "
                 f"{bw:.2f} | {(1e3 * bw / lim) if lim else float('nan'):.0%} |")
    L += ["", f"## W3: DCP-style save of {res['size_mib']} MiB as N shard files + `.metadata` last "
          "(seconds until durable)", "",
          "| mode | " + " | ".join(f"{n} shards s | / atomic_dirsync" for n in res["w3_shards"]) + " |",
          "|---|" + "---|---|" * len(res["w3_shards"])]
    for m in MODES:
        cells = []
        for n in res["w3_shards"]:
            v = s[m][f"w3_{n}_s"]
            cells.append(f"{v:.3f} | {v / ref[f'w3_{n}_s']:.2f}")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    kinds = [k for k in ("cold_s", "first_s", "warm_s") if f"w4_{k}" in ref]
    L += ["", f"## W4: torch.load of the {res['size_mib']} MiB W2 checkpoint", "",
          ("Cold = after `sync; echo 3 > /proc/sys/vm/drop_caches`." if "cold_s" in kinds else
           "Dropping caches was not permitted: 'first' is the first load after the save."), "",
          "| mode | " + " | ".join(f"{k[:-2]} s | / native" for k in kinds) + " |",
          "|---|" + "---|---|" * len(kinds)]
    for m in [REF, *CKPTFS]:
        L.append(f"| {'native' if m == REF else m} | " + " | ".join(
            f"{s[m][f'w4_{k}']:.3f} | {s[m][f'w4_{k}'] / ref[f'w4_{k}']:.2f}" for k in kinds) + " |")
    L += ["", "## W5: metadata rates, directory of 1000 entries (ops/s, median of rounds)", "",
          "| mode | stat/s | open+close/s | readdir(1000)/s |", "|---|---|---|---|"]
    for m, r in res["w5"].items():
        L.append(f"| {'native' if m == 'unsafe' else m} | {r['stat_ops']:.0f} | {r['openclose_ops']:.0f} | "
                 f"{r['readdir_ops']:.1f} |")
    L += ["", "## W6: daemon resources", "",
          f"Stream: one {res['w6_mib']} MiB file written in 1 MiB writes through the mount.  Whole run: every "
          "workload above, CPU seconds of the daemon / GiB written through it.", "",
          "| mode | peak RSS MiB (whole run) | RSS max during stream MiB | CPU s/GiB stream | CPU s/GiB whole run "
          "| stream s |", "|---|---|---|---|---|---|"]
    for m in CKPTFS:
        r = res["w6"][m]
        L.append(f"| {m} | {r['peak_rss_mib']:.0f} | {r['stream_rss_max_mib']:.0f} | {r['stream_cpu_s_per_gib']:.2f} "
                 f"| {r['run_cpu_s_per_gib']:.2f} | {r['stream_s']:.2f} |")
    L += ["", "## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    out.write_text("\n".join(L))
