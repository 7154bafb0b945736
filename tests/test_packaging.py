"""Packaging (issue 13): the wheel builds (``python -m build``), holds the product only, and a
``pip install`` of it into a fresh virtualenv gives a working ``ckptfs`` command."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from conftest import ROOT


def test_the_wheel_builds_and_installs_a_working_command(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = out.glob("ckptfs-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ckptfs/api.py" in names and "ckptfs/fuse/session.py" in names
    assert not [n for n in names if n.startswith(("ckptfs_testing/", "tests/", "bench/", "campaigns/"))]
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    r = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([str(env / "bin" / "ckptfs"), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().startswith("ckptfs "), r
    r = subprocess.run([str(env / "bin" / "ckptfs"), "latest", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "not inside a ckptfs mount" in r.stderr, r  # the installed code, no traceback
