"""Test helpers: real ckptfs mounts started and stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptfs.cli import is_ckptfs_mount  # noqa: E402


def fusermount(path: Path, lazy: bool = False) -> bool:
    exe = shutil.which("fusermount3") or "fusermount"
    r = subprocess.run([exe, "-uz" if lazy else "-u", str(path)], capture_output=True)
    return r.returncode == 0


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CKPTFS_CRASH_AT", None)
    if extra:
        env.update(extra)
    return env


class LineServer:
    """Client of a fork server child (``tests/workloads/forkserver.py``, ``fwlib.serve``): one reply
    line per request line on its stdin/stdout; ``reap PID`` answers ``status S``."""

    p: subprocess.Popen

    def ask(self, line: str) -> str:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline().strip()
        if not reply:
            raise RuntimeError(self.died(line))
        return reply

    def died(self, line: str) -> str:
        return f"fork server died (exit {self.p.poll()}) on {line!r}"

    def reap(self, pid: int) -> int:
        """Wait for a child; return its raw wait status."""
        return int(self.ask(f"reap {pid}").split()[1])

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if self.p.stdout:
            self.p.stdout.close()


class Mount:
    """A foreground ckptfs daemon serving ``path`` (backing ``backing``)."""

    def __init__(self, path: Path, backing: Path | None = None, commit: str = "sync",
                 env: dict[str, str] | None = None, extra_args: list[str] | None = None) -> None:
        self.path = path
        self.backing = backing or path
        self.commit = commit
        self.env = env
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> Mount:
        argv = [sys.executable, "-m", "ckptfs", "mount", "-f", str(self.path), "--commit", self.commit,
                *self.extra_args]
        if self.backing != self.path:
            argv += ["--backing", str(self.backing)]
        self.proc = subprocess.Popen(argv, env=_env(self.env), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"ckptfs exited during start: {err}")
            if is_ckptfs_mount(str(self.path)):
                try:
                    os.getxattr(str(self.path), "user.ckptfs.pid")
                    return self
                except OSError:
                    pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("ckptfs did not mount in time")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self, detach: bool = True) -> None:
        """SIGKILL the daemon (a crash) and, unless ``detach`` is False, detach the dead mount.

        While writers of the crashed daemon may still run, pass ``detach=False``, stop them, then
        call :meth:`detach`: a dead mount fails every call with ENOTCONN, but once detached a path
        lookup reaches the backing directory underneath (the in-place mount) and a still-running
        writer would write there directly, bypassing ckptfs, as no real crash lets it.
        """
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc:
            self.proc.wait()
        if detach:
            self.detach()

    def detach(self) -> None:
        """Lazily unmount a dead mount (what an operator does before remounting)."""
        fusermount(self.path, lazy=True)

    def wait_dead(self, timeout: float = 30.0) -> int | None:
        """Exit status once the daemon has exited; None if still alive after timeout."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Clean unmount; fall back to lazy unmount and SIGKILL by PID."""
        if is_ckptfs_mount(str(self.path)):
            if not fusermount(self.path):
                time.sleep(0.2)
                if not fusermount(self.path):
                    fusermount(self.path, lazy=True)
        if self.proc is not None:
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            if self.proc.stderr:
                self.proc.stderr.close()

    def remount(self, env: dict[str, str] | None = None) -> Mount:
        self.stop()
        self.env = env
        return self.start()

    def __enter__(self) -> Mount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def run_py(code: str, cwd: Path | None = None, timeout: float = 120, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=_env(env))
    if check and r.returncode != 0:
        raise AssertionError(f"python failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r
