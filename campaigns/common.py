"""Shared machinery: fork-server client, real mounts, Wilson intervals, output.

Mounts come from ``ckptfs_testing.mount`` (``Mount``: a foreground daemon started
and stopped by PID), so tests, campaigns and the benchmark share one implementation.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
for _p in (ROOT, WORKLOADS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from ckptfs_testing.lineserver import LineServer  # noqa: E402
from ckptfs_testing.mount import Mount, child_env, fusermount  # noqa: E402

_env = child_env  # the name the campaigns use

__all__ = ["ROOT", "WORKLOADS", "Mount", "_env", "fusermount", "ForkServer", "wilson", "machine", "dump",
           "killed_by", "no_fuse_mounts_under", "workload",
           "interruptible"]


class ForkServer(LineServer):
    """Client of ``tests/workloads/forkserver.py``: fork workers without re-importing torch."""

    def __init__(self, *modules: str) -> None:
        self.p = subprocess.Popen([sys.executable, str(WORKLOADS / "forkserver.py"), *modules],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env())
        assert self.p.stdout
        ready = self.p.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"fork server failed to start: {ready!r}")

    def call(self, func: str, *args: object) -> int:
        """Fork a child running ``func(*args)``; return its pid."""
        return int(self.ask(f"call {func} {json.dumps(list(args))}").split()[1])

    def run(self, func: str, *args: object) -> float:
        """Run ``func(*args)`` to completion in a child; return seconds; raise if it failed."""
        t0 = time.perf_counter()
        status = self.reap(self.call(func, *args))
        if status != 0:
            raise RuntimeError(f"{func}{args} failed with wait status {status}")
        return time.perf_counter() - t0

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def killed_by(status: int) -> int | None:
    """Signal number that ended a child (raw wait status), None if it exited."""
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def wilson(ok: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95% interval for ok/n, as fractions (the seed paper's method)."""
    if n == 0:
        return (0.0, 1.0)
    p = ok / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def machine() -> str:
    """One line describing where a campaign ran."""
    import torch

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return (f"{platform.machine()} {cpu}, {os.cpu_count()} cores, Linux {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def fstype() -> str:
    """The filesystem the temp directory (where campaigns run) is on."""
    tmp = os.path.realpath(tempfile.gettempdir())
    best = ("?", "")
    with open("/proc/mounts") as fh:
        for ln in fh:
            parts = ln.split()
            if tmp.startswith(parts[1]) and len(parts[1]) >= len(best[1]):
                best = (parts[2], parts[1])
    return f"{tmp} on {best[0]}"


def dump(result: dict, path: str | None) -> None:
    """Print a one-line summary and write the JSON result (if path)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k in ("campaign", "trials", "violations", "wall_s")})[:2000])


def no_fuse_mounts_under(base: Path) -> bool:
    """True if no FUSE mount is left below ``base`` (campaign hygiene check)."""
    with open("/proc/mounts") as f:
        return not any(str(base) in ln and "fuse" in ln for ln in f)


def workload(name: str) -> Any:
    """Import a module from ``tests/workloads`` (e.g. ``saver``) in this process."""
    return importlib.import_module(name)


def interruptible() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so ``finally`` blocks unmount and stop
    what a campaign started (also when started in the background, where SIGINT is ignored)."""
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
