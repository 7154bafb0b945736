"""Client side of a line-protocol child process (the fork servers of ``tests/workloads``)."""

from __future__ import annotations

import subprocess


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
