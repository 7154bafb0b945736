"""Issue 24: the data path and the namespace behave exactly as on ext4, on both transports.

* Writes after ``fsync`` + ``ftruncate`` through one fd are kept (they were silently lost: the
  truncate cloned the version a passthrough writer's kernel kept writing into).
* A rename over an existing name is one atomic step for a reader in a loop (it saw ENOENT on 81 %
  of its opens): never ENOENT, ESTALE, EBADF or EIO (native transport; libfuse: docs/design.md T7).
* ``fallocate`` in every mode the backing filesystem has, applied to the staged copy.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Mount, _env

from ckptfs_testing.renamerace import race

NAMES = ["y.bin", "model.pt", "plain.txt", "step_1/data.bin"]
# (size after ftruncate, offset of the write that follows, its length)
CASES = [(40_000, 160_000, 60_000), (5_000, 8_000, 1_000), (100_000, 1_000, 5_000), (0, 0, 5_000)]


def _expected(first: bytes, trunc: int, off: int, data: bytes) -> bytes:
    exp = bytearray(first[:trunc])
    if len(exp) < trunc:
        exp += bytes(trunc - len(exp))
    if len(exp) < off:
        exp += bytes(off - len(exp))
    exp[off:off + len(data)] = data
    return bytes(exp)


def _offline_verify(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(d)], capture_output=True, text=True,
                          env=_env(), cwd=ROOT)


@pytest.mark.portable
def test_writes_after_fsync_and_ftruncate_are_kept(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    (d / "step_1").mkdir(parents=True)
    want: dict[str, bytes] = {}
    with Mount(d).start():
        for name in NAMES:
            p = d / name
            for trunc, off, n in CASES:
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                first, data = os.urandom(190_000), os.urandom(n)
                os.pwrite(fd, first, 0)
                os.fsync(fd)
                os.ftruncate(fd, trunc)
                os.pwrite(fd, data, off)
                exp = _expected(first, trunc, off, data)
                case = f"{name} ftruncate({trunc}) then {n} bytes at {off}"
                assert os.fstat(fd).st_size == len(exp), case
                assert os.pread(fd, len(exp) + 10, 0) == exp, case
                os.close(fd)  # no error
                assert p.read_bytes() == exp, case
                want[name] = exp
            # and fsync after the last write too: the reseal is durable before fsync returns
            fd = os.open(p, os.O_RDWR)
            os.fsync(fd)
            os.ftruncate(fd, 3)
            os.fsync(fd)
            os.close(fd)
            want[name] = want[name][:3]
            assert p.read_bytes() == want[name]
    r = _offline_verify(d)
    assert r.returncode == 0, r.stdout + r.stderr
    with Mount(d).start():
        for name, exp in want.items():
            assert (d / name).read_bytes() == exp, name
        r = _offline_verify(d)
        assert r.returncode == 0, r.stdout + r.stderr


RACE_NAMES = ["f.dat", "latest", "model.safetensors", "m.pt"]


def _libfuse() -> bool:
    return os.environ.get("CKPTFS_TRANSPORT") == "mfusepy"


def _check_race(name: str, got: dict, libfuse_limit: float = 0.01) -> None:
    errs = got["errors"]
    assert got["reads"] > 50 and got["renames"] > 20, (name, got)
    if not _libfuse():
        assert errs == {}, (name, got)
        return
    # libfuse's high-level API answers an open of a node renamed over that no open holds ESTALE
    # itself, before ckptfs sees it (docs/design.md, T7); the VFS repeats it once.  Only that is left
    assert not [k for k in errs if k != "open:116"], (name, got)
    assert sum(errs.values()) <= got["reads"] * libfuse_limit, (name, got)


@pytest.mark.portable
def test_a_rename_over_a_name_is_atomic_for_a_reader(tmp_path: Path) -> None:
    """tmp + rename over the target in a loop; a reader opens, fstats and reads it in a loop.
    Natively it never fails.  Through the mount it saw ENOENT on 81 % of opens, EBADF (an fstat
    racing a release read a closed fd), and ESTALE (an open whose lookup came before the rename;
    the VFS repeats it once, and a second rename meanwhile made the repeat fail too).  On the native
    transport no error at all (T7: the file renamed over keeps a handle until the kernel forgets
    it); on libfuse only that ESTALE is left, rarely (docs/design.md)."""
    native = tmp_path / "native"
    native.mkdir()
    base = race(native, "f.dat", 1.5)
    assert base["errors"] == {}, base
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        for name in RACE_NAMES:
            got = race(d, name, 2.0)
            print(f"{name}: {got} (writer {got['renames'] / 2.0:.0f}/s, native {base['renames'] / 1.5:.0f}/s)")
            _check_race(name, got)


@pytest.mark.portable
def test_three_writers_renaming_over_one_name_beside_three_readers(tmp_path: Path) -> None:
    """Three writers replace one name by tmp + rename, three readers open, fstat and read it.  With
    renames this dense, an open whose lookup came before a rename met a second rename at the VFS's
    one repeat (ESTALE to the reader: 16 in 21,264 reads), and an fstat of a node renamed over
    whose last handle had just closed was answered with the mount root's attributes (a directory:
    the kernel marked the inode bad, EIO on fstat and read: 6 in 21,264), and an open that read
    its node's path just before a rename over it opened the *new* file (T8).  Natively: no error."""
    native = tmp_path / "native"
    native.mkdir()
    base = race(native, "f.dat", 1.5, writers=3, readers=3)
    assert base["errors"] == {}, base
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        got = race(d, "f.dat", 6.0, writers=3, readers=3)
        print(f"{got} (writers {got['renames'] / 6.0:.0f}/s, native {base['renames'] / 1.5:.0f}/s)")
        if not _libfuse():
            import json
            stats = json.loads(os.getxattr(d, "user.ckptfs.stats"))
            print({k: stats.get(k, 0) for k in ("passthrough_node_splits", "opens_after_a_move",
                                                "getattrs_after_a_move", "keepers")})
            # T8: an open racing a rename over its name opened the new file for the old node, whose
            # passthrough readers read the old one: answered ESTALE (43 times in one 6 s run; the
            # VFS's repeat hid most, 1 in 3 runs one reached a reader).  No reader open here meets
            # a writer, so the daemon must never have answered one ESTALE
            assert stats.get("passthrough_node_splits", 0) == 0, stats
        # libfuse: 35 ESTALE in 4,198 reads measured (0.8 %: three renames land in one open's window
        # far more often than one); bounded at 3 % so this run stays a guard against any other error
        _check_race("f.dat", got, libfuse_limit=0.03)


def _open_after_a_rename(root: Path, name: str) -> tuple:
    """A lookup (an O_PATH fd) before a rename over ``name``, the open after it (through the
    fd's /proc link: the kernel opens the inode the lookup found, and never looks the name up
    again).  Natively: the file it found, unlinked (nlink 0)."""
    f, g = root / name, root / (name + ".tmp")
    f.write_bytes(b"old bytes")
    pfd = os.open(f, os.O_PATH)
    try:
        g.write_bytes(b"new")
        os.rename(g, f)
        st = os.fstat(pfd)
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY)
        try:
            data = os.read(fd, 100)
        finally:
            os.close(fd)
    finally:
        os.close(pfd)
    return st.st_size, st.st_nlink, data, f.read_bytes()


def _daemon_fds(d: Path) -> int:
    return len(os.listdir(f"/proc/{int(os.getxattr(d, 'user.ckptfs.pid'))}/fd"))


def test_an_open_whose_lookup_came_before_a_rename_opens_the_file_it_found(tmp_path: Path) -> None:
    """T7 (native transport): the file a rename replaces keeps a handle until the kernel forgets
    its node.  An open of the node after the rename was ESTALE (here: reaching the application, as
    a /proc link is not looked up again), an fstat the attributes of the file it named.  Now both
    are the old file, as natively, and the handle is released when the kernel forgets the node:
    100 more such renames leave the daemon's open files where they were."""
    native = tmp_path / "native"
    (native / "step_1").mkdir(parents=True)
    want = {name: _open_after_a_rename(native, name) for name in ("latest", "model.pt", "step_1/x.bin")}
    assert want["latest"] == (9, 0, b"old bytes", b"new"), want
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        (d / "step_1").mkdir()
        for name, exp in want.items():
            assert _open_after_a_rename(d, name) == exp, name
        before = _daemon_fds(d)
        for _ in range(100):
            _open_after_a_rename(d, "latest")
        after = _daemon_fds(d)
        assert after <= before + 5, (before, after)  # (a staging file or two may be open meanwhile)
        import json
        stats = json.loads(os.getxattr(d, "user.ckptfs.stats"))
        assert stats.get("keepers", 0) >= 103, stats


def test_a_rename_that_fails_leaves_the_file_it_would_replace(tmp_path: Path) -> None:
    """A rename over a kernel-known file that the daemon refuses (EROFS: the committed view)
    hides nothing: the file, its open handles and the kernel's node answer as before."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        (d / "a.bin").write_bytes(b"committed")
        (d / "b.bin").write_bytes(b"other")
        view = d / ".ckptfs-committed" / "a.bin"
        fd = os.open(view, os.O_RDONLY)
        try:
            with pytest.raises(OSError) as e:
                os.rename(d / "b.bin", view)
            assert e.value.errno in (errno.EROFS, errno.EXDEV), e.value
            assert os.pread(fd, 100, 0) == b"committed"
            assert os.fstat(fd).st_nlink == 1
        finally:
            os.close(fd)
        assert view.read_bytes() == b"committed" and (d / "a.bin").read_bytes() == b"committed"
        assert os.stat(view).st_nlink == 1
        assert sorted(os.listdir(d / ".ckptfs-committed")) == ["a.bin", "b.bin"]


@pytest.mark.portable
@pytest.mark.parametrize("name", ["plain.dat", "model.pt", "step_1/shard.bin"])
def test_fallocate_modes_apply_to_the_staged_copy(tmp_path: Path, name: str) -> None:
    """Every mode ext4 has, through the mount, gives the bytes it gives natively, and the committed
    file verifies (its digest is of the bytes fallocate left)."""
    FALLOC_FL_KEEP_SIZE, PUNCH_HOLE, COLLAPSE, ZERO, INSERT = 0x01, 0x02, 0x08, 0x10, 0x20
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def falloc(fd: int, mode: int, off: int, n: int) -> None:
        if libc.fallocate(fd, mode, ctypes.c_int64(off), ctypes.c_int64(n)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def script(root: Path) -> bytes:
        p = root / name
        p.parent.mkdir(exist_ok=True)
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(fd, bytes(range(256)) * 256, 0)  # 64 KiB
        falloc(fd, 0, 60_000, 20_000)  # grows to 80,000
        falloc(fd, FALLOC_FL_KEEP_SIZE, 80_000, 50_000)  # size stays
        falloc(fd, PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192)
        falloc(fd, ZERO, 20_000, 3_000)
        with pytest.raises(OSError) as bad:
            falloc(fd, ZERO | PUNCH_HOLE, 1, 3)  # an invalid combination: EINVAL, nothing changes
        assert bad.value.errno in (errno.EINVAL, errno.EOPNOTSUPP)
        if root.name != "native":
            # the FUSE kernel module forwards KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE only: COLLAPSE and
            # INSERT_RANGE are refused before the daemon sees them (docs/design.md), the file unchanged
            for mode in (COLLAPSE, INSERT):
                with pytest.raises(OSError) as bad:
                    falloc(fd, mode, 4096, 4096)
                assert bad.value.errno == errno.EOPNOTSUPP
        os.fsync(fd)
        falloc(fd, PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)  # after the fsync (a passthrough writer)
        size = os.fstat(fd).st_size
        mine = os.pread(fd, size + 10, 0)
        os.close(fd)
        assert p.read_bytes() == mine
        return mine

    native = tmp_path / "native"
    native.mkdir()
    want = script(native)
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        assert script(d) == want
    assert (d / name).read_bytes() == want
    r = _offline_verify(d)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.portable
def test_paths_longer_than_path_max_from_the_mount_root(tmp_path: Path) -> None:
    """A process working in a deep subdirectory uses paths that natively only need to fit PATH_MAX
    from its cwd; from the mount root they are longer (pjdfstest's */03.t in a subdirectory was
    ENAMETOOLONG): every namespace and data call works there, as natively."""
    d = tmp_path / "ckpts"
    d.mkdir()

    def work(root: Path) -> list:
        here = os.getcwd()
        try:
            os.chdir(root)
            for i in range(24):  # 24 x 201 bytes below the root: ~4.8 KiB, past PATH_MAX (4096)
                name = f"{i:02d}" + "d" * 199
                os.mkdir(name)
                os.chdir(name)
            Path("model.pt").write_bytes(b"\0" * 10)
            with open("a.txt", "w") as f:
                f.write("hello")
            os.rename("a.txt", "b.txt")
            os.symlink("b.txt", "l")
            os.link("b.txt", "h.txt")
            os.chmod("b.txt", 0o600)
            os.utime("b.txt", ns=(10**18, 10**18))
            os.setxattr("b.txt", "user.k", b"v")
            out = [sorted(os.listdir(".")), Path("b.txt").read_text(), os.readlink("l"),
                   os.stat("b.txt").st_mode & 0o777, os.stat("h.txt").st_nlink, os.getxattr("b.txt", "user.k"),
                   os.stat("b.txt").st_mtime_ns]
            os.unlink("h.txt")
            os.unlink("l")
            os.mkdir("sub")
            os.rmdir("sub")
            out.append(sorted(os.listdir(".")))
            return out
        finally:
            os.chdir(here)

    native = tmp_path / "native"
    native.mkdir()
    want = work(native)
    with Mount(d).start():
        assert work(d) == want


def test_inode_flags_read_as_on_the_backing_file(tmp_path: Path) -> None:
    """``lsattr`` (FS_IOC_GETFLAGS) and FS_IOC_FSGETXATTR through the mount answer what the backing
    file's own ioctl does (they were ENOTTY); other ioctls stay ENOTTY.  Native transport: libfuse's
    high-level API (mfusepy) has no ioctl here."""
    import fcntl
    import struct

    d = tmp_path / "ckpts"
    d.mkdir()
    (d / "model.pt").write_bytes(b"\0" * 100)
    (d / "sub").mkdir()
    want = {}
    for name in ("model.pt", "sub"):
        fd = os.open(d / name, os.O_RDONLY)
        try:
            want[name] = (fcntl.ioctl(fd, 0x80086601, b"\0" * 4), fcntl.ioctl(fd, 0x801C581F, b"\0" * 28))
        finally:
            os.close(fd)
    with Mount(d).start():
        for name in ("model.pt", "sub"):
            fd = os.open(d / name, os.O_RDONLY)
            try:
                got = (fcntl.ioctl(fd, 0x80086601, b"\0" * 4), fcntl.ioctl(fd, 0x801C581F, b"\0" * 28))
                assert got == want[name], name
                assert struct.unpack("<I", got[0])[0] & 0x80000  # ext4's extents flag, as lsattr shows 'e'
            finally:
                os.close(fd)
        r = subprocess.run(["lsattr", str(d / "model.pt")], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.split()[0].count("e") == 1, r.stdout + r.stderr


def _renameat2(a: Path, b: Path, flags: int) -> None:
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.renameat2(-100, str(a).encode(), -100, str(b).encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@pytest.mark.portable
def test_rename_exchange_swaps_files_and_trees(tmp_path: Path) -> None:
    """``renameat2(RENAME_EXCHANGE)`` (was EINVAL): files, a file with a directory, checkpoint files
    with their records; the result verifies offline and survives a remount.  RENAME_NOREPLACE is
    EEXIST over an existing name, as natively."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        (d / "a.txt").write_text("A")
        (d / "b.txt").write_text("B")
        (d / "step_1").mkdir()
        (d / "step_1" / "model.pt").write_bytes(b"\0" * 64)
        (d / "dir").mkdir()
        (d / "dir" / "x").write_text("X")
        _renameat2(d / "a.txt", d / "b.txt", 2)
        assert (d / "a.txt").read_text() == "B" and (d / "b.txt").read_text() == "A"
        _renameat2(d / "a.txt", d / "dir", 2)  # a file and a directory swap too
        assert (d / "dir").read_text() == "B" and (d / "a.txt" / "x").read_text() == "X"
        ino = os.stat(d / "step_1" / "model.pt").st_ino
        _renameat2(d / "step_1" / "model.pt", d / "b.txt", 2)
        assert os.stat(d / "b.txt").st_ino == ino and (d / "step_1" / "model.pt").read_text() == "A"
        assert os.getxattr(d / "b.txt", "user.ckptfs.status") == b"committed"
        with pytest.raises(FileNotFoundError):
            _renameat2(d / "nothing", d / "b.txt", 2)
        with pytest.raises(FileExistsError):
            _renameat2(d / "dir", d / "b.txt", 1)
    r = _offline_verify(d)
    assert r.returncode == 0, r.stdout + r.stderr
    with Mount(d).start():
        assert (d / "dir").read_text() == "B" and (d / "a.txt" / "x").read_text() == "X"
        assert (d / "b.txt").read_bytes() == b"\0" * 64 and (d / "step_1" / "model.pt").read_text() == "A"
