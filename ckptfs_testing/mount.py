"""Real ckptfs mounts for tests, campaigns and the benchmark: one harness.

:class:`Mount` runs the product's own ``python -m ckptfs mount -f`` (foreground)
as a child process of this one, waits until it serves the mount, and stops it
by PID: ``fusermount3 -u`` (retried, ``-uz`` as fallback), then wait for the
PID, SIGKILL by PID if it does not exit.  :meth:`Mount.kill` is a crash
(SIGKILL by PID).  Callers stop what they start (``with Mount(...)`` or
``try/finally``).

Invariant: a Mount only ever signals the PID of the daemon it started itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptfs.cli import is_ckptfs_mount

ROOT = Path(__file__).resolve().parent.parent  # the source checkout (ckptfs/ and ckptfs_testing/)


def fusermount(path: str | Path, lazy: bool = False) -> bool:
    """``fusermount3 -u PATH`` (``-uz`` if ``lazy``); True if it succeeded."""
    exe = shutil.which("fusermount3") or "fusermount"
    r = subprocess.run([exe, "-uz" if lazy else "-u", str(path)], capture_output=True)
    return r.returncode == 0


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child python: this checkout first on PYTHONPATH, no inherited crash point."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CKPTFS_CRASH_AT", None)
    if extra:
        env.update(extra)
    return env


class Mount:
    """A foreground ckptfs daemon serving ``path`` (backing ``backing``; default: in place).

    ``env``: extra environment of the daemon (e.g. ``CKPTFS_CRASH_AT``); ``extra_args``: more
    ``ckptfs mount`` options; ``stop_timeout``: seconds :meth:`stop` waits for the daemon to exit
    after the unmount (an async daemon drains its backlog first) before it is SIGKILLed.
    The daemon's stderr goes to an unnamed temporary file (never a pipe nobody reads):
    :meth:`stderr_text`, and the error raised when it exits during :meth:`start`.
    """

    def __init__(self, path: Path, backing: Path | None = None, commit: str = "sync",
                 env: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 stop_timeout: float = 60.0, variant: str | None = None) -> None:
        self.path = Path(path)
        self.variant = variant  # a known-bad rule variant (ckptfs_testing/variant.py), None: ckptfs as is
        self.backing = Path(backing) if backing is not None else self.path
        self.commit = commit
        self.env = env
        self.extra_args = extra_args or []
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen | None = None
        self._err = None

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout: float = 20.0) -> Mount:
        """Start the daemon; return once it answers on the mount (its ``user.ckptfs.pid`` xattr)."""
        prog = ["-m", "ckptfs"] if self.variant is None else ["-m", "ckptfs_testing.variant", self.variant]
        argv = [sys.executable, *prog, "mount", "-f", str(self.path), "--commit", self.commit, *self.extra_args]
        if self.backing != self.path:
            argv += ["--backing", str(self.backing)]
        self._close_err()
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, env=child_env(self.env), stdout=subprocess.DEVNULL,
                                     stderr=self._err, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.stderr_text()
                self._close_err()
                raise RuntimeError(f"ckptfs exited during start: {err}")
            if is_ckptfs_mount(str(self.path)):
                try:
                    os.getxattr(str(self.path), "user.ckptfs.pid")
                    return self
                except OSError:
                    pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"ckptfs did not mount {self.path} in time")

    def stop(self) -> None:
        """Clean unmount; fall back to lazy unmount, and to SIGKILL by PID if the daemon stays."""
        if is_ckptfs_mount(str(self.path)):
            if not fusermount(self.path):
                time.sleep(0.2)
                if not fusermount(self.path):
                    fusermount(self.path, lazy=True)
        if self.proc is not None:
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._close_err()

    def remount(self, env: dict[str, str] | None = None) -> Mount:
        self.stop()
        self.env = env
        return self.start()

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

    def __enter__(self) -> Mount:
        if self.proc is not None and self.proc.poll() is None:
            return self  # ``with m.start():``: already serving (a second start would orphan the first daemon)
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ observation
    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stderr_text(self) -> str:
        """What the daemon wrote to stderr so far (until :meth:`stop`)."""
        if self._err is None:
            return ""
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def stats(self) -> dict:
        """The daemon's counters (``user.ckptfs.stats`` on the mount root)."""
        return json.loads(os.getxattr(str(self.path), "user.ckptfs.stats"))

    def rss_kib(self) -> tuple[int, int]:
        """(current VmRSS, peak VmHWM) of the daemon in KiB."""
        vals = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    vals[k] = int(v.split()[0])
        return vals.get("VmRSS", 0), vals.get("VmHWM", 0)

    def cpu_s(self) -> float:
        """User + system CPU seconds the daemon has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _close_err(self) -> None:
        if self._err is not None:
            self._err.close()
            self._err = None
