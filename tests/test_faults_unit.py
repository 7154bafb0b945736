"""I/O errors at every backing-store call of a save (no mount: CkptFS directly).

For each N, the N-th mutating backing call during an overwrite fails with EIO
or ENOSPC.  Required: the error reaches the caller; the path holds the old
version, or (only when the failure came after the atomic rename) the complete
new one; staging space is reclaimed; other paths keep working; a restart
(recovery) agrees.
"""

from __future__ import annotations

import errno
import os

import pytest

from ckptfs import META_DIR
from ckptfs.backing import OsBackingStore
from ckptfs.faults import FaultyStore
from ckptfs.fs import CkptFS

OLD = b"old-version " * 5000
NEW = b"NEW-VERSION! " * 9000


def save(fs: CkptFS, path: str, data: bytes) -> None:
    fh = fs.open(path, os.O_WRONLY | os.O_TRUNC) if fs._lexists(path) else fs.create(path, 0o644)
    try:
        for off in range(0, len(data), 16384):
            fs.write(fh, data[off:off + 16384], off)
        fs.flush(fh)
    finally:
        fs.release(fh)


def read(fs: CkptFS, path: str) -> bytes:
    fh = fs.open(path, os.O_RDONLY)
    try:
        return fs.read(fh, 1 << 24, 0)
    finally:
        fs.release(fh)


def count_calls(tmp_path, mode: str) -> int:
    d = tmp_path / "probe"
    d.mkdir()
    store = FaultyStore(OsBackingStore(str(d)))
    fs = CkptFS(store, commit_mode=mode)
    save(fs, "a.bin", OLD)
    fs.fsyncdir("")
    store.arm(None)
    save(fs, "a.bin", NEW)
    fs.fsyncdir("")
    calls = store.calls  # the overwrite's calls only, not the shutdown's compaction
    fs.shutdown()
    return calls


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_error_at_every_call_of_an_overwrite(tmp_path, err: int, mode: str) -> None:
    total = count_calls(tmp_path, mode)
    assert total >= 6
    outcomes = {"error": 0, "ok": 0}
    for n in range(1, total + 1):
        d = tmp_path / f"n{n}"
        d.mkdir()
        store = FaultyStore(OsBackingStore(str(d)))
        fs = CkptFS(store, commit_mode=mode)
        save(fs, "a.bin", OLD)
        fs.fsyncdir("")
        store.arm(n, err)
        failed = None
        try:
            save(fs, "a.bin", NEW)
            fs.fsyncdir("")  # async mode reports commit-time failures here
        except OSError as e:
            failed = e
        assert store.fired is not None, f"call {n} of {total} never happened"
        assert failed is not None and failed.errno == err, (n, store.fired, failed)
        outcomes["error" if failed else "ok"] += 1
        content = read(fs, "a.bin")
        after_rename = store.fired[0] == "fsync_dir"  # the only fsync_dir of an install follows its rename
        assert content == OLD or (content == NEW and (failed is None or after_rename)), (n, store.fired)
        # the daemon keeps serving other paths
        save(fs, "b.bin", b"other")
        assert read(fs, "b.bin") == b"other"
        fs.shutdown()
        assert os.listdir(d / META_DIR / "staging") == [], f"staging not reclaimed after {store.fired}"
        fs2 = CkptFS(OsBackingStore(str(d)))  # restart: recovery agrees
        assert read(fs2, "a.bin") == content
        assert fs2.records["a.bin"].size == len(content)
        fs2.shutdown()
    assert outcomes["error"] == total
