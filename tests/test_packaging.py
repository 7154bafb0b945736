"""The wheel ships the product only: ``ckptfs`` and its subpackages, no test tooling
(``ckptfs_testing``: the model checker, its workloads, fault injection, the mount harness)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLING = ("modelcheck", "mc_workloads", "faults")


def _dep_dir(name: str) -> Path:
    """The directory to put on sys.path for the installed module ``name``."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    origin = Path(spec.origin)
    return origin.parent.parent if spec.submodule_search_locations else origin.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the checkout (the build writes build/ and *.egg-info/)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".venv"))
    out = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    # offline with the installed setuptools first; where it cannot build wheels (setuptools < 70.1
    # without the wheel package), the way `pip install .` does it: an isolated build environment
    r = subprocess.run([*cmd, "--no-build-isolation", "--no-index"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list(out.glob("ckptfs-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_contains_the_product_and_no_test_tooling(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "ckptfs/fs.py" in names and "ckptfs/__main__.py" in names and "ckptfs/crashpoints.py" in names
    # every module of the source package is shipped (subpackages included)
    src = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ckptfs").rglob("*.py") if "__pycache__" not in p.parts}
    assert src <= set(names), sorted(src - set(names))
    assert not [n for n in names if n.startswith("ckptfs_testing")]
    assert not [n for n in names if Path(n).stem in TOOLING], names
    assert not [n for n in names if n.split("/")[0] in ("tests", "campaigns", "bench", "scripts")]
    top = {n.split("/")[0] for n in names}
    assert top == {"ckptfs", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, top


def test_installed_wheel_cannot_import_test_tooling(wheel: Path, tmp_path: Path) -> None:
    """The issue's acceptance: install the wheel, then ``import ckptfs.modelcheck`` fails."""
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                        str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "ckptfs" / "fs.py").is_file() and not (site / "ckptfs_testing").exists()
    cwd = tmp_path / "elsewhere"  # not the checkout: its ckptfs/ must not be found via the cwd
    cwd.mkdir()
    # -S: no site-packages processing, so no .pth (e.g. an editable install of a checkout) can supply
    # ckptfs; the dependencies' own directories follow the installed wheel on the path.
    deps = [str(_dep_dir(m)) for m in ("blake3", "mfusepy")]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(site), *deps])}

    def py(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)

    r = py("import ckptfs, ckptfs.fs; print(ckptfs.__file__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(site)), r.stdout  # the installed copy, not the checkout
    r = py("from ckptfs.cli import main")  # the console script's entry point
    assert r.returncode == 0, r.stderr
    for mod in ("ckptfs.modelcheck", "ckptfs.mc_workloads", "ckptfs.faults", "ckptfs_testing"):
        r = py(f"import {mod}")
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (mod, r.stderr)
