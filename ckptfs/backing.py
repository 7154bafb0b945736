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

import errno
import os
import sys
from typing import Protocol

IS_DARWIN = sys.platform == "darwin"


def _load_sync_file_range():  # type: ignore[no-untyped-def]
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        f = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    f.restype = ctypes.c_int
    return f


_sync_file_range = _load_sync_file_range()


def _load_fallocate():  # type: ignore[no-untyped-def]
    """libc's fallocate(2) with its mode (os.posix_fallocate has none); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        f = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    f.restype = ctypes.c_int
    return f


_fallocate = _load_fallocate()


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


class OsBackingStore:
    """BackingStore over a real directory, all calls relative to ``root_fd``."""

    bypassable = True

    def __init__(self, root: str | int) -> None:
        if isinstance(root, int):
            self.root_fd = root
        else:
            self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.root_path = root if isinstance(root, str) else f"<fd {root}>"

    def shutdown(self) -> None:
        os.close(self.root_fd)

    # -- file data ---------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(_rel(path), flags | os.O_CLOEXEC, mode, dir_fd=self.root_fd)

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
        import ctypes

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
        return os.stat(_rel(path), dir_fd=self.root_fd, follow_symlinks=False)

    def exists(self, path: str) -> bool:
        try:
            self.lstat(path)
            return True
        except FileNotFoundError:
            return False

    def listdir(self, path: str) -> list[str]:
        fd = os.open(_rel(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.root_fd)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def scandir(self, path: str) -> list[tuple[str, int, int]]:
        """(name, inode number, file type bits of st_mode) of each entry, from one getdents pass."""
        fd = os.open(_rel(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.root_fd)
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

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.mkdir(path, mode, dir_fd=self.root_fd)

    def rmdir(self, path: str) -> None:
        os.rmdir(path, dir_fd=self.root_fd)

    def unlink(self, path: str) -> None:
        os.unlink(path, dir_fd=self.root_fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst, src_dir_fd=self.root_fd, dst_dir_fd=self.root_fd)

    def link(self, src: str, dst: str) -> None:
        """Hard link (kept generations, generations.py)."""
        os.link(src, dst, src_dir_fd=self.root_fd, dst_dir_fd=self.root_fd, follow_symlinks=False)

    def symlink(self, target: str, path: str) -> None:
        os.symlink(target, path, dir_fd=self.root_fd)

    def mknod(self, path: str, mode: int, dev: int = 0) -> None:
        """A fifo, socket or device node (mode carries the type bits)."""
        os.mknod(path, mode, dev, dir_fd=self.root_fd)

    def readlink(self, path: str) -> str:
        return os.readlink(path, dir_fd=self.root_fd)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(_rel(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.root_fd)
        try:
            durable_sync(fd)
        finally:
            os.close(fd)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(_rel(path), mode, dir_fd=self.root_fd)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(_rel(path), uid, gid, dir_fd=self.root_fd, follow_symlinks=False)

    def fchown(self, fd: int, uid: int, gid: int) -> None:
        os.fchown(fd, uid, gid)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def utime(self, path: str, ns: tuple[int, int] | None) -> None:
        if ns is None:
            os.utime(_rel(path), dir_fd=self.root_fd, follow_symlinks=False)
        else:
            os.utime(_rel(path), ns=ns, dir_fd=self.root_fd, follow_symlinks=False)

    def statvfs(self) -> os.statvfs_result:
        return os.fstatvfs(self.root_fd)

    # -- xattrs (fd based: works under an in-place mount, no /proc needed) --
    def _xattr_fd(self, path: str) -> int:
        return os.open(_rel(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.root_fd)

    def _xattr_call(self, path: str, fn, *args):  # type: ignore[no-untyped-def]
        """Run an xattr call on ``path``: through an fd for files and directories; for what cannot be
        opened safely (symlinks, sockets, fifos, devices) by name through the root fd's /proc link,
        which reaches the backing directory even under an in-place mount."""
        try:
            st = self.lstat(path)
        except OSError:
            st = None
        if st is not None and (st.st_mode & 0o170000) not in (0o100000, 0o040000):
            if not sys.platform.startswith("linux"):
                raise OSError(errno.ENOTSUP, "xattrs on special files unsupported here")
            return fn(f"/proc/self/fd/{self.root_fd}/{_rel(path)}", *args, follow_symlinks=False)
        fd = self._xattr_fd(path)
        try:
            return fn(fd, *args)
        finally:
            os.close(fd)

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
