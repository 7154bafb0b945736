"""--commit=async: close() returns once staged; fsync() returns only once durable."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import Mount

from ckptfs import META_DIR
from ckptfs.backing import OsBackingStore
from ckptfs.log.journal import Journal


def journal_installs(backing) -> set[str]:
    st = Journal(OsBackingStore(str(backing))).load()
    return set(st.files) | {e["path"] for e in st.entries if e.get("op") == "install"}


def test_fsync_returns_only_after_durable_install(tmp_path) -> None:
    src, mp = tmp_path / "src", tmp_path / "mp"
    src.mkdir()
    mp.mkdir()
    with Mount(mp, backing=src, commit="async") as m:
        data = os.urandom(3 << 20)
        with open(m.path / "f.bin", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            # durable = installed at its backing path and its intent in the journal
            assert (src / "f.bin").read_bytes() == data
            assert "f.bin" in journal_installs(src)
        for i in range(5):
            torch.save({"i": torch.tensor(i)}, m.path / f"s{i}.pt")
        dfd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        for i in range(5):
            assert torch.load(src / f"s{i}.pt")["i"].item() == i
        stats = json.loads(os.getxattr(str(m.path), "user.ckptfs.stats"))
        assert stats["commits"] == 6
    assert os.listdir(src / META_DIR / "staging") == []


def test_async_read_your_writes_and_rename_after_close(mnt_async: Mount) -> None:
    d = mnt_async.path
    for step in range(3):
        tmp = d / "ckpt.tmp"
        torch.save({"step": step, "w": torch.randn(1000)}, tmp)
        assert torch.load(tmp)["step"] == step  # visible at once, possibly still queued
        os.replace(tmp, d / "ckpt.pt")  # ordered after the commit of ckpt.tmp
        assert torch.load(d / "ckpt.pt")["step"] == step
    assert sorted(os.listdir(d)) == ["ckpt.pt"]
    assert os.getxattr(str(d / "ckpt.pt"), "user.ckptfs.status") == b"committed"


def test_umount_finishes_queued_commits(tmp_path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    with Mount(d, commit="async") as m:
        for i in range(20):
            (m.path / f"f{i}.json").write_text(json.dumps({"i": i, "pad": "x" * 100000}))
    for i in range(20):
        assert json.loads((d / f"f{i}.json").read_text())["i"] == i


@pytest.mark.parametrize("commit", ["sync", "async"])
def test_attributes_set_right_after_close_reach_the_file(tmp_path, commit: str) -> None:
    """``cp -p`` / ``shutil.copy2`` set the copy's times, mode and xattrs right after closing it.
    On an async mount the closed version is queued and the committer installs it meanwhile (its
    staging name renamed to the path): Lightning's ``_atomic_save`` (``shutil.move`` across
    filesystems) failed with ENOENT in the async framework campaign, 9 of 300 copies.  And the
    times set before the writer's (asynchronous) release looked like a write after the commit
    (W2): the copy was committed a second time (190 of 200 copies) and its times lost (12 of 200).
    Every change now reaches the file whichever name holds it, and a utime is not a write."""
    import json
    import shutil
    import subprocess

    d = tmp_path / "ckpts"
    d.mkdir()
    mnt = Mount(d, commit=commit).start()
    try:
        _copies(mnt, tmp_path, shutil, subprocess)
        stats = json.loads(os.getxattr(mnt.path, "user.ckptfs.stats"))
        assert stats.get("passthrough_reseals", 0) == 0, stats
    finally:
        mnt.stop()


def _copies(mnt_async: Mount, tmp_path, shutil, subprocess) -> None:  # noqa: ANN001

    src = tmp_path / "src.ckpt"
    src.write_bytes(os.urandom(300_000))
    os.chmod(src, 0o640)
    os.setxattr(src, "user.origin", b"trainer")
    os.utime(src, ns=(1_600_000_000 * 10**9, 1_600_000_000 * 10**9))
    for i in range(200):
        dst = mnt_async.path / f"step={i % 3}.ckpt"
        shutil.copy2(src, dst)  # raised FileNotFoundError before
        st = os.stat(dst)
        assert st.st_mtime_ns == 1_600_000_000 * 10**9 and st.st_mode & 0o777 == 0o640, (i, st)
        assert os.getxattr(dst, "user.origin") == b"trainer"
    for i in range(50):
        r = subprocess.run(["cp", "-p", str(src), str(mnt_async.path / f"cp{i % 2}.ckpt")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert os.stat(mnt_async.path / "cp0.ckpt").st_mtime_ns == 1_600_000_000 * 10**9


def test_files_closed_back_to_back_install_as_one_group_commit(tmp_path) -> None:
    """C5 (engine/commit.py): with the committer held until a sync point, twelve small files in two
    directories and a torch.save, closed back to back, install as one group commit at the fsync:
    one ``install_batch`` intent naming them in close order, each file whole at its backing path
    with its record, nothing at a backing path before the sync point."""
    d, mp = tmp_path / "src", tmp_path / "mp"
    d.mkdir()
    mp.mkdir()
    with Mount(mp, backing=d, commit="async", env={"CKPTFS_HOLD_COMMITS": "1"}) as m:
        (m.path / "a").mkdir()
        (m.path / "b").mkdir()
        names = [f"{'ab'[i % 2]}/f{i}.dat" for i in range(12)]
        data = {n: os.urandom(500 + 31 * i) for i, n in enumerate(names)}
        for n in names:
            (m.path / n).write_bytes(data[n])
        torch.save({"w": torch.arange(10)}, m.path / "a" / "model.pt")
        names.append("a/model.pt")
        assert [n for n in names if (d / n).exists()] == []  # queued: nothing installed yet
        assert all((m.path / n).read_bytes() == data[n] for n in names[:-1])  # yet visible through the mount
        fd = os.open(m.path / "b", os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)
        stats = json.loads(os.getxattr(str(m.path), "user.ckptfs.stats"))
        assert (stats["batches"], stats["batched_installs"], stats["commits"]) == (1, 13, 13)
        entries = Journal(OsBackingStore(str(d))).load().entries
        batch = [e for e in entries if e.get("op") == "install_batch"]
        assert [[i["path"] for i in e["items"]] for e in batch] == [names]
        for n in names[:-1]:
            assert (d / n).read_bytes() == data[n]
            assert os.getxattr(str(m.path / n), "user.ckptfs.status") == b"committed"
        assert torch.load(d / "a" / "model.pt")["w"].tolist() == list(range(10))
    assert os.listdir(d / META_DIR / "staging") == []
