"""How long commits take, and which ones were slow (the slow-persist alert).

:class:`CommitTimes` is fed one observation per installed version (seconds from seal to durable
install, bytes) by the commit engine and read by the metrics endpoint (``ckptfs/metrics.py``) and
``ckptfs status``.  No dependency: the engine stays free of the metrics library.

Slow: a commit that took more than :data:`SLOW_FACTOR` times what the disk predicts, where the
prediction is ``fixed + bytes / bandwidth``, both measured from this mount's own commits (the
median time of small commits; the median throughput of commits of at least
:data:`BANDWIDTH_MIN_BYTES`).  Until :data:`WARMUP` commits of each kind were seen nothing is
called slow: there is no measurement to compare with yet.

What the log says (:class:`SlowLog`, issue 24: 6,525 of 6,595 lines of one fsstress run were
warnings about 2-20 ms commits, and the three real errors were buried): a slow commit is a WARNING
line of its own only when it also took at least :data:`SLOW_WARN_SECONDS`; the routine ones are
counted (``ckptfs_slow_commits_total``) and summarized in one INFO line at most every
:data:`SLOW_SUMMARY_SECONDS`, naming the slowest.
"""

from __future__ import annotations

import bisect
import collections
import statistics
import threading
import time
from collections.abc import Callable

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SLOW_FACTOR = 2.0
BANDWIDTH_MIN_BYTES = 4 << 20
SMALL_MAX_BYTES = 256 << 10
WARMUP = 3
WINDOW = 64  # recent commits each estimate is the median of
SLOW_WARN_SECONDS = 1.0  # a slow commit at least this long is a warning line of its own
SLOW_SUMMARY_SECONDS = 60.0  # routine slow commits: one summary line at most this often


class SlowLog:
    """Decides what the log says about slow commits: :meth:`note` returns ``("warning", line)`` for
    one that took :data:`SLOW_WARN_SECONDS` or more, ``("info", summary)`` when a summary of the
    routine ones is due, else None (counted for the next summary)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.since = clock()
        self.count = 0
        self.worst: tuple[float, str] = (0.0, "")

    def note(self, path: str, nbytes: int, seconds: float) -> tuple[str, str] | None:
        if seconds >= SLOW_WARN_SECONDS:
            return "warning", (f"slow commit: {path} ({nbytes} bytes) took {seconds:.3f} s, more than "
                               f"{SLOW_FACTOR:.0f}x what this disk's recent commits predict")
        with self.lock:
            self.count += 1
            if seconds > self.worst[0]:
                self.worst = (seconds, path)
            now = self.clock()
            if now - self.since < SLOW_SUMMARY_SECONDS:
                return None
            line = (f"{self.count} slow commit(s) in the last {now - self.since:.0f} s, each more than "
                    f"{SLOW_FACTOR:.0f}x what this disk's recent commits predict (slowest {self.worst[0]:.3f} s: "
                    f"{self.worst[1]}); counted in ckptfs_slow_commits_total")
            self.since, self.count, self.worst = now, 0, (0.0, "")
            return "info", line


class CommitTimes:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = [0] * (len(BUCKETS) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum = 0.0
        self.count = 0
        self.slow = 0
        self.small: collections.deque[float] = collections.deque(maxlen=WINDOW)  # seconds
        self.rates: collections.deque[float] = collections.deque(maxlen=WINDOW)  # bytes per second

    def predicted(self, nbytes: int) -> float | None:
        """(lock held) Seconds the disk predicts for a commit of ``nbytes``; None before warm-up."""
        if len(self.small) < WARMUP or len(self.rates) < WARMUP:
            return None
        return statistics.median(self.small) + nbytes / statistics.median(self.rates)

    def observe(self, seconds: float, nbytes: int) -> bool:
        """Record one commit; True if it was slow."""
        with self.lock:
            self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self.sum += seconds
            self.count += 1
            want = self.predicted(nbytes)
            slow = want is not None and seconds > SLOW_FACTOR * want
            if slow:
                self.slow += 1
            if nbytes <= SMALL_MAX_BYTES:
                self.small.append(seconds)
            if nbytes >= BANDWIDTH_MIN_BYTES and seconds > 0:
                self.rates.append(nbytes / seconds)
            return slow

    def snapshot(self) -> dict:
        """Cumulative buckets (``le`` -> count, as Prometheus wants them), sum, count, slow."""
        with self.lock:
            cum, acc = [], 0
            for le, c in zip((*BUCKETS, float("inf")), self.counts, strict=True):
                acc += c
                cum.append((le, acc))
            bw = statistics.median(self.rates) if self.rates else None
            return {"buckets": cum, "sum": self.sum, "count": self.count, "slow": self.slow,
                    "bandwidth_bytes_per_s": bw}
