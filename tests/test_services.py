"""ckptfs as a system service (issue 13): ``mount -t fuse.ckptfs`` through fuse3's mount helper (what
an /etc/fstab line or a systemd .mount unit runs), and the ``contrib/ckptfs@.service`` template.

fuse3's helper runs ``ckptfs SRC DIR -o OPTS`` with PATH reset to the system directories, so the
tests put a ``ckptfs`` command at /usr/local/sbin (as the README tells a user to) and restore
whatever was there afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from test_groups import save_hf_like

from ckptfs.mounts import is_ckptfs_mount

HELPER = Path("/usr/local/sbin/ckptfs")


@contextlib.contextmanager
def ckptfs_on_system_path() -> Iterator[None]:
    saved = None
    if os.path.lexists(HELPER):
        saved = HELPER.with_name("ckptfs.saved-by-test")
        os.replace(HELPER, saved)
    HELPER.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m ckptfs \"$@\"\n")
    HELPER.chmod(0o755)
    try:
        yield
    finally:
        HELPER.unlink()
        if saved is not None:
            os.replace(saved, HELPER)


def _umount(d: Path) -> None:
    if is_ckptfs_mount(str(d)):
        r = subprocess.run([sys.executable, "-m", "ckptfs", "umount", str(d)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr


def test_mount_t_fuse_ckptfs_with_options_as_fstab_does(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    with ckptfs_on_system_path():
        r = subprocess.run(["mount", "-t", "fuse.ckptfs", str(d), str(d), "-o", "commit=async,keep_last=2"],
                           capture_output=True, text=True, timeout=120)
        try:
            assert r.returncode == 0, r.stderr
            assert is_ckptfs_mount(str(d))
            assert os.getxattr(d, "user.ckptfs.commit_mode") == b"async"
            for step in (1, 2, 3):
                save_hf_like(d, step)
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)  # async: wait for the commits
            finally:
                os.close(fd)
            assert sorted(p for p in os.listdir(d)) == ["checkpoint-2", "checkpoint-3"]  # keep_last=2
        finally:
            _umount(d)
        r = subprocess.run(["mount", "-t", "fuse.ckptfs", str(d), str(d), "-o", "commit=async,colour=blue"],
                           capture_output=True, text=True, timeout=120)
        try:
            assert r.returncode != 0 and "mount option 'colour=blue': not a ckptfs option" in r.stderr, r
            assert not is_ckptfs_mount(str(d))
        finally:
            _umount(d)
        src = tmp_path / "src"
        src.mkdir()
        r = subprocess.run(["mount", "-t", "fuse.ckptfs", str(src), str(d), "-o", "rw,noatime,x-systemd.automount"],
                           capture_output=True, text=True, timeout=120)
        try:
            assert r.returncode == 0, r.stderr  # another backing directory; mount's own options dropped
            (d / "a.pt").write_bytes(b"x")
            assert json.loads(os.getxattr(d, "user.ckptfs.stats"))["commits"] == 1
        finally:
            _umount(d)
        assert (src / "a.pt").read_bytes() == b"x"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_systemd_unit_template_verifies(tmp_path: Path) -> None:
    unit = (ROOT / "contrib" / "ckptfs@.service").read_text()
    assert "ExecStart=/usr/local/sbin/ckptfs mount --foreground %f" in unit
    assert "ExecStop=/usr/local/sbin/ckptfs umount" in unit
    inst = tmp_path / "ckptfs@ckpts.service"  # an instance: systemd-escape --path /ckpts
    inst.write_text(unit)
    with ckptfs_on_system_path():
        r = subprocess.run(["systemd-analyze", "verify", str(inst)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ckptfs@ckpts.service" not in r.stderr, r.stderr
