"""Test helpers: real ckptfs mounts (``ckptfs_testing.mount.Mount``, started and stopped by PID),
fixtures, ``run_py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptfs_testing.lineserver import LineServer  # noqa: E402
from ckptfs_testing.mount import Mount, child_env, fusermount  # noqa: E402

__all__ = ["ROOT", "LineServer", "Mount", "fusermount", "_env", "run_py"]

_env = child_env  # the name the tests use


@pytest.fixture
def mnt(tmp_path: Path):
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d).start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def mnt_async(tmp_path: Path):
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d, commit="async").start()
    try:
        yield m
    finally:
        m.stop()


def release_and_reap(w: subprocess.Popen, line: str = "go") -> int:
    """Send ``line`` to a child paused on its stdin and return its exit status (60 s at most)."""
    assert w.stdin is not None
    w.stdin.write(line + "\n")
    w.stdin.flush()
    return w.wait(60)


def kill_if_running(w: subprocess.Popen) -> None:
    """Clean up a child a failed assertion left running (by its own handle, never by name)."""
    if w.poll() is None:
        w.kill()
        w.wait()


def run_py(code: str, cwd: Path | None = None, timeout: float = 120, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=_env(env))
    if check and r.returncode != 0:
        raise AssertionError(f"python failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="session")
def users():
    """Two real unprivileged accounts, made with ``useradd`` for this run and removed after it
    (issue 26: attacks and mounts as users, not only as root).  [(name, uid, gid), ...]"""
    import os
    import pwd

    made, out = [], []
    for name in (f"ckptfs-a{os.getpid() % 10000}", f"ckptfs-b{os.getpid() % 10000}"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                           check=True, capture_output=True)
            made.append(name)
            pw = pwd.getpwnam(name)
        out.append((name, pw.pw_uid, pw.pw_gid))
    try:
        yield out
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
