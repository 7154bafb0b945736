"""The benchmark entry point runs every workload end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, _env

MODES = ["unsafe", "atomic_nodirsync", "atomic_dirsync", "ckptfs-sync", "ckptfs-async"]


def test_bench_smoke(tmp_path) -> None:
    out = tmp_path / "perf.md"
    r = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--dir", str(tmp_path), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    w1 = text.split("## W1")[1].split("##")[0]
    rows = [ln.split("|")[1].strip() for ln in w1.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows[1:] == MODES
    for section in ("## Raw disk limit", "## Targets", "## W2", "## W3", "## W4", "## W5", "## W6"):
        assert section in text
    res = json.loads((tmp_path / "perf.json").read_text())
    for m in MODES:
        assert len(res["modes"][m]["w1"]) == 10 and len(res["modes"][m]["w2"]) == 1
        assert all(len(v) == 1 for v in res["modes"][m]["w3"].values())
    assert set(res["w6"]) == {"ckptfs-sync", "ckptfs-async"}
    assert all(v["bytes_written"] > 0 and v["peak_rss_mib"] > 0 for v in res["w6"].values())
    assert (tmp_path / "perf-w1-cdf.png").stat().st_size > 0 and (tmp_path / "perf-bulk.png").stat().st_size > 0
    # the scratch directory and both mounts are gone
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckptfs-bench-")]
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read()
