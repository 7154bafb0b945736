"""The single backing-store interface.

Every byte ckptfs reads or writes in the backing directory, and every fsync,
rename and directory change, goes through a :class:`BackingStore`.  This is the
seam for recording operation sequences (power-loss model checking) and for
fault injection (EIO / ENOSPC on the Nth call).

Paths are relative to the backing root ("" or "." is the root itself) and never
start with "/".  :class:`OsBackingStore` resolves them against a directory file
descriptor opened *before* the FUSE mount covers the directory, so an in-place
mount still reaches the files underneath it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from typing import Any, Protocol

IS_DARWIN = sys.platform == "darwin"


def _libc(name: str, argtypes: list) -> Any:  # type: ignore[type-arg]
    """libc's function ``name`` with ``argtypes`` (C int result, errno kept); None off Linux or where
    this libc lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        f = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True), name)
    except (OSError, AttributeError):
        return None
    f.argtypes = argtypes
    f.restype = ctypes.c_int
    return f


_sync_file_range = _libc("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
# fallocate(2) with its mode (os.posix_fallocate has none); renameat2(2) for RENAME_EXCHANGE
_fallocate = _libc("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64])
_renameat2 = _libc("renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint])
RENAME_EXCHANGE = 2


def _rel(path: str) -> str:
    return path if path else "."


def durable_sync(fd: int) -> None:
    """Flush fd's data and metadata to stable storage.

    On Darwin plain fsync() leaves data in the drive cache; F_FULLFSYNC is
    required to survive power loss (falls back to fsync where unsupported).
    """
    if IS_DARWIN:
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined]
            return
        except OSError:
            pass
    os.fsync(fd)


class BackingStore(Protocol):
    """Operations on the backing directory.  All raise OSError on failure.

    ``bypassable``: whether the kernel may read and write a file's bytes without this interface
    (FUSE passthrough).  False for a store that must see every byte (fault injection, the model
    checker's recording store): with it every read and write goes through the daemon."""

    bypassable: bool

    def open(self, path: str, flags: int, mode: int = 0o644) -> int: ...
    def close(self, fd: int) -> None: ...
    def dup(self, fd: int) -> int: ...
    def pread(self, fd: int, size: int, offset: int) -> bytes: ...
    def preadinto(self, fd: int, buf: memoryview, offset: int) -> int: ...
    def pwrite(self, fd: int, data: bytes, offset: int) -> int: ...
    def ftruncate(self, fd: int, length: int) -> None: ...
    def fallocate(self, fd: int, mode: int, offset: int, length: int) -> None: ...
    def fsync(self, fd: int) -> None: ...
    def fdatasync(self, fd: int) -> None: ...
    def fstat(self, fd: int) -> os.stat_result: ...
    def writeback_hint(self, fd: int, offset: int, length: int) -> None: ...
    def readahead_hint(self, fd: int) -> None: ...
    def copy_range(self, src_fd: int, dst_fd: int, length: int) -> None: ...
    def lstat(self, path: str) -> os.stat_result: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def scandir(self, path: str) -> list[tuple[str, int, int]]: ...
    def mkdir(self, path: str, mode: int = 0o755) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def exchange(self, a: str, b: str) -> None: ...
    def link(self, src: str, dst: str) -> None: ...
    def symlink(self, target: str, path: str) -> None: ...
    def mknod(self, path: str, mode: int, dev: int = 0) -> None: ...
    def fchown(self, fd: int, uid: int, gid: int) -> None: ...
    def fchmod(self, fd: int, mode: int) -> None: ...
    def readlink(self, path: str) -> str: ...
    def fsync_dir(self, path: str) -> None: ...
    def chmod(self, path: str, mode: int) -> None: ...
    def chown(self, path: str, uid: int, gid: int) -> None: ...
    def utime(self, path: str, ns: tuple[int, int] | None) -> None: ...
    def statvfs(self) -> os.statvfs_result: ...
    def getxattr(self, path: str, name: str) -> bytes: ...
    def setxattr(self, path: str, name: str, value: bytes, flags: int) -> None: ...
    def listxattr(self, path: str) -> list[str]: ...
    def removexattr(self, path: str, name: str) -> None: ...
    def flistxattr(self, fd: int) -> list[str]: ...
    def fgetxattr(self, fd: int, name: str) -> bytes: ...
    def fsetxattr(self, fd: int, name: str, value: bytes) -> None: ...


LONG_PATH = 3000  # bytes: a longer path is resolved a few directories at a time (``OsBackingStore._at``)


class OsBackingStore:
    """BackingStore over a real directory, all calls relative to ``root_fd``.

    A path relative to the root may be longer than PATH_MAX even where every path the application
    used was not (it works in a deep subdirectory of the mount, relative to its own cwd): such a
    path is resolved through directory fds opened a chunk of at most :data:`LONG_PATH` bytes at a
    time, and the call made relative to the last one (``_at``), so the mount takes every path a
    native directory takes (issue 24: pjdfstest's ``*/03.t`` in a subdirectory)."""

    bypassable = True

    def _at(self, path: str) -> tuple[int, str, bool]:
        """(directory fd, name relative to it, whether the caller closes the fd) for ``path``."""
        if len(path) < LONG_PATH // 4 or len(path.encode("utf-8", "surrogateescape")) < LONG_PATH:
            return self.root_fd, _rel(path), False
        parts = path.split("/")
        fd, owned, chunk = self.root_fd, False, ""
        try:
            for comp in parts[:-1]:
                if chunk and len((chunk + "/" + comp).encode("utf-8", "surrogateescape")) >= LONG_PATH:
                    nfd = os.open(chunk, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                    if owned:
                        os.close(fd)
                    fd, owned, chunk = nfd, True, ""
                chunk = f"{chunk}/{comp}" if chunk else comp
            name = f"{chunk}/{parts[-1]}" if chunk else parts[-1]
        except BaseException:
            if owned:
                os.close(fd)
            raise
        return fd, name, owned

    def __init__(self, root: str | int) -> None:
        if isinstance(root, int):
            self.root_fd = root
        else:
            self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.root_path = root if isinstance(root, str) else f"<fd {root}>"
        self._proc_xattrs = sys.platform.startswith("linux") and os.path.isdir(f"/proc/self/fd/{self.root_fd}")

    def shutdown(self) -> None:
        os.close(self.root_fd)

    # -- file data ---------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        d, rel, own = self._at(path)
        try:
            return os.open(rel, flags | os.O_CLOEXEC, mode, dir_fd=d)
        finally:
            if own:
                os.close(d)

    def close(self, fd: int) -> None:
        os.close(fd)

    def dup(self, fd: int) -> int:
        """Another fd on the open file ``fd`` (its own life time; all I/O here is positional)."""
        return os.dup(fd)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def preadinto(self, fd: int, buf: memoryview, offset: int) -> int:
        """pread into ``buf`` (no intermediate bytes object); the count read."""
        return os.preadv(fd, [buf], offset)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        view = memoryview(data)
        done = 0
        while done < len(view):
            n = os.pwrite(fd, view[done:], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            done += n
        return done

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fallocate(self, fd: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) with ``mode`` (preallocate, keep size, punch hole, zero, collapse, insert
        range), as the backing filesystem supports it; EOPNOTSUPP where it has no such call."""
        if _fallocate is None:
            if mode:
                raise OSError(errno.EOPNOTSUPP, "fallocate modes need Linux")
            os.posix_fallocate(fd, offset, length)
            return

        if _fallocate(fd, mode, offset, length) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def fsync(self, fd: int) -> None:
        durable_sync(fd)

    def fdatasync(self, fd: int) -> None:
        if IS_DARWIN or not hasattr(os, "fdatasync"):
            durable_sync(fd)
        else:
            os.fdatasync(fd)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def readahead_hint(self, fd: int) -> None:
        """The file will be read sequentially (larger kernel readahead); a hint, errors ignored."""
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass

    def writeback_hint(self, fd: int, offset: int, length: int) -> None:
        """Start (not wait for) writeback of a written range: a hint that changes
        no state and guarantees nothing; it only leaves less for the later fsync.
        Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere a no-op."""
        if _sync_file_range is not None:
            _sync_file_range(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; errors ignored

    def copy_range(self, src_fd: int, dst_fd: int, length: int) -> None:
        """Copy ``length`` bytes from offset 0 of src to offset 0 of dst."""
        off = 0
        use_cfr = hasattr(os, "copy_file_range")
        while off < length:
            n = 0
            if use_cfr:
                try:
                    n = os.copy_file_range(src_fd, dst_fd, length - off, off, off)
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    use_cfr = False
                    continue
            else:
                buf = os.pread(src_fd, min(1 << 20, length - off), off)
                if buf:
                    n = self.pwrite(dst_fd, buf, off)
            if n == 0:
                break
            off += n

    # -- namespace ---------------------------------------------------------
    def lstat(self, path: str) -> os.stat_result:
        d, rel, own = self._at(path)
        try:
            return os.stat(rel, dir_fd=d, follow_symlinks=False)
        finally:
            if own:
                os.close(d)

    def exists(self, path: str) -> bool:
        try:
            self.lstat(path)
            return True
        except FileNotFoundError:
            return False

    def listdir(self, path: str) -> list[str]:
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def scandir(self, path: str) -> list[tuple[str, int, int]]:
        """(name, inode number, file type bits of st_mode) of each entry, from one getdents pass."""
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        out = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_symlink():
                        t = 0o120000
                    elif e.is_dir(follow_symlinks=False):
                        t = 0o040000
                    elif e.is_file(follow_symlinks=False):
                        t = 0o100000
                    else:
                        try:
                            t = e.stat(follow_symlinks=False).st_mode & 0o170000
                        except OSError:
                            t = 0
                    out.append((e.name, e.inode(), t))
        finally:
            os.close(fd)
        return out

    def _one(self, path: str, fn, *args, **kw):  # type: ignore[no-untyped-def]
        """``fn(name, *args, dir_fd=fd, **kw)`` with ``path`` resolved by :meth:`_at`."""
        d, rel, own = self._at(path)
        try:
            return fn(rel, *args, dir_fd=d, **kw)
        finally:
            if own:
                os.close(d)

    def _two(self, src: str, dst: str, fn, **kw):  # type: ignore[no-untyped-def]
        d1, r1, o1 = self._at(src)
        try:
            d2, r2, o2 = self._at(dst)
            try:
                return fn(r1, r2, src_dir_fd=d1, dst_dir_fd=d2, **kw)
            finally:
                if o2:
                    os.close(d2)
        finally:
            if o1:
                os.close(d1)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self._one(path, os.mkdir, mode)

    def rmdir(self, path: str) -> None:
        self._one(path, os.rmdir)

    def unlink(self, path: str) -> None:
        self._one(path, os.unlink)

    def rename(self, src: str, dst: str) -> None:
        self._two(src, dst, os.rename)

    def exchange(self, a: str, b: str) -> None:
        """``renameat2(a, b, RENAME_EXCHANGE)``: both names swap their files atomically."""
        if _renameat2 is None:
            raise OSError(errno.EINVAL, "RENAME_EXCHANGE needs Linux")

        def call(r1: str, r2: str, src_dir_fd: int, dst_dir_fd: int) -> None:
            enc = "utf-8"
            if _renameat2(src_dir_fd, r1.encode(enc, "surrogateescape"), dst_dir_fd,
                          r2.encode(enc, "surrogateescape"), RENAME_EXCHANGE) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))

        self._two(a, b, call)

    def link(self, src: str, dst: str) -> None:
        """Hard link (kept generations, generations.py)."""
        self._two(src, dst, os.link, follow_symlinks=False)

    def symlink(self, target: str, path: str) -> None:
        d, rel, own = self._at(path)
        try:
            os.symlink(target, rel, dir_fd=d)
        finally:
            if own:
                os.close(d)

    def mknod(self, path: str, mode: int, dev: int = 0) -> None:
        """A fifo, socket or device node (mode carries the type bits)."""
        self._one(path, os.mknod, mode, dev)

    def readlink(self, path: str) -> str:
        return self._one(path, os.readlink)

    def fsync_dir(self, path: str) -> None:
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            durable_sync(fd)
        finally:
            os.close(fd)

    def chmod(self, path: str, mode: int) -> None:
        self._one(path, os.chmod, mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        self._one(path, os.chown, uid, gid, follow_symlinks=False)

    def fchown(self, fd: int, uid: int, gid: int) -> None:
        os.fchown(fd, uid, gid)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def utime(self, path: str, ns: tuple[int, int] | None) -> None:
        if ns is None:
            self._one(path, os.utime, follow_symlinks=False)
        else:
            self._one(path, os.utime, ns=ns, follow_symlinks=False)

    def statvfs(self) -> os.statvfs_result:
        return os.fstatvfs(self.root_fd)

    # -- xattrs (by name through /proc on Linux; fd based elsewhere) --
    def _xattr_fd(self, path: str) -> int:
        return self.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)

    def _xattr_call(self, path: str, fn, *args):  # type: ignore[no-untyped-def]
        """Run an xattr call on ``path`` (the last component never followed).  On Linux by name
        through the root fd's /proc link, which reaches the backing directory even under an
        in-place mount: one system call (issue 27: ``ls -l`` asks two attributes of every file, and
        every create asks its directory's default ACL).  Elsewhere through an fd for files and
        directories; what cannot be opened safely there (symlinks, sockets, fifos, devices) is
        unsupported."""
        if not self._proc_xattrs:
            try:
                st = self.lstat(path)
            except OSError:
                st = None
            if st is None or (st.st_mode & 0o170000) in (0o100000, 0o040000):
                fd = self._xattr_fd(path)
                try:
                    return fn(fd, *args)
                finally:
                    os.close(fd)
            raise OSError(errno.ENOTSUP, "xattrs on special files unsupported here")
        d, rel, own = self._at(path)
        try:
            return fn(f"/proc/self/fd/{d}/{rel}", *args, follow_symlinks=False)
        finally:
            if own:
                os.close(d)

    def getxattr(self, path: str, name: str) -> bytes:
        if not hasattr(os, "getxattr"):
            raise OSError(errno.ENOTSUP, "xattrs unsupported")
        return self._xattr_call(path, os.getxattr, name)

    def setxattr(self, path: str, name: str, value: bytes, flags: int) -> None:
        if not hasattr(os, "setxattr"):
            raise OSError(errno.ENOTSUP, "xattrs unsupported")
        self._xattr_call(path, os.setxattr, name, value, flags)

    def listxattr(self, path: str) -> list[str]:
        if not hasattr(os, "listxattr"):
            return []
        return self._xattr_call(path, os.listxattr)

    def removexattr(self, path: str, name: str) -> None:
        if not hasattr(os, "removexattr"):
            raise OSError(errno.ENOTSUP, "xattrs unsupported")
        self._xattr_call(path, os.removexattr, name)

    def flistxattr(self, fd: int) -> list[str]:
        return os.listxattr(fd) if hasattr(os, "listxattr") else []

    def fgetxattr(self, fd: int, name: str) -> bytes:
        return os.getxattr(fd, name)

    def fsetxattr(self, fd: int, name: str, value: bytes) -> None:
        os.setxattr(fd, name, value)
