"""The benchmark entry point runs every workload end to end on both transports (tiny sizes; no timing
asserts), and ``--only`` runs a subset."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, _env

MODES = ["unsafe", "atomic_nodirsync", "atomic_dirsync", "ckptfs-sync", "ckptfs-async", "ckptfs-sync-mfusepy"]
CKPTFS = MODES[3:]
TOOLS = {"tar_xf", "ls_lR", "du_s", "git_add", "rm_rf"}


def _bench(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "--smoke", "--dir", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=300)


def _rows(text: str, section: str) -> list[str]:
    body = text.split(section)[1].split("\n## ")[0]
    return [ln.split("|")[1].strip() for ln in body.splitlines() if ln.startswith("| ") and "---" not in ln][1:]


def _clean(tmp_path) -> None:
    """The scratch directory and every mount are gone."""
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckptfs-bench-")]
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read()


def test_bench_smoke(tmp_path) -> None:
    out = tmp_path / "perf.md"
    r = _bench(tmp_path, "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert _rows(text, "## W1") == MODES
    for section in ("## Raw disk limit", "## Targets", "## Transport comparison", "## W2", "## W3", "## W4",
                    "## W5", "## W6", "## W7", "## W8"):
        assert section in text
    assert _rows(text, "## W7") == ["native", *CKPTFS]
    assert _rows(text, "## W8") == ["native", *CKPTFS]
    assert _rows(text, "## W8 durable") == ["native + per-file durability", *CKPTFS]
    assert "W7 p99 ms" in text and "W8 git add -A s" in text and "W5 getxattr/s" in text
    t27 = _rows(text, "## Targets (issue 27")  # every issue-27 target this run measures (the ledger: not in smoke)
    assert "W2 sync durable / native atomic (median of pairs)" in t27 and "async rm -rf / native" in t27
    assert "open+close per second (sync)" in t27 and "sync tar xf / native + per-file durability" in t27
    assert _rows(text, "## Pairs")[-1] == "median of ratios"
    res = json.loads((tmp_path / "perf.json").read_text())
    for m in MODES:
        assert len(res["modes"][m]["w1"]) == 10 and len(res["modes"][m]["w2"]) == 1
        assert all(len(v) == 1 for v in res["modes"][m]["w3"].values())
    for m in ("atomic_dirsync", *CKPTFS):
        assert len(res["modes"][m]["w7"]) == 10
        assert len(res["modes"][m]["tools"]) == 1 and set(res["modes"][m]["tools"][0]) == TOOLS
    assert len(res["modes"]["atomic_dirsync"]["tools_durable"]) == 1
    assert set(res["modes"]["atomic_dirsync"]["tools_durable"][0]) == TOOLS
    assert res["tools_files"] == 100
    assert len(res["pairs"]) == 2 and all(len(p) == 7 and p["disk_MBps"] > 0 for p in res["pairs"])
    assert set(res["w5"]) == {"unsafe", *CKPTFS}
    assert "getxattr_ops" not in res["w5"]["unsafe"] and all("getxattr_ops" in res["w5"][m] for m in CKPTFS)
    assert set(res["w6"]) == set(CKPTFS)
    assert all(v["bytes_written"] > 0 and v["peak_rss_mib"] > 0 for v in res["w6"].values())
    for png in ("perf-w1-cdf.png", "perf-w7-cdf.png", "perf-bulk.png"):
        assert (tmp_path / png).stat().st_size > 0
    _clean(tmp_path)


def test_bench_only(tmp_path) -> None:
    out = tmp_path / "sub.md"
    r = _bench(tmp_path, "--only", "w7", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert _rows(text, "## W7") == ["native", *CKPTFS]
    assert "## W1" not in text and "## W5" not in text and "## W8" not in text and "## Raw disk" not in text
    res = json.loads((tmp_path / "sub.json").read_text())
    assert res["only"] == ["W7"] and not res["w5"] and not res["w6"] and not res["modes"]["ckptfs-sync"]["w1"]
    assert len(res["modes"]["ckptfs-sync-mfusepy"]["w7"]) == 10 and not res["modes"]["unsafe"]["w7"]
    _clean(tmp_path)
    bad = _bench(tmp_path, "--only", "W9", "--out", str(out))
    assert bad.returncode == 2 and "unknown workload" in bad.stderr


def test_bench_batch_compares_group_commits_with_one_install_at_a_time(tmp_path) -> None:
    """``python -m bench.batch`` (C5 on and off, back to back): tiny sizes, no timing asserts; the
    counts say the batched mount installed in group commits and the other one at a time."""
    out = tmp_path / "batch.json"
    r = subprocess.run([sys.executable, "-m", "bench.batch", "--dir", str(tmp_path), "--pairs", "2", "--mib", "16",
                        "--shards", "16", "--files", "50", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 2 and all(row["disk_MBps"] > 0 for row in res["rows"])
    for row in res["rows"]:
        assert row["single"]["batches"] == 0 and row["single"]["commits"] == row["batched"]["commits"] == 16 + 1 + 50
        assert row["batched"]["batched"] <= row["batched"]["commits"]
    assert set(res["median_ratio"]) == {"w3_s", "burst_s"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckptfs-batch-")]
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read()
