"""The change-events seam (ckptfs/events.py, invariant E3): every change of what a path shows that
the daemon makes on its own emits one event naming that path; installs and renames do too.

A subscriber records the events of a filesystem object driven directly over a real directory (the
processes whose death is the evidence are real processes); the last test checks the same through a
real mount, from the daemon's log."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Mount, _env

from ckptfs import events
from ckptfs.backing import OsBackingStore
from ckptfs.events import Event
from ckptfs.fs import Caller, CkptFS
from ckptfs.rules import RuleSet
from ckptfs_testing.direct import torch_bytes as _pt
from ckptfs_testing.direct import write_file as _write
from ckptfs_testing.faults import FaultyStore


def _save(fs: CkptFS, step: int) -> str:
    g = f"run/checkpoint-{step}"
    _write(fs, f"{g}/model.pt", _pt(step))
    _write(fs, f"{g}/trainer_state.json", b'{"global_step": %d}' % step)
    return g


@pytest.fixture
def recorded(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[CkptFS] = []
    seen: list[Event] = []

    def make(store=None, **kw) -> CkptFS:  # type: ignore[no-untyped-def]
        fs = CkptFS(store or OsBackingStore(str(tmp_path)), housekeeping_interval=0, **kw)
        fs.events.subscribe(seen.append)
        made.append(fs)
        return fs

    yield make, seen
    for fs in made:
        fs.shutdown()


def kinds(seen: list[Event], path: str) -> list[str]:
    return [e.kind for e in seen if e.path == path]


def test_install_seal_and_rename_are_announced(recorded) -> None:  # type: ignore[no-untyped-def]
    make, seen = recorded
    fs = make()
    fs.mkdir("run", 0o755)
    fs.mkdir("run/checkpoint-1", 0o755)
    g = _save(fs, 1)  # HF layout: trainer_state.json is the marker that seals it
    assert kinds(seen, f"{g}/model.pt") == [events.PUBLISHED]
    assert kinds(seen, g) == [events.OPENED, events.SEALED]
    fs.rename("run/checkpoint-1/model.pt", "run/checkpoint-1/model2.pt")
    assert [e for e in seen if e.kind == events.RENAMED] == [
        Event(events.RENAMED, f"{g}/model.pt", dst=f"{g}/model2.pt")]


def test_unpublished_when_a_write_fails_or_a_file_is_refused(recorded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    make, seen = recorded
    store = FaultyStore(OsBackingStore(str(tmp_path)), ops=("pwrite",))
    fs = make(store)
    fh = fs.create("a.bin", 0o644)
    fs.write(fh, b"visible while staged", 0)
    store.arm(1, errno.EIO)
    with pytest.raises(OSError):
        fs.write(fh, b"lost", 100)
    store.arm(None)
    assert kinds(seen, "a.bin") == [events.UNPUBLISHED]
    with pytest.raises(OSError):
        fs.flush(fh)
    fs.release(fh)
    assert kinds(seen, "a.bin") == [events.UNPUBLISHED]  # one event per change
    fh = fs.create("m.pt", 0o644)
    fs.write(fh, _pt(1.0)[:300], 0)  # an incomplete torch file: refused at close
    with pytest.raises(OSError):
        fs.flush(fh)
    fs.release(fh)
    assert kinds(seen, "m.pt") == [events.UNPUBLISHED]


def test_retention_quarantine_restore_and_rollback_are_announced(recorded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    make, seen = recorded
    fs = make(rules=RuleSet(keep_last=2))
    fs.mkdir("run", 0o755)
    for step in (1, 2, 3):
        fs.mkdir(f"run/checkpoint-{step}", 0o755)
        _save(fs, step)
    assert kinds(seen, "run/checkpoint-1")[-1] == events.REMOVED  # retention
    # an abandoned deletion with nothing newer sealed is undone (G9)
    deleter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fs.unlink("run/checkpoint-3/model.pt", Caller(pid=deleter.pid))
    finally:
        deleter.kill()
        deleter.wait()
    fs.readdir("run")
    assert kinds(seen, "run/checkpoint-3")[-1] == events.RESTORED
    # a re-save of a sealed group that never completes rolls back to its seal at unmount (G11),
    # a new group that never completes is quarantined
    _write(fs, "run/checkpoint-3/model.pt", _pt(33.0))
    fs.mkdir("run/checkpoint-4", 0o755)
    _write(fs, "run/checkpoint-4/model.pt", _pt(4.0))
    with fs.commit_lock:
        fs.grp.settle_open_groups()
    assert kinds(seen, "run/checkpoint-3")[-1] == events.ROLLED_BACK
    assert kinds(seen, "run/checkpoint-4")[-1] == events.QUARANTINED
    assert torch.load(tmp_path / "run/checkpoint-3/model.pt")["w"][0].item() == 3.0  # the sealed save


def test_a_subscriber_that_fails_never_breaks_the_filesystem(recorded) -> None:  # type: ignore[no-untyped-def]
    make, seen = recorded
    fs = make()

    def broken(e: Event) -> None:
        raise RuntimeError("subscriber bug")

    fs.events.subscribe(broken)
    _write(fs, "f", b"data")
    assert kinds(seen, "f") == [events.PUBLISHED]
    fh = fs.open("f", os.O_RDONLY)
    try:
        assert fs.read(fh, 10, 0) == b"data"
    finally:
        fs.release(fh)


KILLED_WRITER = r"""
import os, signal, sys
f = open(sys.argv[1], "wb")
f.write(b"half a checkpoint")
f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writers_version_is_announced_through_a_mount(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with Mount(d, extra_args=["--debug"]) as m:
        (m.path / "w.bin").write_bytes(b"committed")
        p = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(m.path / "w.bin")], env=_env())
        assert p.returncode == -signal.SIGKILL
        assert (m.path / "w.bin").read_bytes() == b"committed"
    text = (d / ".ckptfs" / "daemon.log").read_text()
    assert "event published w.bin" in text
    assert "event unpublished w.bin (writer pid" in text


def test_a_group_that_turns_out_empty_is_released_and_announced(recorded) -> None:  # type: ignore[no-untyped-def]
    """A step directory whose only checkpoint file is removed, with no evidence of an interrupted
    save, stops being a group once its writer is gone: an ordinary directory again (E1/E2)."""
    make, seen = recorded
    fs = make()
    # the writer exits 0: a SIGKILL is evidence of an interrupted save (its empty directory is then
    # torn, as one whose maker was killed before writing into it), and whether its exit event came
    # before the housekeeping made this test flaky
    writer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        fs.mkdir("run", 0o755)
        fs.mkdir("run/checkpoint-5", 0o755)
        _write(fs, "run/checkpoint-5/optimizer.pt", _pt(5.0), pid=writer.pid)  # HF layout: waits for its marker
        assert fs.groups["run/checkpoint-5"].state == "open"
        fs.unlink("run/checkpoint-5/optimizer.pt")
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        assert writer.wait(30) == 0
    fs.grp.housekeeping()
    assert "run/checkpoint-5" not in fs.groups
    assert kinds(seen, "run/checkpoint-5") == [events.OPENED, events.RELEASED]
