"""The benchmark entry point runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, _env


def test_bench_smoke(tmp_path) -> None:
    out = tmp_path / "perf.md"
    r = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--dir", str(tmp_path), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| ") and "---" not in ln]
    assert [ln.split("|")[1].strip() for ln in rows[1:]] == [
        "unsafe", "atomic_nodirsync", "atomic_dirsync", "ckptfs-sync", "ckptfs-async"]
