"""Regressions for defects 2-5 of the architecture review (issue 11); each failed on 1db6474.

Defects 1 and 6 (``ckptfs forget``, mountinfo parsing) are in tests/test_cli_defects.py.
These drive the filesystem object directly over a real directory (the mount tests cover the
same paths end to end); the processes whose life decides a group's fate are real processes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS
from ckptfs.layout import TRASH
from ckptfs_testing.direct import staging_leftovers
from ckptfs_testing.direct import torch_bytes as _torch_bytes
from ckptfs_testing.direct import write_file as _write
from ckptfs_testing.faults import FaultyStore


def test_gc_keeps_the_trash_of_a_deletion_in_progress(tmp_path: Path) -> None:
    """Defect 2: gc deleted every ``.ckptfs/trash/*``, including the trash of a group whose deletion
    is still in progress (TRASHED).  When the deleter then dies half-way and no newer group is
    sealed, G9 puts the group back from its trash: its files must still be there."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    deleter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fs.mkdir("run", 0o755)
        fs.mkdir("run/checkpoint-10", 0o755)
        model = _torch_bytes(1.0)
        _write(fs, "run/checkpoint-10/model.pt", model)
        _write(fs, "run/checkpoint-10/trainer_state.json", b'{"global_step": 10}')
        fs.seal("run/checkpoint-10")
        assert fs.groups["run/checkpoint-10"].state == "sealed"
        from ckptfs.fs import Caller
        fs.unlink("run/checkpoint-10/model.pt", Caller(pid=deleter.pid))  # rotation starts deleting
        g = fs.groups["run/checkpoint-10"]
        assert g.state == "trashed"
        assert os.listdir(tmp_path / TRASH)
        assert fs.gc()["items"] == []  # nothing reported deleted: the trash of a deletion in progress stays
        deleter.kill()
        deleter.wait()
        fs.readdir("run")  # the live sweep settles the abandoned deletion: nothing newer, so undo it
        assert fs.groups["run/checkpoint-10"].state == "sealed"
        assert (tmp_path / "run/checkpoint-10/model.pt").read_bytes() == model
        fh = fs.open("run/checkpoint-10/model.pt", os.O_RDONLY)  # verified against its record
        try:
            assert fs.read(fh, len(model) + 10, 0) == model
        finally:
            fs.release(fh)
    finally:
        if deleter.poll() is None:
            deleter.kill()
            deleter.wait()
        fs.shutdown()


class _Gate:
    """A lock wrapper that holds back other threads at the lock until the test opens the gate,
    telling it when one arrives (the lock is free meanwhile: the test's thread uses it)."""

    def __init__(self, inner: threading.Lock) -> None:
        self.inner = inner
        self.waiting = threading.Event()
        self.gate = threading.Event()

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.waiting.set()
            self.gate.wait(30)
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()

    def acquire(self, *a: object, **k: object) -> bool:
        return self.inner.acquire(*a, **k)

    def release(self) -> None:
        self.inner.release()


def test_truncate_by_path_never_changes_a_sealed_version(tmp_path: Path) -> None:
    """Defect 3: truncate(2) by path checked ``state == "open"`` outside the version's lock; a seal
    in between froze the version, and the truncate then cut the installed file under its record.
    Here the seal (a close by the writer) happens exactly while the truncate waits for the lock."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    try:
        fh = fs.create("log.bin", 0o644)
        fs.write(fh, b"x" * 1000, 0)
        v = fs.pending["log.bin"]
        gated = _Gate(v.lock)
        v.lock = gated  # type: ignore[assignment]
        err: list[BaseException] = []

        def trunc() -> None:
            try:
                fs.truncate("log.bin", 10)
            except BaseException as e:  # noqa: BLE001
                err.append(e)

        t = threading.Thread(target=trunc)
        t.start()
        assert gated.waiting.wait(10)  # the truncate has found the version open and waits for its lock
        fs.flush(fh)  # meanwhile the writer closes: seal + install
        gated.gate.set()
        t.join(10)
        assert not err, err
        fs.release(fh)
        rec = fs.records["log.bin"]
        on_disk = (tmp_path / "log.bin").read_bytes()
        assert len(on_disk) == rec.size, "the installed file no longer matches its record"
        import blake3
        assert blake3.blake3(on_disk).hexdigest() == rec.blake3
        assert on_disk == b"x" * 10  # the truncate came after the close: a new version, committed
    finally:
        fs.shutdown()


class _LockWatch:
    """Records every backing-store call made while the filesystem's ``lock`` is held (I5)."""

    def __init__(self, inner: OsBackingStore) -> None:
        self.inner = inner
        self.fs: CkptFS | None = None
        self.under_lock: list[str] = []
        self.watching = False

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*a, **k):  # type: ignore[no-untyped-def]
            if self.watching and self.fs is not None and self.fs.lock._is_owned():  # type: ignore[attr-defined]
                self.under_lock.append(name)
            return attr(*a, **k)

        return call


def test_no_disk_work_under_the_lock_in_open_trunc_and_release(tmp_path: Path) -> None:
    """Defect 4 (I5: never block on disk while holding ``lock``): ``open(O_TRUNC)`` stat'ed (with
    ``--on-corrupt rollback`` hashed) and created the new version under ``lock``; ``release``
    appended to the journal and unlinked staging under it."""
    store = _LockWatch(OsBackingStore(str(tmp_path)))
    fs = CkptFS(store, housekeeping_interval=0, on_corrupt="rollback")  # type: ignore[arg-type]
    store.fs = fs
    try:
        _write(fs, "model.pt", _torch_bytes(1.0))
        _write(fs, "model.pt", _torch_bytes(2.0))  # a kept generation to roll back to
        store.watching = True
        fh = fs.open("model.pt", os.O_WRONLY | os.O_TRUNC)
        fs.write(fh, _torch_bytes(3.0)[:300], 0)
        with pytest.raises(OSError) as e:
            fs.flush(fh)  # refused: incomplete torch file (aborted: journaled at release)
        assert e.value.errno == errno.EIO
        fs.release(fh)
        fh = fs.create("other.pt", 0o644)
        fs.write(fh, b"junk", 0)
        fs.unlink("other.pt")  # released after its unlink: staging unlinked at release
        fs.release(fh)
        store.watching = False
        assert store.under_lock == []
    finally:
        fs.shutdown()


def test_ownership_of_a_new_version_goes_through_the_store(tmp_path: Path) -> None:
    """Defect 5: the new version's owner was set with ``os.fchown`` directly, past the backing store,
    so fault injection (and the model checker) never saw it.  A failing fchown must fail the create."""
    store = FaultyStore(OsBackingStore(str(tmp_path)), ops=("fchown",))
    fs = CkptFS(store, housekeeping_interval=0)  # type: ignore[arg-type]
    try:
        store.arm(1, errno.EIO)
        if os.geteuid() != 0:
            pytest.skip("the owner of a new version is set only by a root daemon")
        with pytest.raises(OSError) as e:
            fs.create("f", 0o644)
        assert e.value.errno == errno.EIO
        assert store.fired is not None and store.fired[0] == "fchown"
        assert not (tmp_path / "f").exists()
    finally:
        fs.shutdown()


def test_no_disk_work_under_the_lock_across_a_workload(tmp_path: Path) -> None:
    """I5 beyond defect 4's two calls: groups sealed by a marker, overwrites that keep and prune
    generations, a rename over a committed file, unlink, link, listing, a verified read and the
    status attributes.  (Found by this test after the review: dropped kept generations were
    unlinked under ``lock``; now ``Generations.collect`` deletes them after it is released.)"""
    store = _LockWatch(OsBackingStore(str(tmp_path)))
    fs = CkptFS(store, housekeeping_interval=0, keep_generations=1)  # type: ignore[arg-type]
    store.fs = fs
    try:
        store.watching = True
        fs.mkdir("run", 0o755)
        for step in (1, 2, 3):
            fs.mkdir(f"run/checkpoint-{step}", 0o755)
            _write(fs, f"run/checkpoint-{step}/model.pt", _torch_bytes(step))
            _write(fs, f"run/checkpoint-{step}/trainer_state.json", b"{}")
        for i in range(3):
            _write(fs, "a.pt", _torch_bytes(i))  # the third install prunes the first kept generation
        _write(fs, "b.pt", _torch_bytes(9))
        fs.rename("b.pt", "a.pt")
        fs.unlink("a.pt")
        fs.link("run/checkpoint-1/model.pt", "l.pt")
        fs.readdir("run")
        fh = fs.open("run/checkpoint-1/model.pt", os.O_RDONLY)
        fs.read(fh, 100, 0)
        fs.release(fh)
        fs.getxattr("", "user.ckptfs.attrs")
        fs.getxattr("run/checkpoint-1", "user.ckptfs.attrs")
        store.watching = False
        assert store.under_lock == []
        assert fs.groups["run/checkpoint-3"].state == "sealed"
        assert not any(n for n in os.listdir(tmp_path / ".ckptfs" / "generations")
                       if n not in {g.name.rsplit("/", 1)[-1] for gs in fs.gens.table.values() for g in gs})
    finally:
        fs.shutdown()


# --- found by a review of the refactor (each failed before its fix) ---------------------------

def test_a_truncating_open_never_brings_back_a_file_unlinked_meanwhile(tmp_path: Path) -> None:
    """open(O_TRUNC) makes its new version outside ``lock``; an unlink that completes meanwhile must
    win (natively the open writes the unlinked inode): the open is retried and finds the name gone
    (ESTALE: the kernel looks it up again), and the file does not come back."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    try:
        _write(fs, "a", b"OLD")
        make = fs.staging.new_version_like

        def unlinked_meanwhile(path, mode, caller, umask=None):  # type: ignore[no-untyped-def]
            nv = make(path, mode, caller, umask)
            if (tmp_path / "a").exists():
                fs.unlink("a")  # another thread's unlink completes here
            return nv

        fs.staging.new_version_like = unlinked_meanwhile  # type: ignore[method-assign]
        with pytest.raises(OSError) as e:
            fs.open("a", os.O_WRONLY | os.O_TRUNC)
        assert e.value.errno == errno.ESTALE
        fs.staging.new_version_like = make  # type: ignore[method-assign]
        assert not (tmp_path / "a").exists() and "a" not in fs.records and "a" not in fs.pending
        assert staging_leftovers(tmp_path, fs) == []
    finally:
        fs.shutdown()


def test_xattrs_are_copied_from_the_replaced_version_not_a_reused_fd(tmp_path: Path) -> None:
    """The xattrs of a new version come from the version it replaces; while they are copied, that
    version's fd stays open (a reference), so a concurrent close cannot hand its number to another
    file whose xattrs would then be copied."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    held: list[int] = []
    try:
        w = fs.create("a", 0o644)
        fs.write(w, b"data", 0)
        fs.setxattr("a", "user.mine", b"1", 0)
        other = tmp_path / "unrelated"
        other.write_bytes(b"")
        os.setxattr(other, "user.secret", b"leak")
        make = fs.staging.new_version

        def writer_closes_meanwhile(path, mode, caller, **kw):  # type: ignore[no-untyped-def]
            fs.flush(w)
            fs.release(w)
            held.append(os.open(other, os.O_RDONLY))  # another thread's open takes the lowest free fd
            return make(path, mode, caller, **kw)

        fs.staging.new_version = writer_closes_meanwhile  # type: ignore[method-assign]
        fh = fs.open("a", os.O_WRONLY | os.O_TRUNC)
        fs.staging.new_version = make  # type: ignore[method-assign]
        v = fs.handles[fh].version
        assert v is not None
        names = os.listxattr(tmp_path / v.staging)
        assert "user.mine" in names and "user.secret" not in names
        fs.release(fh)
    finally:
        for fd in held:
            os.close(fd)
        fs.shutdown()


def test_a_failed_late_commit_at_release_does_no_disk_work_under_the_lock(tmp_path: Path) -> None:
    """I5: a file written and released without a flush (mmap writeback) is committed at release; when
    that commit is refused, its staging is removed outside ``lock``."""
    store = _LockWatch(OsBackingStore(str(tmp_path)))
    fs = CkptFS(store, housekeeping_interval=0)  # type: ignore[arg-type]
    store.fs = fs
    try:
        fh = fs.create("m.safetensors", 0o644)
        fs.write(fh, b"\x10" + b"\x00" * 7 + b"{", 0)  # a header longer than the file: incomplete
        store.watching = True
        fs.release(fh)
        store.watching = False
        assert store.under_lock == []
        assert not (tmp_path / "m.safetensors").exists()
        assert staging_leftovers(tmp_path, fs) == []
    finally:
        fs.shutdown()
