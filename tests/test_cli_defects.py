"""Regression tests of two CLI defects (issue 11).

* ``ckptfs forget`` wiped every checkpoint group record: it rewrote the journal
  snapshot without the groups.
* A mountpoint whose name is not ASCII was not recognised as a ckptfs mount
  (``/proc/self/mountinfo`` was decoded with ``unicode_escape``), and a mountinfo
  line without its `` - `` separator raised instead of being skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import Mount, _env

from ckptfs.cli import is_ckptfs_mount


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True, env=_env(),
                          timeout=120)


def status(p: Path) -> str:
    return os.getxattr(p, "user.ckptfs.status").decode()


# ------------------------------------------------------------- forget kept the groups
def test_forget_keeps_checkpoint_groups(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    g = d / "run" / "checkpoint-10"
    m = Mount(d).start()
    try:
        g.mkdir(parents=True)
        torch.save({"w": torch.ones(8)}, g / "model.pt")
        (g / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
        assert status(g) == "sealed"
        torch.save({"x": torch.zeros(4)}, d / "other.pt")
        assert status(d / "other.pt") == "committed"
    finally:
        m.stop()
    r = cli("ls", str(d / "run"), "--all")
    assert r.returncode == 0 and "checkpoint-10" in r.stdout, r.stdout + r.stderr

    r = cli("forget", str(d), "other.pt")
    assert r.returncode == 0, r.stderr
    r = cli("ls", str(d / "run"), "--all")
    assert r.returncode == 0, r.stderr
    assert "(no groups)" not in r.stdout
    rows = json.loads(cli("ls", str(d / "run"), "--all", "--json").stdout)
    assert [(row["path"], row["state"]) for row in rows] == [("run/checkpoint-10", "sealed")]

    m.start()
    try:
        assert status(g) == "sealed"
        assert status(g / "model.pt") == "committed"
        assert status(d / "other.pt") == "untracked"  # forget did forget it
        rows = json.loads(cli("ls", str(d / "run"), "--json").stdout)
        assert [(row["path"], row["state"]) for row in rows] == [("run/checkpoint-10", "sealed")]
    finally:
        m.stop()


# ------------------------------------------------- a mountpoint with a non-ASCII name
def _fusermount_u(path: Path) -> None:
    exe = shutil.which("fusermount3") or "fusermount"
    if subprocess.run([exe, "-u", str(path)], capture_output=True).returncode != 0:
        subprocess.run([exe, "-uz", str(path)], capture_output=True)


def test_non_ascii_mountpoint_is_a_ckptfs_mount(tmp_path: Path) -> None:
    """The daemon is started and watched here without the code under test (os.path.ismount,
    not is_ckptfs_mount), so that it is unmounted even where that code does not see the mount."""
    d = tmp_path / "ckpt-é ü"
    d.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "ckptfs", "mount", "-f", str(d)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(d):
            assert proc.poll() is None, "ckptfs exited during start"
            assert time.monotonic() < deadline, "ckptfs did not mount in time"
            time.sleep(0.05)
        (d / "a.json").write_text('{"ok": true}')
        assert status(d / "a.json") == "committed"

        assert is_ckptfs_mount(str(d))
        r = cli("status", str(d))
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["mounted"] is True and int(out["pid"]) == proc.pid

        from ckptfs.mounts import mount_entry

        ent = mount_entry(str(d))
        assert ent is not None
        assert (ent.mountpoint, ent.fstype) == (os.path.realpath(d), "fuse.ckptfs")

        r = cli("umount", str(d))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"ckptfs: unmounted {d}"
        assert proc.wait(30) == 0
        assert not os.path.ismount(d)
        assert (d / "a.json").read_text() == '{"ok": true}'
    finally:
        if os.path.ismount(d):
            _fusermount_u(d)
        if proc.poll() is None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


MOUNTINFO = (
    b"22 27 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
    # the kernel's four escapes (space, tab, newline, backslash); UTF-8 bytes as they are
    b"40 22 0:50 / /tmp/ckpt-\xc3\xa9\\040\xc3\xbc\\011t\\012n\\134b rw,nosuid shared:1 - fuse.ckptfs ckptfs rw\n"
    b"41 22 0:51 / /mnt/no-separator rw,nosuid shared:2 fuse.ckptfs ckptfs rw\n"  # malformed: skipped
    b"42 22 0:52 / /mnt/short rw - fuse.ckptfs\n"  # malformed (no source): skipped
    b"43 22 0:53 / /mnt/\\101 rw - ext4 /dev/x\\040y rw\n"  # other octal sequences stay as written
    b"44 22 0:54 / /mnt/stacked rw - tmpfs tmpfs rw\n"
    b"45 22 0:55 / /mnt/stacked rw master:3 - fuse.ckptfs ckptfs rw,user_id=0\n"
)


def test_mountinfo_parser_on_crafted_lines(tmp_path: Path) -> None:
    from ckptfs import mounts

    entries = mounts.parse_mountinfo(MOUNTINFO)
    assert [e.mount_id for e in entries] == [22, 40, 43, 44, 45]
    e = entries[1]
    assert e.mountpoint == "/tmp/ckpt-é ü\tt\nn\\b"
    assert (e.parent_id, e.dev, e.root, e.fstype, e.source) == (22, "0:50", "/", "fuse.ckptfs", "ckptfs")
    assert (entries[2].mountpoint, entries[2].source) == ("/mnt/\\101", "/dev/x y")

    # a name that is not valid UTF-8 round-trips like os paths do (surrogateescape)
    raw = mounts.parse_line(b"46 22 0:56 / /mnt/\xff\\040x rw - fuse.ckptfs ckptfs rw")
    assert raw is not None and os.fsencode(raw.mountpoint) == b"/mnt/\xff x"

    f = tmp_path / "mountinfo"
    f.write_bytes(MOUNTINFO)
    at = mounts.mount_entry("/tmp/ckpt-é ü\tt\nn\\b", str(f))
    assert at is not None and at.mount_id == 40
    stacked = mounts.mount_entry("/mnt/stacked", str(f))
    assert stacked is not None and (stacked.mount_id, stacked.fstype) == (45, "fuse.ckptfs")  # the top one
    assert mounts.mount_entry("/mnt/no-separator", str(f)) is None
    assert [e.dev for e in mounts.mounts_at("/mnt/stacked", str(f))] == ["0:54", "0:55"]
    assert mounts.read_mountinfo(str(tmp_path / "missing")) == []
