"""What other processes see (issue 15, engine/visibility.py V1 and V2), on a real mount.

V1: a process loading a checkpoint while another saves over it gets the last committed version,
never the half-written one.  V2: a killed process's appended log lines are kept; a killed
torch.save over an existing file still leaves the previous version.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Mount

from ckptfs_testing.readers import race

N = 30


@pytest.mark.parametrize(("kind", "rel", "mode"), [
    ("torch", "model.pt", "inplace"),
    ("torch", "model.pt", "new"),
    ("safetensors", "model.safetensors", "inplace"),
    ("dcp", "step_1", "inplace"),  # DCP shards (__0_0.distcp) inside a checkpoint group
    # mmap readers (native transport): they hold the path's reader node, never the writer's kernel
    # inode (fuse/nodes.py T5): no SIGBUS from its truncation, no ENODEV from direct I/O
    ("torch-mmap", "model.pt", "inplace"),
    ("npy-mmap", "model.npy", "inplace"),
])
def test_reader_never_sees_a_save_in_progress(mnt: Mount, tmp_path: Path, kind: str, rel: str, mode: str) -> None:
    rep = race(mnt.path, tmp_path, kind, rel, mode, N)
    assert rep["reader_rc"] == 0
    assert rep["errors"] == [], rep["errors"][:5]
    assert rep["torn"] == 0
    assert rep["loads"] >= 10, rep  # the race ran: the reader loaded while the saves went on
    assert set(rep["gens"]) <= set(range(1, N + 1))  # each load was one committed version
    assert rep["gens"] == sorted(rep["gens"])  # and never an older one after a newer one
    assert len(set(rep["gens"])) >= 3, rep["gens"]  # new versions became visible as they committed
    assert rep["final"] == str(N)


PROBE = ("import os, sys; p = sys.argv[1]; d = os.path.dirname(p)\n"
         "try:\n    print(os.stat(p).st_size, open(p, 'rb').read()[:9].decode(), sorted(os.listdir(d)))\n"
         "except FileNotFoundError:\n    print('ENOENT', sorted(os.listdir(d)))\n")


def probe(path: Path, tmp: Path, detached: bool) -> list[str]:
    """What a process sees of ``path``: size, first bytes, directory listing.  ``detached``: a
    process that is not a descendant of this one (double fork: reparented), i.e. "another process"."""
    if not detached:
        return subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True,
                              check=True).stdout.split()
    out = tmp / f"probe-{time.monotonic_ns()}"
    subprocess.run(["setsid", "-f", "sh", "-c", '"$0" -c "$1" "$2" > "$3.tmp" && mv "$3.tmp" "$3"',
                    sys.executable, PROBE, str(path), str(out)], check=True)
    deadline = time.monotonic() + 30
    while not out.exists():
        assert time.monotonic() < deadline, "detached probe did not finish"
        time.sleep(0.05)
    return out.read_text().split()


def test_writer_sees_its_own_writes_others_the_committed_version(mnt: Mount, tmp_path: Path) -> None:
    """Before its close, the writer (and a child it starts) sees the new bytes; another process
    the committed ones, and ENOENT (and no directory entry) for a checkpoint file that has no
    committed version yet."""
    old = mnt.path / "w.pt"
    old.write_bytes(b"committed")
    with open(old, "r+b") as f:  # rewrite in place: staged until close
        f.truncate(0)
        f.write(b"new bytes, not closed")
        f.flush()
        assert probe(old, tmp_path, detached=True) == ["9", "committed", "['w.pt']"]
        assert os.stat(old).st_size == 21 and open(old, "rb").read() == b"new bytes, not closed"
        assert probe(old, tmp_path, detached=False) == ["21", "new", "bytes", "['w.pt']"]  # a child
        fresh = mnt.path / "fresh.h5"
        with open(fresh, "wb") as g:
            g.write(b"x" * 100)
            g.flush()
            assert probe(fresh, tmp_path, detached=True) == ["ENOENT", "['w.pt']"]
            assert probe(fresh, tmp_path, detached=False)[:2] == ["100", "xxxxxxxxx"]
            assert os.path.exists(fresh)
        # a plain file being written is seen by everyone (POSIX visibility)
        with open(mnt.path / "notes.txt", "w") as g:
            g.write("draft")
            g.flush()
            assert probe(mnt.path / "notes.txt", tmp_path, detached=True)[:2] == ["5", "draft"]
    assert probe(old, tmp_path, detached=True) == ["21", "new", "bytes", "['fresh.h5',", "'notes.txt',", "'w.pt']"]


def test_other_files_keep_posix_visibility(mnt: Mount) -> None:
    """A log being written is visible to other processes at once (tail -f)."""
    log = mnt.path / "train.log"
    with open(log, "w") as f:
        f.write("step 1\n")
        f.flush()
        seen = subprocess.run(["cat", str(log)], capture_output=True, text=True, check=True).stdout
        assert seen == "step 1\n"


def _killed_appender(m: Mount, path: Path, lines: int, mode: str) -> None:
    code = (f"import os, sys, time\nf = open({str(path)!r}, {mode!r})\n"
            f"for i in range({lines}):\n    f.write(f'line {{i}}\\n'); f.flush()\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)


@pytest.mark.parametrize("mode", ["a", "w"])
def test_killed_appender_keeps_its_lines(mnt: Mount, mode: str) -> None:
    """15 lines appended and flushed, then SIGKILL: all 15 are there after the kill and a remount
    (mode a: O_APPEND to an existing log; mode w: a new log written from empty, e.g. a CSV logger)."""
    log = mnt.path / "train.log"
    if mode == "a":
        log.write_text("header\n")
    _killed_appender(mnt, log, 15, mode)
    want = ("header\n" if mode == "a" else "") + "".join(f"line {i}\n" for i in range(15))
    assert log.read_text() == want
    assert os.getxattr(str(log), "user.ckptfs.status") == b"committed"
    assert mnt.stats().get("killed_appends_kept", 0) == 1
    mnt.remount()
    assert log.read_text() == want


def test_killed_rewrite_is_all_or_nothing(mnt: Mount) -> None:
    """A killed process that truncated an existing non-checkpoint file (a CSV rewritten whole) and a
    killed torch.save over an existing file both leave the previous version."""
    csv = mnt.path / "metrics.csv"
    csv.write_text("epoch,loss\n0,1.0\n")
    _killed_appender(mnt, csv, 3, "w")
    assert csv.read_text() == "epoch,loss\n0,1.0\n"
    code = ("import torch, sys, os, time\n"
            "torch.save({'w': torch.zeros(4)}, sys.argv[1])\n"
            "f = open(sys.argv[1], 'wb'); f.write(b'PK\\x03\\x04' + b'x' * 4096); f.flush()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    pt = mnt.path / "model.pt"
    p = subprocess.Popen([sys.executable, "-c", code, str(pt)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    import torch
    assert torch.equal(torch.load(pt)["w"], torch.zeros(4))
    # a log that looks like a checkpoint (a torch archive appended to a .log) is never prefix-committed
    odd = mnt.path / "weights.log"
    _killed_appender(mnt, odd, 0, "w")  # created empty by a killed writer: kept (nothing to lose)
    assert odd.read_text() == ""


def test_child_closing_an_inherited_fd_commits_nothing(mnt: Mount, tmp_path: Path) -> None:
    """fork + exec closes the writer's fd in the child (close-on-exec: a FUSE FLUSH from the child),
    and a child killed with the fd inherited closes it too: natively neither does anything to the
    file.  The half-written file is neither committed nor doomed; the writer's own close commits."""
    ck = mnt.path / "opt.h5"
    ck.write_bytes(b"old")
    commits = mnt.stats().get("commits", 0)
    with open(ck, "wb") as f:
        f.write(b"part1 ")
        f.flush()
        subprocess.run(["true"], check=True)  # fork + exec: the inherited copy is closed in the child
        child = subprocess.Popen(["sleep", "30"], pass_fds=[f.fileno()])
        child.send_signal(signal.SIGKILL)  # a child dying by a signal with the fd inherited
        child.wait(timeout=30)
        assert probe(ck, tmp_path, detached=True)[:2] == ["3", "old"]
        assert mnt.stats().get("commits", 0) == commits
        f.write(b"part2")
    assert ck.read_bytes() == b"part1 part2"
    assert mnt.stats().get("commits", 0) == commits + 1
    assert mnt.stats().get("inherited_flushes", 0) >= 2
