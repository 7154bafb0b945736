"""Issue 25, item 10: the space ckptfs holds out of sight (kept generations, quarantine, staging,
trash) is reported by ``ckptfs status`` mounted and unmounted; ``status`` of a plain directory is a
usage error (exit 2), not an empty report."""

from __future__ import annotations

import json
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
    with Mount(d).start():
        for i in range(3):  # each overwrite keeps the previous version (--keep-generations 1)
            (d / "model.pt").write_bytes(bytes([i]) * (1 << 20))
        r = status(d)
        assert r.returncode == 0, r.stderr
        space = json.loads(r.stdout)["space"]
        assert space["generations"] >= 1 << 20 and space["staging"] == 0, space
    r = status(d)
    assert r.returncode == 0 and json.loads(r.stdout)["space"] == space, r.stdout
