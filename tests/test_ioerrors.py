"""I/O-error injection beyond the single-file sweep (issue 5, part 3).

* EIO / ENOSPC at every mutating backing call of a multi-file (DCP-like) save
  over a previous step, sync and async: the error reaches the application;
  every path holds a complete old or new version; the step's ``.metadata``
  is never newer than any of its shards; staging is reclaimed at once (not
  only at unmount); other paths keep working; a restart agrees.
* fsync failure ("fsyncgate"): the failed fsync is never issued again for
  that data and never turned into a success: every later fsync/close of the
  handle reports the error and the path keeps its old version.
* a real disk full: a ckptfs mount over a directory on a 64 MiB tmpfs, a
  torch.save larger than the space through FUSE: ENOSPC reaches the
  application, the old checkpoint stays loadable, the space is given back,
  other files stay readable and writable.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Mount, run_py

from campaigns.faultsweep import read, save  # the same direct CkptFS helpers as the sweep
from ckptfs import META_DIR
from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS
from ckptfs.records import XATTR
from ckptfs_testing.faults import FaultyStore

SHARDS = [f"step/shard_{i}.bin" for i in range(4)]  # not a group layout: file-level semantics (groups: test_groups)
META = "step/manifest.json"


def shard(i: int, version: int) -> bytes:
    return bytes([65 + version]) * (30000 + 5000 * i)


def metadata(version: int) -> bytes:
    return json.dumps({"version": version, "shards": len(SHARDS)}).encode()


def save_step(fs: CkptFS, version: int) -> None:
    """Shards, then .metadata last; stops at the first error like a real save; async: fsyncdir at the end."""
    for i, p in enumerate(SHARDS):
        save(fs, p, shard(i, version))
    save(fs, META, metadata(version))
    fs.fsyncdir("step")


def fresh(d: Path, mode: str, keep: int | None = None) -> tuple[FaultyStore, CkptFS]:
    d.mkdir()
    store = FaultyStore(OsBackingStore(str(d)))
    fs = CkptFS(store, commit_mode=mode, keep_generations=keep)
    if mode == "async":
        # each save_step installs as one group commit at its fsyncdir (engine/commit.py C5), so
        # every run makes the same calls and each call of the batch path gets its fault
        fs.commit.committer.held = True
    fs.mkdir("step", 0o755)
    save_step(fs, 1)
    save(fs, "other.bin", b"other-1")
    fs.fsyncdir("")
    return store, fs


@pytest.mark.parametrize("keep", [None, 1], ids=["default", "keep1"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_error_at_every_call_of_a_multi_file_save(tmp_path: Path, err: int, mode: str, keep: int | None) -> None:
    """``keep``: these files are outside groups and keep no generation by default, so an install
    journals no intent before its rename and an unsynced "done" entry after it; with
    ``--keep-generations 1`` it journals an intent carrying the generation instead."""
    store, fs = fresh(tmp_path / "probe", mode, keep)
    store.arm(None)
    save_step(fs, 2)
    total = store.calls
    fs.shutdown()
    assert total >= 5 * 6
    for n in range(1, total + 1):
        d = tmp_path / f"n{n}"
        store, fs = fresh(d, mode, keep)
        journal_fd = fs.journal.fd
        store.arm(n, err)
        failed = None
        try:
            save_step(fs, 2)
        except OSError as e:
            failed = e
        assert store.fired is not None, f"call {n} of {total} never happened"
        if mode == "async":
            try:  # the application's error handling waits for what it had already closed
                fs.fsyncdir("")
            except OSError as e:
                failed = failed or e
        # ENOSPC setting a file's record (records.XATTR) is a full xattr block on ext4: the install
        # journals the record instead and the save completes (campaigns/faultsweep.py, "absorbed")
        absorbed = err == errno.ENOSPC and store.fired[0] == "fsetxattr" and store.fired[1][1] == XATTR
        # and the unsynced "done" entry a durable install writes when it journaled no intent: the
        # file carries its record, the save succeeded (campaigns/faultsweep.py, "after_install")
        absorbed = absorbed or (keep is None and failed is None and store.fired[0] == "pwrite"
                                and store.fired[1][0] == journal_fd)
        if absorbed:
            assert failed is None, (n, store.fired, failed)
        else:
            assert failed is not None and failed.errno in (err, errno.EIO), (n, store.fired, failed)
        if store.fired[0] in ("pwrite", "fsync", "fdatasync", "rename", "fsync_dir", "open", "copy_range") \
                and not absorbed:
            assert failed is not None and failed.errno == err, (n, store.fired, failed)  # the injected errno
        got = [read(fs, p) for p in SHARDS]
        meta = read(fs, META)
        # complete versions only
        for i, g in enumerate(got):
            assert g in (shard(i, 1), shard(i, 2)), (n, store.fired, i, len(g))
        assert meta in (metadata(1), metadata(2)), (n, store.fired)
        new = [g == shard(i, 2) for i, g in enumerate(got)]
        # ordering: the step's .metadata is never newer than any shard, and the new
        # versions form a prefix of the save (the save stops at the first error;
        # async: no commit after a failed one)
        assert meta == metadata(1) or all(new), (n, store.fired, new)
        assert new == sorted(new, reverse=True), (n, store.fired, new)
        if all(new) and meta == metadata(2):  # all installed: only a failed post-rename directory fsync allows it
            assert store.fired[0] == "fsync_dir" or absorbed, (n, store.fired)
        if absorbed:
            assert all(new) and meta == metadata(2), (n, store.fired, new)
        # staging reclaimed now, while serving (a failed unlink of the staging file itself excepted)
        left = os.listdir(d / META_DIR / "staging")
        if not (store.fired[0] == "unlink" and "staging" in str(store.fired[1])):
            assert left == [], (n, store.fired, left)
        # the daemon keeps serving other paths
        assert read(fs, "other.bin") == b"other-1"
        save(fs, "other.bin", b"other-2")
        fs.fsyncdir("")
        assert read(fs, "other.bin") == b"other-2"
        fs.shutdown()
        assert os.listdir(d / META_DIR / "staging") == []
        fs2 = CkptFS(OsBackingStore(str(d)))  # restart: recovery agrees
        assert [read(fs2, p) for p in SHARDS] == got and read(fs2, META) == meta
        fs2.shutdown()
        shutil.rmtree(d)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("which", [1, 2], ids=["staged-fsync", "journal-fdatasync"])
def test_fsync_failure_is_never_retried_into_success(tmp_path: Path, mode: str, which: int) -> None:
    store = FaultyStore(OsBackingStore(str(tmp_path)), ops=("fsync", "fdatasync"))
    # a kept generation: the overwrite journals an install intent (its fdatasync is call 2); a file
    # outside groups keeps none by default, and then journals no intent at all
    fs = CkptFS(store, commit_mode=mode, keep_generations=1)
    save(fs, "a.bin", b"old" * 1000)
    fs.fsyncdir("")
    store.arm(which, errno.EIO)  # 1: fsync of the staged file, 2: fdatasync of the install intent
    fh = fs.open("a.bin", os.O_WRONLY | os.O_TRUNC)
    fs.write(fh, b"new" * 1000, 0)
    errors: dict[str, int | None] = {}
    for name, call in (("close", lambda: fs.flush(fh)), ("fsync", lambda: fs.fsync(fh)),
                       ("fsync again", lambda: fs.fsync(fh)), ("fsyncdir", lambda: fs.fsyncdir(""))):
        try:
            call()
            errors[name] = None
        except OSError as e:
            errors[name] = e.errno
    assert store.fired is not None
    failed_fd = store.fired[1][0]
    after = store.log[store.log.index((store.fired[0], store.fired[1])) + 1:]
    assert (store.fired[0], (failed_fd,)) not in after, f"{store.fired[0]} retried after it failed: {after}"
    # sync: close reports it; async: close only queues, fsync reports it; and every
    # later fsync of the handle reports it again: never a success
    assert errors["fsync"] == errors["fsync again"] == errno.EIO, errors
    if mode == "sync":
        assert errors["close"] == errno.EIO, errors
    fs.release(fh)
    assert read(fs, "a.bin") == b"old" * 1000
    assert os.listdir(tmp_path / META_DIR / "staging") == []
    save(fs, "b.bin", b"b")  # still serving
    fs.shutdown()
    fs2 = CkptFS(OsBackingStore(str(tmp_path)), keep_generations=1)
    assert read(fs2, "a.bin") == b"old" * 1000 and read(fs2, "b.bin") == b"b"
    fs2.shutdown()


# --------------------------------------------------------------------------- real disk full
DISK_FULL_APP = """
import hashlib, json, os, time, torch
model, fs_root = {model!r}, {fs_root!r}
out = {{}}

def used():
    sv = os.statvfs(fs_root)
    return (sv.f_blocks - sv.f_bfree) * sv.f_frsize

torch.save({{"w": torch.arange(1 << 20), "step": 1}}, model)  # 8 MiB, committed
old = hashlib.sha256(open(model, "rb").read()).hexdigest()
out["used_before"] = used()
try:  # 24 MiB through a Python file object; about 23 MiB are free
    with open(model, "wb") as f:
        torch.save({{"w": torch.ones(24 << 20, dtype=torch.uint8), "step": 2}}, f)
    out["big"] = "OK"
except OSError as e:
    out["big"] = ["OSError", e.errno]
except RuntimeError as e:
    out["big"] = ["RuntimeError", str(e)]
# FUSE sends RELEASE (which discards the failed staging file) asynchronously after
# close() returned: wait for it (bounded), then measure.  .ckptfs is invisible
# through the mount, so staging is measured by df.
deadline = time.monotonic() + 30
while used() > out["used_before"] + (1 << 20) and time.monotonic() < deadline:
    time.sleep(0.05)
out["used_after"] = used()
out["old_intact"] = hashlib.sha256(open(model, "rb").read()).hexdigest() == old
sd = torch.load(model, weights_only=True)
out["old_loads"] = sd["step"] == 1 and torch.equal(sd["w"], torch.arange(1 << 20))
torch.save({{"step": 3}}, model)  # a save that fits works again
out["new_loads"] = torch.load(model, weights_only=True)["step"] == 3
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_real_disk_full_through_the_mount(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(small)], check=True)
    m = None
    try:
        d = small / "ckpts"
        d.mkdir()
        m = Mount(d).start()
        other = d / "other.txt"
        other.write_text("other-1")
        r = run_py(DISK_FULL_APP.format(model=str(d / "model.pt"), fs_root=str(small)))
        out = json.loads(r.stdout.strip().splitlines()[-1])
        # the application sees ENOSPC: from write() or close() of its file object
        assert out["big"] == ["OSError", errno.ENOSPC], out
        st = json.loads(os.getxattr(d, "user.ckptfs.stats"))
        if st.get("transport_native"):
            # the native transport gave the writer passthrough: its ENOSPC reached the application
            # only, and the seal refused the cut-off version because the disk was full (W3)
            assert st.get("passthrough_writers_disk_full", 0) >= 1, st
        # nothing partial became visible: the old checkpoint is intact and loads
        assert out["old_intact"] and out["old_loads"], out
        # staging reclaimed while serving: the space is back
        assert out["used_after"] <= out["used_before"] + (1 << 20), out
        # other paths still readable and writable; a save that fits works again
        assert out["new_loads"], out
        assert other.read_text() == "other-1"
        other.write_text("other-2")
        assert other.read_text() == "other-2"
        m.stop()
        m = None
        assert os.listdir(d / META_DIR / "staging") == []
        assert other.read_text() == "other-2"
    finally:
        if m is not None:
            m.stop()
        subprocess.run(["umount", str(small)], check=False)
        if os.path.ismount(small):
            subprocess.run(["umount", "-l", str(small)], check=False)
