"""The user guide (docs/guide, mkdocs.yml) builds with ``mkdocs build --strict``: every nav entry
exists and every link between pages resolves (issue 13)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_the_user_guide_builds_strict(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for page in ("guide/install/index.html", "guide/frameworks/hf-trainer/index.html", "guide/reference/index.html",
                 "guide/troubleshooting/index.html", "results/reliability/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """(So the test above can fail.)"""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nstrict: true\n")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "missing.md" in r.stdout + r.stderr
