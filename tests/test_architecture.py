"""The layout's rules (issue 11), measured on the source: no import cycle in ``ckptfs/``, no module
below the facade imports it or anything above it (scripts/import_graph), and no engine or
integrity component keeps a reference to the filesystem object."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_cycle_and_no_upward_import() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cycles 0, upward imports 0" in r.stdout


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """scripts/import_graph fails on a tree that breaks the rules (so the test above can fail)."""
    pkg = tmp_path / "ckptfs"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "fs.py").write_text("from ckptfs.engine import commit\n")
    (pkg / "engine" / "commit.py").write_text("def f():\n    from ckptfs import fs\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "cycles 1, upward imports 1" in r.stdout
    assert "upward: ckptfs.engine.commit -> ckptfs.fs" in r.stdout


def test_components_below_the_facade_hold_no_filesystem_object() -> None:
    """Engine, integrity and page-cache components get explicit dependencies: none has an attribute
    named ``fs`` (the back-reference ``Integrity.fs`` and ``PageCachePolicy.fs`` had)."""
    offenders = []
    for sub in ("engine", "integrity", "log"):
        for p in sorted((ROOT / "ckptfs" / sub).glob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr == "fs" and isinstance(node.value, ast.Name)
                        and node.value.id == "self"):
                    offenders.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    p = ROOT / "ckptfs" / "fuse" / "pagecache.py"
    offenders += [f"{p.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(ast.parse(p.read_text()))
                  if isinstance(n, ast.Attribute) and n.attr == "fs"]
    assert offenders == []
