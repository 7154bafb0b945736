"""``ckptfs mount --metrics`` (Prometheus text format at /metrics), ``ckptfs status --watch``, and the
slow-commit rule (issue 13)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import torch
from conftest import Mount
from test_groups import save_hf_like

from ckptfs.latency import CommitTimes
from ckptfs.mounts import is_ckptfs_mount


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_what_the_daemon_did(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    port = _free_port()
    with Mount(d, extra_args=["--metrics", f"127.0.0.1:{port}"]) as m:
        m0 = _scrape(port)
        assert m0["ckptfs_commits_total"] == 0 and m0['ckptfs_groups{state="sealed"}'] == 0
        torch.save({"w": torch.zeros(1 << 16)}, m.path / "a.pt")
        save_hf_like(m.path, 1)  # 3 files, one sealed group
        good = m.path / "b.pt"
        torch.save({"w": torch.ones(1 << 16)}, good)
        torn = good.read_bytes()[:5000]  # a zip cut short: refused at close
        try:
            with open(m.path / "c.pt", "wb") as f:
                f.write(torn)
        except OSError:
            pass
        assert zipfile.is_zipfile(good)
        got = _scrape(port)
        assert got["ckptfs_commits_total"] == 5, got
        assert got["ckptfs_bytes_committed_total"] >= 2 * (1 << 18)
        assert got['ckptfs_aborts_total{reason="incomplete"}'] == 1, got
        assert got['ckptfs_aborts_total{reason="writer_killed"}'] == 0
        assert got['ckptfs_groups{state="sealed"}'] == 1 and got['ckptfs_groups{state="open"}'] == 0
        assert got["ckptfs_commit_seconds_count"] == 5 and got['ckptfs_commit_seconds_bucket{le="+Inf"}'] == 5
        assert 0 < got["ckptfs_commit_seconds_sum"] < 60
        assert got["ckptfs_commit_queue_depth"] == 0
        assert good.read_bytes() and _scrape(port)["ckptfs_verify_bytes_total"] > 0  # verified at open
        os.setxattr(m.path, "user.ckptfs.control", b"scrub")
        for _ in range(200):
            if _scrape(port)["ckptfs_scrub_progress_ratio"] == 1.0:
                break
            time.sleep(0.05)
        assert _scrape(port)["ckptfs_scrub_progress_ratio"] == 1.0
        # the same counters, live in the terminal
        r = subprocess.run([sys.executable, "-m", "ckptfs", "status", str(m.path), "--watch", "--count", "2",
                            "--interval", "0.1"], capture_output=True, text=True, timeout=60)
        lines = r.stdout.strip().splitlines()
        assert r.returncode == 0 and len(lines) == 2, r
        assert re.search(r"commits 5 .*aborts 1 .*groups sealed=1", lines[-1]), lines


def test_a_taken_or_bad_metrics_address_is_a_clear_error_and_mounts_nothing(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "ckptfs", "mount", str(d), "--metrics", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "already in use" in r.stderr and "Traceback" not in r.stderr, r
        assert not is_ckptfs_mount(str(d))
    for bad in ("nonsense", "127.0.0.1:99999", "example.com:80"):
        r = subprocess.run([sys.executable, "-m", "ckptfs", "mount", str(d), "--metrics", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--metrics" in r.stderr and "Traceback" not in r.stderr, (bad, r)
        assert not is_ckptfs_mount(str(d))


def test_a_commit_far_slower_than_the_disk_predicts_is_counted_slow() -> None:
    t = CommitTimes()
    assert not t.observe(5.0, 100)  # nothing measured yet: nothing is slow
    for _ in range(3):
        t.observe(0.002, 4096)  # small commits: ~2 ms fixed cost
        t.observe(0.1, 40 << 20)  # 400 MiB/s
    assert not t.observe(0.25, 64 << 20)  # predicted 0.162 s: within 2x
    assert t.observe(0.5, 64 << 20)  # more than 2x
    assert t.observe(0.05, 4096)  # a 4 KiB commit taking 50 ms
    snap = t.snapshot()
    assert snap["slow"] == 2 and snap["count"] == 10 and snap["buckets"][-1] == (float("inf"), 10)
    assert json.dumps(snap["buckets"][:-1])  # finite bounds serialize
