"""Issue 26: every command, given odd paths and option values (non-UTF-8 names, newlines, 255-byte
names, a tree 1,000 levels deep, a path that is a file, a missing one, a ckptfs directory and a
plain one), ends with a documented exit code (0, 1, 2) and never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Mount, _env, fusermount

from ckptfs.cli import is_ckptfs_mount

COMMANDS = [["status"], ["verify", "--json"], ["ls", "--all", "--json"], ["show"],
            ["latest", "--json"], ["gc", "--dry-run"], ["recover"], ["forget"], ["scrub"],
            ["seal"], ["umount"]]


def _run(args: list[bytes | str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, env=_env(), cwd=cwd,
                          timeout=120)


def _targets(tmp: Path) -> list[bytes]:
    base = tmp.as_posix().encode()
    odd = tmp / "odd"
    odd.mkdir()
    names = [b"caf\xe9-latin1", b"new\nline", b"x" * 255, b"-dash", b" space "]
    out = []
    for n in names:
        p = os.path.join(odd.as_posix().encode(), n)
        os.mkdir(p)
        with open(os.path.join(p, b"model.pt"), "wb") as f:
            f.write(b"\0" * 10)
        out.append(p)
    deep = tmp / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(1000):  # 1,000 levels (verify recursed into RecursionError)
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    (tmp / "file.txt").write_text("plain")
    return [*out, base + b"/deep", base + b"/file.txt", base + b"/missing", base + b"/odd", b"", b"\xff\xfe"]


@pytest.mark.parametrize("mounted", [False, True], ids=["plain", "ckptfs"])
def test_commands_on_odd_paths_end_cleanly(tmp_path: Path, mounted: bool) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    here = tmp_path / "cwd"  # the commands' working directory: relative and empty paths resolve here
    here.mkdir()
    targets = _targets(d)
    failures = []

    def sweep() -> None:
        for cmd in COMMANDS:
            for t in targets:
                args: list[bytes | str] = [*cmd, t] if cmd[0] != "forget" else [*cmd, str(d), t]
                r = _run(args, cwd=here)
                err = r.stderr.decode(errors="replace")
                if r.returncode not in (0, 1, 2) or "Traceback" in err:
                    failures.append(f"ckptfs {' '.join(map(repr, args))}: exit {r.returncode}: {err[-400:]}")

    try:
        if mounted:
            with Mount(d).start():
                sweep()
        else:
            sweep()
    finally:
        _remove_deep(d / "deep")  # pytest's own cleanup of old runs recurses: RecursionError at 1,000
    assert not failures, "\n".join(failures[:20])
    assert list(here.iterdir()) == [], "a command wrote into its working directory"


@pytest.mark.parametrize("cmd", [["mount"], ["recover"], ["status"], ["verify"], ["ls"], ["latest"], ["show"],
                                 ["gc", "--dry-run"], ["scrub"], ["seal"], ["umount"], ["forget", "/nonexistent"],
                                 ["mount", "/nonexistent", "--backing"]],
                         ids=lambda c: "-".join(x.strip("-/") for x in c if x != "/nonexistent"))
def test_an_empty_path_is_refused_not_taken_for_the_working_directory(tmp_path: Path, cmd: list[str]) -> None:
    """``ckptfs mount "$UNSET"`` mounted the shell's working directory (``os.path.abspath('')``), and
    ``recover ''`` recovered it: an earlier run of the fuzz test above left a ``.ckptfs/`` in the
    repository's root that way.  An empty path names nothing, as for ``ls ''``."""
    here = tmp_path / "cwd"
    here.mkdir()
    (here / ".ckptfs").mkdir()  # (recover, scrub and the rest would act on a ckptfs directory here)
    r = _run([*cmd, ""], cwd=here)
    try:
        assert r.returncode == 2, r
        assert b"'': no such file or directory" in r.stderr, r.stderr
        assert sorted(p.name for p in here.iterdir()) == [".ckptfs"] and not any((here / ".ckptfs").iterdir())
    finally:
        if is_ckptfs_mount(str(here)):  # (the defect: a daemon serves the working directory)
            fusermount(here)
            fusermount(here, lazy=True)
    assert not is_ckptfs_mount(str(here))


def _remove_deep(top: Path) -> None:
    """Remove the 1,000-level tree without recursion (shutil.rmtree and os.walk recurse in 3.11)."""
    chain = [str(top)]
    while True:
        nxt = os.path.join(chain[-1], "d")
        if not os.path.isdir(nxt):
            break
        chain.append(nxt)
    for p in reversed(chain):
        os.rmdir(p)


@pytest.mark.parametrize("args", [
    ["mount", "{d}", "--keep-last", "x"], ["mount", "{d}", "--keep-last", "-1"],
    ["mount", "{d}", "--idle-seal", "1e999"], ["mount", "{d}", "--commit", "maybe"],
    ["mount", "{d}", "--metrics", "nonsense"], ["mount", "{d}", "--mirror", "ftp://x"],
    ["mount", "{d}", "--mirror-part-size", "-5"], ["mount", "{d}", "--keep-generations", "1.5"],
    ["verify", "--bogus"], ["restore"], ["ls"], ["latest", "{d}", "{d}"]])
def test_bad_option_values_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    r = _run([a.format(d=tmp_path) for a in args])
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and "Traceback" not in err, err
    assert subprocess.run(["mountpoint", "-q", str(tmp_path)]).returncode != 0
