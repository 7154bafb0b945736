"""Regressions for defects a review of the transparency change found (each failed before its fix,
except the security.capability test: there the staged copy's own data write already made the
backing filesystem drop the capability; ckptfs now also never copies it)."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Mount, _env

from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS
from ckptfs_testing.faults import FaultyStore

HOLD_OPEN = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"W-STALE")
print("writing", flush=True)
time.sleep(60)
"""


def test_rename_over_a_file_open_for_writing_shows_the_renamed_file(mnt: Mount) -> None:
    """A rename over ``b`` while another process writes ``b``: ``b`` shows the renamed file at once
    (natively the writer's inode is unlinked), and a later writer of ``b`` commits normally."""
    d = mnt.path
    (d / "b").write_bytes(b"OLD-B")
    (d / "a").write_bytes(b"NEW-A")
    w = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(d / "b")], stdout=subprocess.PIPE, text=True,
                         env=_env())
    try:
        assert w.stdout is not None and w.stdout.readline().strip() == "writing"
        os.rename(d / "a", d / "b")
        assert (d / "b").read_bytes() == b"NEW-A"
        assert os.stat(d / "b").st_size == 5
        (d / "b").write_bytes(b"P-DATA")  # a third writer while W still holds its (unlinked) version
        assert (d / "b").read_bytes() == b"P-DATA"
    finally:
        w.kill()
        w.wait()
    time.sleep(0.5)
    assert (d / "b").read_bytes() == b"P-DATA"


def test_xattrs_survive_a_second_rewrite_through_the_same_handle(mnt: Mount) -> None:
    """A rewrite cloned from an already-installed version keeps the file's xattrs."""
    p = mnt.path / "f"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"one")
        os.fsync(fd)  # installed: its staging name is gone
        os.setxattr(p, "user.tag", b"keep")
        os.pwrite(fd, b"two", 0)  # clones the installed version
        os.fsync(fd)
    finally:
        os.close(fd)
    assert p.read_bytes() == b"two"
    assert os.getxattr(p, "user.tag") == b"keep"


def test_security_capability_is_not_carried_into_a_rewrite(tmp_path: Path) -> None:
    """Natively any write drops a file's capabilities; a rewrite through the mount must too."""
    back, mp = tmp_path / "back", tmp_path / "mp"
    back.mkdir()
    mp.mkdir()
    (back / "tool").write_bytes(b"#!/bin/sh\n")
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)  # VFS_CAP_REVISION_2, effective, cap_net_raw
    os.setxattr(back / "tool", "security.capability", cap)
    with Mount(mp, backing=back) as m:
        with open(m.path / "tool", "ab") as f:
            f.write(b"echo hi\n")
    assert (back / "tool").read_bytes() == b"#!/bin/sh\necho hi\n"
    with pytest.raises(OSError) as e:
        os.getxattr(back / "tool", "security.capability")
    assert e.value.errno == errno.ENODATA


def test_a_hard_link_made_while_a_rewrite_is_pending_keeps_its_own_inode_number(mnt: Mount) -> None:
    """N2: ``ln x y`` while ``x`` is being rewritten: once the rewrite commits, x (new bytes) and y
    (old bytes) are different files and must not report the same st_ino."""
    x, y = mnt.path / "x", mnt.path / "y"
    x.write_bytes(b"old")
    fd = os.open(x, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"new!")
        os.link(x, y)  # names the committed (old) inode
    finally:
        os.close(fd)
    assert x.read_bytes() == b"new!" and y.read_bytes() == b"old"
    assert os.stat(x).st_ino != os.stat(y).st_ino


def test_fsync_after_a_failed_write_fails(tmp_path: Path) -> None:
    """A failed write poisons the version: a later successful write and fsync must not commit it
    (the failed range would be a hole), and every fsync reports the error."""
    store = FaultyStore(OsBackingStore(str(tmp_path)), ops=("pwrite",))
    fs = CkptFS(store, housekeeping_interval=0)
    try:
        fh = fs.create("f", 0o644)
        store.arm(1, errno.EIO)
        with pytest.raises(OSError):
            fs.write(fh, b"lost", 0)
        store.arm(None)
        fs.write(fh, b"kept", 4)
        for _ in range(2):
            with pytest.raises(OSError) as e:
                fs.fsync(fh)
            assert e.value.errno == errno.EIO
        with pytest.raises(OSError):
            fs.flush(fh)
        fs.release(fh)
        assert not (tmp_path / "f").exists()
    finally:
        fs.shutdown()
