"""Prometheus metrics of a mounted daemon: ``ckptfs mount --metrics 127.0.0.1:PORT`` serves them at
``/metrics`` (text format, ``prometheus_client``), read from the daemon's state at each scrape.

An adapter like the FUSE layer and the command line: it reads the facade (``CkptFS``: its stats,
groups, queue, scrubber and commit times) and changes nothing.  :func:`sample` is the one place
that computes the values; ``ckptfs status --watch`` shows the same names from the status xattrs.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptfs.fs import CkptFS

ABORT_KINDS = ("writer_killed", "incomplete", "no_space", "io_error", "other")
GROUP_STATES = ("open", "sealed", "torn", "corrupt")


class MetricsAddressError(ValueError):
    """A --metrics value that is not HOST:PORT, or a port that cannot be bound."""


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (loopback) -> (host, port).  Raises MetricsAddressError."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        n = int(port)
    except ValueError:
        raise MetricsAddressError(f"--metrics {value!r}: want HOST:PORT, e.g. 127.0.0.1:9400") from None
    if not 0 < n < 65536:
        raise MetricsAddressError(f"--metrics {value!r}: port {n} is out of range 1-65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise MetricsAddressError(f"--metrics {value!r}: {host!r} is not an IP address") from None
    return host, n


def check_bindable(host: str, port: int) -> None:
    """Raise MetricsAddressError with a clear message if ``host:port`` cannot be served (taken,
    not an address of this machine), before anything is mounted."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            why = "is already in use" if e.errno == 98 else f"cannot be bound ({e.strerror})"
            raise MetricsAddressError(f"--metrics {host}:{port}: the port {why}; pick another with "
                                      f"--metrics {host}:PORT") from None


def _mirror(fs: CkptFS) -> dict[str, Any]:
    """The mirror's root summary (``user.ckptfs.mirror``), {} without ``--mirror``."""
    import json

    from ckptfs.xattrs import X_MIRROR

    for source in list(fs.attr_sources):
        v = source("").get(X_MIRROR)
        if v:
            return json.loads(v)
    return {}


def sample(fs: CkptFS) -> dict[str, Any]:
    """Every metric's current value (label tuples for labelled ones)."""
    st = dict(fs.stats)
    mirror = _mirror(fs)
    groups = {s: 0 for s in GROUP_STATES}
    for g in list(fs.grp.groups.values()):
        groups[g.state] = groups.get(g.state, 0) + 1
    scrub = dict(fs.integrity.scrub_info)
    if scrub.get("state") == "running" and scrub.get("bytes_total"):
        ratio = min(1.0, scrub.get("bytes_done", 0) / scrub["bytes_total"])
    else:
        ratio = 1.0 if scrub.get("finished") else 0.0
    return {
        "commits_total": st.get("commits", 0),
        "bytes_committed_total": st.get("bytes_committed", 0),
        "aborts_total": {k: st.get("aborts_" + k, 0) for k in ABORT_KINDS},
        "corrupt_total": st.get("corrupt_detected", 0),
        "groups": groups,
        "commit_queue_depth": len(fs.queued),
        "verify_bytes_total": st.get("verify_bytes_hashed", 0),
        "scrub_progress_ratio": ratio,
        "slow_commits_total": st.get("slow_commits", 0),
        "commit_seconds": fs.commit.times.snapshot(),
        "mirror_queue": mirror.get("queue", 0),
        "mirror_pinned_groups": mirror.get("pinned_groups", 0),
        "mirror_pinned_bytes": mirror.get("pinned_bytes", 0),
        "mirror_pin_alert": 1 if mirror.get("alert") else 0,
        "mirror_bytes_uploaded_total": mirror.get("bytes_uploaded", 0),
        "mirror_groups_committed_total": mirror.get("groups_committed", 0),
        "mirror_failures_total": mirror.get("failures", 0),
    }


# (sample key, metric name, kind, help, label) for every metric but the histogram; a labelled one
# samples a dict label value -> number
METRICS = (
    ("commits_total", "ckptfs_commits", "counter", "Versions committed (installed durably)", None),
    ("bytes_committed_total", "ckptfs_bytes_committed", "counter", "Bytes of the versions committed", None),
    ("aborts_total", "ckptfs_aborts", "counter", "Versions never committed, by reason", "reason"),
    ("corrupt_total", "ckptfs_corrupt", "counter", "Corrupt files or groups found (verify on open, scrub)", None),
    ("groups", "ckptfs_groups", "gauge", "Checkpoint groups known to the daemon, by state", "state"),
    ("commit_queue_depth", "ckptfs_commit_queue_depth", "gauge", "Versions waiting for the async committer", None),
    ("verify_bytes_total", "ckptfs_verify_bytes", "counter", "Bytes hashed to verify committed files", None),
    ("scrub_progress_ratio", "ckptfs_scrub_progress_ratio", "gauge",
     "Progress of the running scrub (1: the last finished)", None),
    ("slow_commits_total", "ckptfs_slow_commits", "counter",
     "Commits slower than 2x what this disk's recent commits predict (the slow-persist alert)", None),
    # the tiered mirror (--mirror; all 0 without it)
    ("mirror_queue", "ckptfs_mirror_queue", "gauge", "Groups and files waiting for (or in) upload", None),
    ("mirror_pinned_groups", "ckptfs_mirror_pinned_groups", "gauge",
     "Sealed groups whose remote COMMIT is not confirmed (retention keeps them)", None),
    ("mirror_pinned_bytes", "ckptfs_mirror_pinned_bytes", "gauge", "Bytes of those pinned groups", None),
    ("mirror_pin_alert", "ckptfs_mirror_pin_alert", "gauge", "1 while pinned bytes exceed --mirror-pin-cap", None),
    ("mirror_bytes_uploaded_total", "ckptfs_mirror_bytes_uploaded", "counter", "Bytes uploaded to the store", None),
    ("mirror_groups_committed_total", "ckptfs_mirror_groups_committed", "counter",
     "Groups whose remote COMMIT this node wrote or found", None),
    ("mirror_failures_total", "ckptfs_mirror_failures", "counter", "Upload steps that failed (retried)", None),
)


class _Collector:
    def __init__(self, fs: CkptFS) -> None:
        self.fs = fs

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        v = sample(self.fs)
        for key, name, kind, doc, label in METRICS:
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            if label is None:
                yield family(name, doc, value=v[key])
                continue
            m = family(name, doc, labels=[label])
            for value, n in v[key].items():
                m.add_metric([value], n)
            yield m
        t = v["commit_seconds"]
        yield HistogramMetricFamily("ckptfs_commit_seconds", "Seconds to seal and durably install a version",
                                    buckets=[("+Inf" if le == float("inf") else repr(le), n) for le, n in t["buckets"]],
                                    sum_value=t["sum"])


def serve(fs: CkptFS, host: str, port: int) -> threading.Thread:
    """Serve ``/metrics`` for ``fs`` on ``host:port`` from a daemon thread; returns it."""
    from prometheus_client import CollectorRegistry, start_http_server

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(fs))
    server, thread = start_http_server(port, addr=host, registry=reg)
    return thread
