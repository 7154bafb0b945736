"""keep_cache (ckptfs/fuse/pagecache.py) on a real mount: a reopened, unchanged, verified
version is served from the kernel's page cache; anything that changes what the
path shows (a new install of the same size, a refused version whose bytes went
through the kernel's page cache, a change behind ckptfs' back that triggers a
rollback, a writer open at the same time) never lets stale pages through."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from conftest import Mount

SIZE = 3 << 20  # three 1 MiB chunks


def kept(d: Path) -> int:
    return int(json.loads(os.getxattr(d, "user.ckptfs.stats")).get("keep_cache_opens", 0))


def released(d: Path, timeout: float = 10.0) -> None:
    """Wait until the daemon has handled the RELEASE of every handle closed so far: the kernel
    sends RELEASE after close() returns, and a worker thread may serve the next OPEN first (the
    rule then sees the closed writer's handle still open, correctly not keeping the cache)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = json.loads(os.getxattr(d, "user.ckptfs.stats"))
        if s.get("fuse_release", 0) >= s.get("fuse_open", 0) + s.get("fuse_create", 0):
            return
        time.sleep(0.01)
    raise AssertionError("RELEASE requests still pending after 10 s")


def read_all(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def test_keep_cache_never_serves_stale_pages(tmp_path: Path) -> None:
    d, b = tmp_path / "mnt", tmp_path / "backing"
    d.mkdir()
    b.mkdir()
    v1, v2 = os.urandom(SIZE), os.urandom(SIZE)
    # the rule serves the daemon-read path (mfusepy, or no passthrough); passthrough opens read the
    # backing file and use no FUSE page cache at all (tests/test_native.py)
    with Mount(d, backing=b, extra_args=["--on-corrupt", "rollback", "--no-passthrough"]):
        (d / "a.bin").write_bytes(v1)
        released(d)
        assert read_all(d / "a.bin") == v1  # first open of this version: kernel pages dropped
        n = kept(d)
        released(d)
        assert read_all(d / "a.bin") == v1  # unchanged, verified: pages kept
        assert kept(d) == n + 1
        # a new install of the same size (same FUSE inode, same kernel size): never kept
        (d / "a.bin").write_bytes(v2)
        released(d)
        n = kept(d)
        assert read_all(d / "a.bin") == v2
        assert kept(d) == n
        released(d)
        assert read_all(d / "a.bin") == v2
        assert kept(d) == n + 1
        # a reader while a writer has the path open: not kept (the writer's pages may enter)
        with open(d / "a.bin", "r+b"):
            n = kept(d)
            assert read_all(d / "a.bin") == v2
            assert kept(d) == n
        # changed behind ckptfs' back (same size): the rollback policy serves kept generation v1,
        # never the cached pages of v2
        with open(b / "a.bin", "r+b") as f:
            f.seek(SIZE // 2)
            f.write(b"\xff" * 4096)
        n = kept(d)
        assert read_all(d / "a.bin") == v1
        assert kept(d) == n
        assert "serving kept generation" in os.getxattr(d / "a.bin", "user.ckptfs.rollback").decode()

        # a refused version whose bytes went through the kernel's page cache: the path shows v1 again
        torch.save({"w": torch.arange(300_000)}, d / "m.pt")
        good = read_all(d / "m.pt")
        assert read_all(d / "m.pt") == good
        bad = good[:4] + os.urandom(len(good) - 4)  # same size, zip magic, no directory: refused at close
        try:
            with open(d / "m.pt", "wb") as f:
                f.write(bad)
        except OSError:
            pass
        else:
            raise AssertionError("an incomplete .pt was committed")
        n = kept(d)
        assert read_all(d / "m.pt") == good
        assert kept(d) == n
        assert torch.equal(torch.load(d / "m.pt")["w"], torch.arange(300_000))


def test_mount_raises_readahead(tmp_path: Path) -> None:
    """The mount's bdi gets read_ahead_kb = 4096 (1 MiB read requests, not 128 KiB), also when the
    helper thread starts only after the mount is up."""
    if os.geteuid() != 0:
        pytest.skip("sysfs read_ahead_kb needs root")
    d = tmp_path / "mnt"
    d.mkdir()
    with Mount(d):
        dev = os.stat(d).st_dev
        f = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        deadline = time.monotonic() + 10
        while f.read_text().strip() != "4096" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f.read_text().strip() == "4096"
