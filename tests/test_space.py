"""Issue 25, item 10: the space ckptfs holds out of sight (kept generations, quarantine, staging,
trash) is reported by ``ckptfs status`` mounted and unmounted; ``status`` of a plain directory is a
usage error (exit 2), not an empty report.  Kept generations are made only where they serve by
default (files in checkpoint groups: G11) and ``ckptfs gc --generations`` reclaims them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, Mount, _env


def status(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", "status", str(d)], capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=60)


def test_space_held_in_generations_is_reported(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    r = status(d)
    assert r.returncode == 2 and "not a ckptfs directory" in r.stderr, r.stderr
    with Mount(d, extra_args=["--keep-generations", "1"]).start():
        for i in range(3):  # each overwrite keeps the previous version (--keep-generations 1)
            (d / "model.pt").write_bytes(bytes([i]) * (1 << 20))
        r = status(d)
        assert r.returncode == 0, r.stderr
        space = json.loads(r.stdout)["space"]
        assert space["generations"] >= 1 << 20 and space["staging"] == 0, space
    r = status(d)
    assert r.returncode == 0 and json.loads(r.stdout)["space"] == space, r.stdout


def gc(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", "gc", str(d), *args], capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=120)


def test_by_default_only_checkpoint_groups_keep_generations_and_gc_reclaims_them(tmp_path: Path) -> None:
    """An in-place ``model.pt`` saved again and again kept a hidden copy of itself (174 MB beside
    174 MB, ``du`` through the mount showed half).  By default a file outside checkpoint groups
    keeps none; a file in a group keeps one (a torn re-save rolls back to it, G11); ``gc
    --generations`` deletes them, mounted and unmounted, and says how much."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        assert os.getxattr(d, "user.ckptfs.keep_generations") == b"1 (checkpoint groups)"
        for i in range(4):
            (d / "model.pt").write_bytes(bytes([i]) * (1 << 20))
            (d / "w.safetensors.tmp").write_bytes(bytes([i]) * (1 << 20))  # tmp + rename over it, too
            os.rename(d / "w.safetensors.tmp", d / "w.safetensors")
        assert json.loads(status(d).stdout)["space"]["generations"] == 0
        (d / "step_100").mkdir()
        for i in range(3):  # a sealed group saved again: its previous files are kept
            (d / "step_100" / "model.pt").write_bytes(bytes([i]) * (1 << 20))
            (d / "step_100" / "COMMIT").write_bytes(b"done")
        held = json.loads(status(d).stdout)["space"]["generations"]
        assert held >= 1 << 20, held
        r = gc(d, "--generations", "--dry-run", "--json")
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["generations_removed"] >= 1 and rep["generations_bytes"] >= 1 << 20, rep
        assert json.loads(status(d).stdout)["space"]["generations"] == held  # a dry run deletes nothing
        r = gc(d, "--generations")
        assert r.returncode == 0 and "kept generation" in r.stdout, r.stdout + r.stderr
        assert json.loads(status(d).stdout)["space"]["generations"] == 0
        assert (d / "step_100" / "model.pt").read_bytes() == bytes([2]) * (1 << 20)
        (d / "step_100" / "model.pt").write_bytes(b"x" * 100)  # kept again from now on
        assert json.loads(status(d).stdout)["space"]["generations"] >= 1 << 20
    r = gc(d, "--generations", "--dry-run", "--json")  # unmounted
    assert r.returncode == 0 and json.loads(r.stdout)["generations_removed"] >= 1, r.stdout + r.stderr
    r = gc(d, "--generations")
    assert r.returncode == 0, r.stderr
    assert json.loads(status(d).stdout)["space"]["generations"] == 0
    with Mount(d).start():
        assert (d / "step_100" / "model.pt").read_bytes() == b"x" * 100
        assert (d / "model.pt").read_bytes() == bytes([3]) * (1 << 20)
