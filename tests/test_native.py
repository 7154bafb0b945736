"""The native /dev/fuse transport (issue 12): protocol layouts, kernel caching with exact
invalidation, passthrough of committed files, and the fd passing of fusermount3.

Every test mounts a real filesystem except the layout and notifier logic tests (marked "logic").
Request counts come from the daemon's own counters (``user.ckptfs.stats``: ``fuse_<opcode>``)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import Mount, kill_if_running, release_and_reap, run_py

from ckptfs import events
from ckptfs.fuse import kernel as k
from ckptfs.fuse.notify import Notifier
from ckptfs.fuse.ops import Ops

LONG = ["--cache-timeout", "3600"]  # a cached answer that is not invalidated stays wrong for an hour


def stats(m: Mount) -> dict:
    return json.loads(os.getxattr(m.path, "user.ckptfs.stats"))


# ------------------------------------------------------------------ logic: layouts
def test_struct_sizes_match_the_kernel_abi() -> None:
    """sizeof() of each struct in include/uapi/linux/fuse.h (protocol 7.40+)."""
    sizes = {k.IN_HEADER: 40, k.OUT_HEADER: 16, k.ATTR: 88, k.ENTRY_OUT: 128, k.ATTR_OUT: 104,
             k.INIT_OUT: 64, k.SETATTR_IN: 88, k.OPEN_OUT: 16, k.READ_IN: 40, k.RELEASE_IN: 24,
             k.STATFS_OUT: 80, k.CREATE_IN: 16, k.MKNOD_IN: 16, k.RENAME2_IN: 16, k.GETATTR_IN: 16,
             k.NOTIFY_INVAL_ENTRY_OUT: 16, k.NOTIFY_INVAL_INODE_OUT: 24, k.BACKING_MAP: 16, k.FORGET_ONE: 16}
    assert {s.format: s.size for s in sizes} == {s.format: n for s, n in sizes.items()}
    # ioctl numbers: _IOR/_IOW(229, nr, size)
    assert k.DEV_IOC_BACKING_OPEN == (1 << 30) | (16 << 16) | (229 << 8) | 1
    assert k.DEV_IOC_BACKING_CLOSE == (1 << 30) | (4 << 16) | (229 << 8) | 2
    assert k.DEV_IOC_CLONE == (2 << 30) | (4 << 16) | (229 << 8) | 0


def test_attr_packing_keeps_negative_times_and_nanoseconds() -> None:
    fields = k.pack_attr({"st_ino": 7, "st_size": 5, "st_mode": 0o100644, "st_nlink": 1,
                          "st_atime": -1, "st_mtime": 1_700_000_000_123_456_789, "st_ctime": 0})
    ino, size, _b, a, m, c, an, mn, cn, mode, *_ = fields
    assert (ino, size, mode) == (7, 5, 0o100644)
    assert struct.unpack("<q", struct.pack("<Q", a))[0] == -1 and an == 999_999_999
    assert (m, mn, c, cn) == (1_700_000_000, 123_456_789, 0, 0)


# ------------------------------------------------------------------ logic: every event invalidates
class _FakeFS:
    def __init__(self) -> None:
        import collections

        self.stats: collections.Counter[str] = collections.Counter()
        self.served = self.handles_at = lambda *a: None


@pytest.mark.parametrize("kind", events.KINDS)
def test_every_event_kind_invalidates_the_path_its_subtree_and_parent(kind: str) -> None:
    """C1: for each event kind, the notifier queues INVAL_INODE of the path's node, of every node
    below it and of the parent (C2: with its pages, the cached listing), and an epoch bump where
    names may change (every kind the daemon makes on its own).  Fails if a kind is skipped."""
    ops = Ops(_FakeFS(), timeout=3600)  # type: ignore[arg-type]
    for p in ("run", "run/ckpt-1", "run/ckpt-1/model.pt", "run/ckpt-1/sub", "run/ckpt-1/sub/x", "other"):
        ops.nodes.looked_up(p).entry_cached = True
    nid = {p: n.nid for p, n in ops.nodes.by_path.items()}
    note = Notifier(-1, ops)
    note.on_event(events.Event(kind, "run/ckpt-1", dst="run/ckpt-2" if kind == events.RENAMED else ""))
    got = []
    while not note.q.empty():
        got.append(note.q.get())
    inodes = {item[1] for item in got if item[0] == k.NOTIFY_INVAL_INODE}
    assert {nid["run"], nid["run/ckpt-1"], nid["run/ckpt-1/model.pt"], nid["run/ckpt-1/sub/x"]} <= inodes
    assert (k.NOTIFY_INVAL_INODE, nid["run"], 0) in got  # C2: the parent's cached listing too
    assert nid["other"] not in inodes
    daemon_made = kind not in (events.PUBLISHED, events.SEALED, events.RENAMED, events.REWRITING)
    assert ((k.NOTIFY_INC_EPOCH, 0) in got) == daemon_made
    # REWRITING: a cached dentry of the writer's node is dropped at once, on the writer's thread
    assert note.epochs_now == (1 if kind == events.REWRITING else 0)
    if kind in (events.QUARANTINED, events.REMOVED):  # the name's next lookup is a new node
        assert ops.nodes.at("run/ckpt-1") is None and ops.nodes.at("run/ckpt-1/model.pt") is None


# ------------------------------------------------------------------ real mounts
def test_native_transport_serves_and_the_kernel_caches_stable_answers(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=LONG) as m:
        (m.path / "notes.txt").write_text("hello")
        torch.save({"w": torch.arange(4)}, m.path / "model.pt")
        s0 = stats(m)
        assert s0.get("transport_native") == 1
        run_py(f"import os\nfor _ in range(500): os.stat({str(m.path / 'model.pt')!r}); "
               f"os.stat({str(m.path / 'notes.txt')!r})")
        s1 = stats(m)
        asked = sum(s1.get(f"fuse_{op}", 0) - s0.get(f"fuse_{op}", 0) for op in ("lookup", "getattr"))
        assert asked <= 6, f"1000 stats of two stable files reached the daemon {asked} times"


def test_a_name_that_appears_is_seen_despite_a_cached_negative_entry(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=LONG) as m:
        p = m.path / "late.txt"
        assert not p.exists()  # a negative entry, cached for an hour
        run_py(f"open({str(p)!r}, 'w').write('x')")  # another process creates it
        assert p.read_text() == "x"


def test_retention_removes_a_cached_group_at_once(tmp_path: Path) -> None:
    """REMOVED: a group deleted by retention vanishes for a process that had it cached."""
    from test_groups import save_hf_like

    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=[*LONG, "--keep-last", "1"]) as m:
        save_hf_like(m.path, 1)
        g1 = m.path / "checkpoint-1"
        for _ in range(3):
            assert (g1 / "model.pt").stat().st_size > 0 and g1.is_dir()  # cached now
        save_hf_like(m.path, 2)  # sealing it rotates checkpoint-1 out
        assert not g1.exists() and not (g1 / "model.pt").exists()
        assert sorted(os.listdir(m.path)) == ["checkpoint-2"]


@contextlib.contextmanager
def _two_groups(tmp_path: Path) -> Iterator[tuple[Mount, Path]]:
    """A mount (an hour's cache timeout, scrubs on demand only) over a separate backing directory,
    with HF-like groups checkpoint-1 and checkpoint-2 saved: (mount, backing directory)."""
    from test_groups import save_hf_like

    src, mp = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mp.mkdir()
    with Mount(mp, backing=src, extra_args=[*LONG, "--scrub-interval", "0"]) as m:
        save_hf_like(m.path, 1)
        save_hf_like(m.path, 2)
        yield m, src


def _scrub_a_corrupt_group(m: Mount, src: Path, gone: Path) -> None:
    """Flip a bit in the newest group's backing files, scrub, wait (10 s at most) until ``gone``
    no longer exists (the daemon quarantined the group on its own)."""
    from test_groups import _damage, cli

    _damage(src, "bitflip")
    cli("scrub", str(m.path), "--wait", check=False)
    deadline = time.monotonic() + 10
    while gone.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_corrupt_group_found_by_the_scrubber_vanishes_from_the_cache(tmp_path: Path) -> None:
    """CORRUPT then QUARANTINED: the daemon finds damage on its own (scrub); the group, cached by
    stat, is gone for everyone without any request naming it."""
    with _two_groups(tmp_path) as (m, src):
        g2 = m.path / "checkpoint-2"
        assert g2.is_dir() and (g2 / "model.pt").is_file()  # cached
        _scrub_a_corrupt_group(m, src, g2)
        assert not g2.exists()
        assert os.listdir(m.path) == ["checkpoint-1"]


def test_a_stable_listing_is_cached_and_one_being_written_is_not(tmp_path: Path) -> None:
    """C2: a directory every caller sees alike is listed from the kernel's cache (FOPEN_CACHE_DIR);
    while a new checkpoint file is being written in it, it is listed per caller and never cached;
    a change through the mount is seen at once."""
    from test_readers import probe

    d = tmp_path / "m"
    d.mkdir()
    (d / "plain").mkdir()
    for i in range(50):
        (d / "plain" / f"f{i:02d}").write_bytes(b"x")
    with Mount(d, extra_args=LONG) as m:
        p = m.path / "plain"
        names = sorted(os.listdir(p))
        before = stats(m).get("fuse_readdir", 0)
        for _ in range(5):
            assert sorted(os.listdir(p)) == names
        assert stats(m).get("fuse_readdir", 0) == before, "a stable listing reached the daemon again"
        (p / "new").write_bytes(b"y")  # through the mount: the kernel drops its copy
        assert "new" in os.listdir(p)
        f = open(p / "model.pt", "wb")  # a checkpoint file being written: other processes do not list it
        try:
            f.write(b"z" * 100)
            f.flush()
            for _ in range(2):  # the writer lists it; another process (twice: never from a cache) does not
                assert "model.pt" in os.listdir(p)
                seen = probe(p / "model.pt", tmp_path, detached=True)
                assert seen[0] == "ENOENT" and not any("model.pt" in t for t in seen), seen
        finally:
            f.close()
        seen = probe(p / "model.pt", tmp_path, detached=True)
        assert seen[:2] == ["100", "zzzzzzzzz"] and any("model.pt" in t for t in seen[2:]), seen


def test_a_cached_listing_is_dropped_by_a_change_the_daemon_makes_on_its_own(tmp_path: Path) -> None:
    """C2: the scrubber quarantines a corrupt group without any request naming its parent; the
    parent's cached listing is dropped by the event, not only by the directory's new mtime (reset
    here to the cached one, as a change within one timestamp tick would leave it)."""
    with _two_groups(tmp_path) as (m, src):
        time.sleep(0.2)  # (sealed)
        assert sorted(os.listdir(m.path)) == ["checkpoint-1", "checkpoint-2"]
        n0 = stats(m).get("fuse_readdir", 0)
        assert sorted(os.listdir(m.path)) == ["checkpoint-1", "checkpoint-2"]
        assert stats(m).get("fuse_readdir", 0) == n0  # cached
        st = os.stat(src)
        _scrub_a_corrupt_group(m, src, src / "checkpoint-2")
        assert not (src / "checkpoint-2").exists(), "the scrubber did not quarantine the group"
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        time.sleep(0.3)  # the notifier thread
        assert os.listdir(m.path) == ["checkpoint-1"]


def test_passthrough_reads_never_reach_the_daemon(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        data = os.urandom(8 << 20)
        (m.path / "blob.bin").write_bytes(data)
        s0 = stats(m)
        got = run_py(f"import hashlib; print(hashlib.sha256(open({str(m.path / 'blob.bin')!r}, 'rb')"
                     f".read()).hexdigest())").stdout.strip()
        assert got == hashlib.sha256(data).hexdigest()
        s1 = stats(m)
        assert s1.get("passthrough_opens", 0) > s0.get("passthrough_opens", 0)
        assert s1.get("fuse_read", 0) == s0.get("fuse_read", 0)
        # mmap works (the kernel maps the backing file)
        run_py(f"import mmap\nf = open({str(m.path / 'blob.bin')!r}, 'rb')\n"
               "mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\nassert len(mm) == 8 << 20")


def test_passthrough_off_serves_reads_through_the_daemon(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=["--no-passthrough"]) as m:
        (m.path / "blob.bin").write_bytes(b"x" * (1 << 20))
        s0 = stats(m)
        assert (m.path / "blob.bin").read_bytes() == b"x" * (1 << 20)
        s1 = stats(m)
        assert s1.get("fuse_read", 0) > s0.get("fuse_read", 0) and not s1.get("passthrough_opens")


def _at_half_way(w: subprocess.Popen, check: Callable[[], None]) -> None:
    """Run ``check`` once writer ``w`` printed ``half`` (it then waits for a line on stdin), then
    let it finish; it must exit 0.  Killed if anything fails on the way."""
    try:
        assert w.stdout is not None
        assert w.stdout.readline().strip() == "half"
        check()
        assert release_and_reap(w) == 0
    finally:
        kill_if_running(w)


def _verify_offline(backing: Path) -> str:
    """``ckptfs verify`` of an unmounted backing directory: every record against its file."""
    r = subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(backing)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("bypass", [True, False], ids=["passthrough", "streamed"])
def test_a_checkpoint_writer_writes_its_staging_file_directly(tmp_path: Path, bypass: bool) -> None:
    """P7/W1: a torch.save of a checkpoint file: with write passthrough no WRITE reaches the daemon
    (the kernel writes the staging file), the digest is computed from it at the seal, and the
    committed file's record verifies, through the mount and offline.  A process opening the path
    while the save is half-way reads the previous version (V1).  With CKPTFS_WRITE_PASSTHROUGH=0
    the same save streams its writes, and its digest, through the daemon."""
    d = tmp_path / "m"
    d.mkdir()
    env = None if bypass else {"CKPTFS_WRITE_PASSTHROUGH": "0"}
    with Mount(d, env=env) as m:
        p = m.path / "model.pt"
        torch.save({"w": torch.zeros(1 << 16)}, p)
        old = p.read_bytes()
        s0 = stats(m)
        src = tmp_path / "new.pt"
        torch.save({"w": torch.randn(1 << 20)}, src)
        # the writer is another process (its own descendants would see its version: read-your-writes)
        w = subprocess.Popen([sys.executable, "-c", f"import sys\nf = open({str(p)!r}, 'wb')\n"
                              f"data = open({str(src)!r}, 'rb').read()\nf.write(data[:len(data) // 2])\n"
                              "f.flush()\nprint('half', flush=True)\nsys.stdin.readline()\n"
                              "f.write(data[len(data) // 2:])\nf.close()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

        def mid_save() -> None:
            assert p.read_bytes() == old  # mid-save: the committed version, whole (V1)

        _at_half_way(w, mid_save)
        s1 = stats(m)
        assert p.read_bytes() == src.read_bytes()
        assert os.getxattr(p, "user.ckptfs.status") == b"committed"
        writes = s1.get("fuse_write", 0) - s0.get("fuse_write", 0)
        if bypass:
            assert s1.get("passthrough_writers", 0) == s0.get("passthrough_writers", 0) + 1
            assert writes == 0, writes
        else:
            assert not s1.get("passthrough_writers") and writes > 0
    assert "0 corrupt" in _verify_offline(d)


def test_async_mode_hashes_a_passthrough_written_file_on_the_committer_not_in_close(tmp_path: Path) -> None:
    """C4 (issue 27, W2 async stall): with ``--commit=async`` a checkpoint written through writer
    passthrough (the daemon saw none of its bytes) is hashed on the committer's thread before its
    install, not in the application's ``close()``: the close returns after the format check.  The
    record made there is the file's (verified through the mount and offline), a reader sees the
    queued version at once (read-your-writes), and a directory fsync waits for the install."""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, commit="async") as m:
        s0 = stats(m)
        sd = {"w": torch.randn(2 << 20)}
        for i in range(3):
            torch.save(sd, m.path / f"model{i}.pt")
        assert torch.equal(torch.load(m.path / "model2.pt")["w"], sd["w"])
        dfd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        s1 = stats(m)
        assert s1.get("passthrough_writers", 0) - s0.get("passthrough_writers", 0) == 3
        assert s1.get("digests_deferred", 0) - s0.get("digests_deferred", 0) == 3
        assert s1.get("fuse_write", 0) == s0.get("fuse_write", 0)
        for i in range(3):
            assert os.getxattr(m.path / f"model{i}.pt", "user.ckptfs.status") == b"committed"
            assert torch.equal(torch.load(m.path / f"model{i}.pt")["w"], sd["w"])
    assert "0 corrupt" in _verify_offline(d)


def test_an_atomic_writers_temporary_file_of_a_checkpoint_is_written_through_passthrough(tmp_path: Path) -> None:
    """Issue 27: an already-atomic writer (``model.pt.tmp``, fsync, rename over ``model.pt``, fsync of
    the directory) gets writer passthrough for its temporary file too: no WRITE reaches the daemon,
    the digest is computed at the seal, and the renamed file verifies.  The temporary file is no
    checkpoint name, so another process reading it half-way sees the bytes written so far (as
    natively, not isolated: V1).  Renamed, the file is reached under its new name at once (nodes.py
    T9).  A temporary file of a non-checkpoint name (``notes.txt.tmp``) is written through the
    daemon as before."""
    d = tmp_path / "m"
    d.mkdir()
    src = tmp_path / "new.pt"
    torch.save({"w": torch.randn(1 << 20)}, src)
    data = src.read_bytes()
    with Mount(d) as m:
        tmp, final = m.path / "model.pt.tmp", m.path / "model.pt"
        s0 = stats(m)
        w = subprocess.Popen([sys.executable, "-c", f"import os, sys\nfd = os.open({str(tmp)!r}, "
                              "os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
                              f"data = open({str(src)!r}, 'rb').read()\nos.write(fd, data[:len(data) // 2])\n"
                              "print('half', flush=True)\nsys.stdin.readline()\n"
                              "os.write(fd, data[len(data) // 2:])\nos.fsync(fd)\nos.close(fd)\n"
                              f"os.rename({str(tmp)!r}, {str(final)!r})\n"
                              f"dfd = os.open({str(m.path)!r}, os.O_RDONLY)\nos.fsync(dfd)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

        def mid_save() -> None:
            assert tmp.read_bytes() == data[:len(data) // 2]  # not isolated: what was written so far

        _at_half_way(w, mid_save)
        s1 = stats(m)
        assert final.read_bytes() == data and not tmp.exists()
        assert os.getxattr(final, "user.ckptfs.status") == b"committed"
        assert s1.get("passthrough_writers", 0) == s0.get("passthrough_writers", 0) + 1
        assert s1.get("fuse_write", 0) == s0.get("fuse_write", 0)
        # T9: the writer's node follows the rename.  The same process, right after its rename,
        # reaches the file through its kernel dentry (moved from the temporary name): it named the
        # passthrough writer's detached node, which kept the old path (ENOENT, every trial)
        code = (f"import os\nd = {str(m.path)!r}\ndata = open({str(src)!r}, 'rb').read()\n"
                "for i in range(5):\n"
                "    fd = os.open(d + '/model.pt.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
                "    os.write(fd, data[i:])\n    os.fsync(fd)\n    os.close(fd)\n"
                "    os.rename(d + '/model.pt.tmp', d + '/model.pt')\n"
                "    assert os.stat(d + '/model.pt').st_size == len(data) - i\n"
                "    assert open(d + '/model.pt', 'rb').read() == data[i:]\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert final.read_bytes() == data[4:] and not tmp.exists()
        s1b = stats(m)
        assert s1b.get("passthrough_writers", 0) == s1.get("passthrough_writers", 0) + 5
        s1 = s1b
        (m.path / "notes.txt.tmp").write_bytes(b"n" * 100)
        s2 = stats(m)
        assert s2.get("passthrough_writers", 0) == s1.get("passthrough_writers", 0)
        assert s2.get("fuse_write", 0) > s1.get("fuse_write", 0)
    assert "0 corrupt" in _verify_offline(d)


def test_a_file_being_written_that_no_one_is_isolated_from_keeps_its_cached_attributes(tmp_path: Path) -> None:
    """Issue 27: only a checkpoint file's version is shown per caller (V1), so only its attributes
    are never cached while it is written.  Any other new file's attributes stay in the kernel's
    cache from its CREATE on: Python's ``open()`` fstats it twice, and each asked the daemon (three
    GETATTRs per small file, one of them the directory's after the create).  Another process sees
    the file's size as it grows, and its final size after the close, as natively."""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        s0 = stats(m)
        run_py(f"import os\nfor i in range(40):\n    open(os.path.join({str(m.path)!r}, f's{{i}}.txt'), 'wb')"
               f".write(b'x' * 1024)\n")
        s1 = stats(m)
        per_file = (s1.get("fuse_getattr", 0) - s0.get("fuse_getattr", 0)) / 40
        assert per_file <= 2, per_file  # (was 3.15) the directory's after each create: the kernel's own rule
        assert all((m.path / f"s{i}.txt").stat().st_size == 1024 for i in range(40))
        with open(m.path / "grow.log", "wb") as f:
            for n in (1, 5000, 70000):
                f.write(b"y" * (n - f.tell()))
                f.flush()
                other = run_py(f"import os; print(os.stat({str(m.path / 'grow.log')!r}).st_size)").stdout
                assert int(other) == n  # another process: as the writer wrote it, not a cached size
        assert os.stat(m.path / "grow.log").st_size == 70000


def test_closing_a_written_checkpoint_file_reads_no_fd_table(tmp_path: Path) -> None:
    """Issue 27: a close commits at once unless the file is still empty and its process still holds
    it open (a shell's ``echo ok > COMMIT`` closes its first fd before writing: issue 25), which
    only a scan of the process's fd table (/proc/PID/fd, up to 4,096 links) can tell.  A passthrough
    writer's bytes never reach the daemon's count, so every closed checkpoint file looked empty and
    paid that scan, in a trainer with thousands of open fds.  The size is read from its staging
    file now: no scan for a written file, one for an empty one (the control that the counter counts)."""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        s0 = stats(m)
        code = ("import os, torch\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(2000)]\n"
                f"torch.save({{'w': torch.zeros(1 << 18)}}, {str(m.path / 'model.pt')!r})\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        s1 = stats(m)
        assert s1.get("passthrough_writers", 0) == s0.get("passthrough_writers", 0) + 1  # the case at issue
        assert s1.get("fd_table_scans", 0) == s0.get("fd_table_scans", 0)
        assert torch.load(m.path / "model.pt")["w"].numel() == 1 << 18
        with open(m.path / "notes.txt", "wb"):
            pass
        assert stats(m).get("fd_table_scans", 0) == s1.get("fd_table_scans", 0) + 1


def test_bytes_written_through_a_passthrough_writer_after_its_commit_are_committed(tmp_path: Path) -> None:
    """W2: the kernel writes a passthrough writer's file for as long as it is open, also after an
    fsync installed it (write, fsync, write more) and after the parent's close when a forked child
    still holds the open file.  Those bytes are committed again (at the next fsync, close or
    release): the file shows all of them and its record verifies, where a record left from the
    first commit would make every open fail with EIO."""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        p = m.path / "model.pt"
        a, b = os.urandom(3 << 20), os.urandom(5000)
        with open(p, "wb") as f:
            f.write(a)
            f.flush()
            os.fsync(f.fileno())
            f.write(b)
            f.flush()
            os.fsync(f.fileno())  # durable now, as natively
            assert stats(m).get("passthrough_reseals", 0) == 1
            f.write(b)
        assert p.read_bytes() == a + b + b
        q = m.path / "opt.pt"
        run_py(f"import os, time\nf = open({str(q)!r}, 'wb')\nf.write(b'parent')\nf.flush()\n"
               "pid = os.fork()\nif pid == 0:\n    time.sleep(0.5)\n    os.write(f.fileno(), b'child')\n"
               "    os._exit(0)\nf.close()\nos.waitpid(pid, 0)")
        assert q.read_bytes() == b"parentchild"
        s = stats(m)
        assert s.get("passthrough_writers", 0) >= 2 and s.get("passthrough_reseals", 0) >= 3
    assert "0 corrupt" in _verify_offline(d)


def test_a_writer_meeting_passthrough_readers_gets_a_new_node(tmp_path: Path) -> None:
    """P2: readers open on the committed file keep reading it; the rewrite lands on a fresh kernel
    inode (an ESTALE retry) instead of failing with EIO; a new open sees the new version."""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        p = m.path / "model.pt"
        torch.save({"w": torch.zeros(1 << 18)}, p)
        with open(p, "rb") as r1, open(p, "rb") as r2:
            old = r1.read()
            torch.save({"w": torch.ones(1 << 18)}, p)  # in place, while both readers are open
            assert r2.read() == old
            r1.seek(0)
            assert r1.read() == old
        assert torch.equal(torch.load(p)["w"], torch.ones(1 << 18))
        assert stats(m).get("passthrough_node_splits", 0) >= 1


def _rewrites_under_a_tight_reader(tmp_path: Path, m: Mount, sibling: bool) -> dict:
    """Rewrite ``model.bin`` (256 KiB) in place 100 times while another process opens, fstats and
    reads it in a loop; the writer is this process (the reader's parent: it sees the writer's
    writes, V1) or, with ``sibling``, another child.  The reader's report: loads ``n``, and
    ``bad``/``nbad``, reads that were not one whole version (size by read and by fstat)."""
    p = m.path / "model.bin"
    size = 256 << 10
    p.write_bytes(bytes([0]) * size)
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", (
        "import os, json\n"
        f"p, stop, size = {str(p)!r}, {str(stop)!r}, {size}\n"
        "bad, n = [], 0\n"
        "while not os.path.exists(stop):\n"
        "    with open(p, 'rb') as f:\n"
        "        st = os.fstat(f.fileno())\n"
        "        b = f.read()\n"
        "    n += 1\n"
        "    if len(b) != size or st.st_size != size or b.count(b[:1]) != size:\n"
        "        bad.append((len(b), st.st_size))\n"
        "print(json.dumps({'n': n, 'bad': bad[:5], 'nbad': len(bad)}))\n")],
        stdout=subprocess.PIPE, text=True)
    write = (f"for gen in range(1, 101):\n"
             f"    with open({str(p)!r}, 'wb') as f:\n"  # O_TRUNC: the committed version stays visible
             f"        f.write(bytes([gen]) * {size})\n")
    try:
        time.sleep(0.5)
        if sibling:
            subprocess.run([sys.executable, "-c", write], check=True, timeout=120)
        else:
            for gen in range(1, 101):
                with open(p, "wb") as f:
                    f.write(bytes([gen]) * size)
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0, reader.returncode
    assert p.read_bytes() == bytes([100]) * size
    return json.loads(out)


def test_rewrites_racing_a_tight_passthrough_reader_all_succeed(tmp_path: Path) -> None:
    """P4/P5: a reader opening the file in a tight loop (each open may take passthrough) while
    another process rewrites it in place 100 times: every rewrite succeeds.  (Before P4 a reader
    given passthrough between the writer's check and its open made the open fail with ESTALE,
    twice in a row at the VFS's one retry, and the refused O_TRUNC version was published empty.)"""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        rep = _rewrites_under_a_tight_reader(tmp_path, m, sibling=False)
        assert rep["n"] >= 50  # the reader raced the writes
        s = stats(m)
        assert s.get("passthrough_opens", 0) > 0 and s.get("passthrough_node_splits", 0) > 0


def test_a_reader_racing_rewrites_sees_whole_committed_versions_only(tmp_path: Path) -> None:
    """T5 (reader nodes): a reader opening, fstat-ing and reading the file in a tight loop while
    another process (its sibling, not its parent: a writer's descendants see its writes, V1)
    rewrites it in place 100 times sees whole committed versions only, through its reader node:
    the size and the bytes of one version.  (A descendant reader, which shares the writer's
    kernel inode by design, saw the size the writer's O_TRUNC set: 0.)"""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        rep = _rewrites_under_a_tight_reader(tmp_path, m, sibling=True)
        assert rep["nbad"] == 0, rep
        assert rep["n"] >= 50, rep  # the reader raced the writes
        s = stats(m)
        assert s.get("reader_node_opens", 0) > 0 and s.get("passthrough_opens", 0) > 0, s


def test_a_cached_mmap_reader_keeps_its_pages_through_a_rewrite(tmp_path: Path) -> None:
    """P6: a reader that mapped the file through the page cache (it opened while a writer's handle
    was open, so no passthrough) keeps reading the version it mapped while another process
    rewrites the file: the rewrite lands on a new kernel inode.  (Before, the rewrite waited 2 s
    for the reader to close, then truncated the inode under the mapping: SIGBUS.)"""
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        p = m.path / "model.bin"
        size = 4 << 20
        p.write_bytes(b"\x01" * size)
        go, ready = tmp_path / "go", tmp_path / "ready"
        with open(p, "r+b"):  # a writer's handle is open: the reader's open gets the page cache
            reader = subprocess.Popen([sys.executable, "-c", (
                "import mmap, os, time\n"
                f"f = open({str(p)!r}, 'rb')\n"
                "mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
                f"open({str(ready)!r}, 'w').close()\n"
                f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
                f"assert mm[:] == b'\\x01' * {size}, 'mixed'\n"
                "print('ok')\n")], stdout=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        try:
            subprocess.run([sys.executable, "-c", f"open({str(p)!r}, 'wb').write(b'\\x02' * {size // 2})"],
                           check=True, timeout=60)
            assert p.read_bytes() == b"\x02" * (size // 2)
        finally:
            go.touch()
            out, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0 and out.strip() == "ok", (reader.returncode, out)
        assert stats(m).get("passthrough_node_splits", 0) >= 1


def test_shared_mappings_of_checkpoint_files_being_written_work(tmp_path: Path) -> None:
    """DIRECT_IO_ALLOW_MMAP: a checkpoint file's writer bypasses the page cache (direct I/O), and
    without the flag the kernel refused its shared mappings (ENODEV) where natively they work:
    ``np.memmap(mode="w+")`` and ``np.load(mmap_mode="r+")``.  The bytes are committed and another
    process reads them."""
    import numpy as np

    d = tmp_path / "m"
    d.mkdir()
    with Mount(d) as m:
        p = m.path / "weights.bin"
        a = np.memmap(p, dtype="float32", mode="w+", shape=(1 << 20,))
        a[:] = np.arange(1 << 20, dtype="float32")
        a.flush()
        del a
        got = run_py(f"import numpy as np; b = np.memmap({str(p)!r}, dtype='float32', mode='r'); "
                     "print(float(b[12345]), float(b[-1]), b.shape[0])").stdout.split()
        assert got == ["12345.0", str(float((1 << 20) - 1)), str(1 << 20)]
        q = m.path / "w.npy"
        np.save(q, np.ones(1000))
        c = np.load(q, mmap_mode="r+")
        c[5] = 7
        c.flush()
        del c
        assert run_py(f"import numpy as np; print(np.load({str(q)!r})[5])").stdout.strip() == "7.0"


def test_fstat_of_an_open_file_works_after_the_daemon_removed_its_name(tmp_path: Path) -> None:
    """fstat(2) sends no file handle: an open file whose name retention removed (its node is
    unmapped) still answers from its handle, as natively (st_nlink 0)."""
    from test_groups import save_hf_like

    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=[*LONG, "--keep-last", "1"]) as m:
        save_hf_like(m.path, 1)
        with open(m.path / "checkpoint-1" / "model.pt", "rb") as f:
            before = os.fstat(f.fileno())
            save_hf_like(m.path, 2)  # sealing it rotates checkpoint-1 out
            assert not (m.path / "checkpoint-1").exists()
            after = os.fstat(f.fileno())
            assert after.st_size == before.st_size and after.st_nlink == 0
            assert len(f.read()) == before.st_size


def test_corruption_found_at_open_is_eio_with_passthrough(tmp_path: Path) -> None:
    src, mp = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mp.mkdir()
    with Mount(mp, backing=src) as m:
        (m.path / "w.bin").write_bytes(os.urandom(3 << 20))
        st = os.stat(src / "w.bin")
        with open(src / "w.bin", "r+b") as f:  # bit rot in the last chunk, same inode
            f.seek((3 << 20) - 10)
            b = f.read(1)
            f.seek((3 << 20) - 10)
            f.write(bytes([b[0] ^ 1]))
        # as bit rot does, the mtime stays (a write through the backing path before the writer's
        # asynchronous release would be taken as its own, W2: design.md, "Known limits")
        os.utime(src / "w.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(OSError) as e:
            open(m.path / "w.bin", "rb").close()
        assert e.value.errno == errno.EIO
        assert os.getxattr(m.path / "w.bin", "user.ckptfs.status") == b"corrupt"


def test_fusermount3_passes_a_working_fuse_connection(tmp_path: Path) -> None:
    """The unprivileged mount path (fusermount3 and _FUSE_COMMFD): the fd it passes back carries the
    kernel's INIT request for the new mount."""
    from ckptfs.fuse.session import fusermount_mount, unmount

    if shutil.which("fusermount3") is None:
        pytest.fail("fusermount3 missing: .ci/run installs fuse3")
    d = tmp_path / "m"
    d.mkdir()
    fd = fusermount_mount(str(d), "ckptfs:test", allow_other=False)
    try:
        req = os.read(fd, 1 << 20 | 4096)
        length, opcode, *_ = k.IN_HEADER.unpack_from(req)
        assert opcode == k.INIT and length == len(req)
    finally:
        subprocess.run(["fusermount3", "-uz", str(d)], capture_output=True)
        os.close(fd)
        unmount(str(d))


def test_sigterm_unmounts_and_the_daemon_exits(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    m = Mount(d).start()
    try:
        (m.path / "a.txt").write_text("a")
        os.kill(m.pid, 15)
        assert m.wait_dead(30) is not None
        from ckptfs.cli import is_ckptfs_mount

        assert not is_ckptfs_mount(str(d))
        assert (d / "a.txt").read_text() == "a"
    finally:
        m.stop()


def test_mfusepy_transport_still_serves(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=["--transport", "mfusepy"]) as m:
        torch.save({"w": torch.arange(3)}, m.path / "model.pt")
        assert torch.equal(torch.load(m.path / "model.pt")["w"], torch.arange(3))
        assert "transport_native" not in stats(m)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
