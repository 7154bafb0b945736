"""Thin FUSE adapter: translate mfusepy callbacks into :class:`CkptFS` calls.

All FUSE specifics live here.  No filesystem logic: each callback converts
arguments, adds the calling process (uid, gid, pid) and forwards.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys
import threading
import time
from typing import Any

from ckptfs.fs import Caller, CkptFS
from ckptfs.fuse.pagecache import PageCachePolicy
from ckptfs.fuse.readahead import READ_AHEAD_KB, _fuse_devs_at, raise_readahead

log = logging.getLogger("ckptfs.fuse")


class FuseUnavailable(Exception):
    """libfuse3 (or macFUSE) cannot be loaded; message says what to install."""


def load_mfusepy() -> Any:
    """Import mfusepy bound to libfuse3 (never libfuse2: it caps writes at 128 KiB)."""
    if sys.platform.startswith("linux") and not os.environ.get("FUSE_LIBRARY_PATH"):
        lib = ctypes.util.find_library(os.environ.get("CKPTFS_LIBFUSE3_NAME", "fuse3"))
        if not lib:
            raise FuseUnavailable(
                "libfuse3 not found: install it (Debian/Ubuntu: apt-get install fuse3 libfuse3-3; "
                "Fedora: dnf install fuse3 fuse3-libs)")
        os.environ["FUSE_LIBRARY_PATH"] = lib
    try:
        import mfusepy
    except (OSError, ImportError) as e:
        raise FuseUnavailable(f"cannot load FUSE library: {e} (Linux: apt-get install fuse3 libfuse3-3; "
                              "macOS: install macFUSE)") from e
    if sys.platform.startswith("linux") and mfusepy.fuse_version_major != 3:
        raise FuseUnavailable("mfusepy loaded libfuse2; ckptfs needs libfuse3 (apt-get install libfuse3-3)")
    return mfusepy


def make_operations(mfusepy: Any, fs: CkptFS) -> Any:
    """Build the mfusepy Operations object for ``fs``."""

    pages = PageCachePolicy(fs.served, fs.handles_at, fs.stats)  # keep_cache decisions (pagecache.py)

    def caller() -> Caller:
        uid, gid, pid = mfusepy.fuse_get_context()
        return Caller(uid, gid, pid)

    class Ops(mfusepy.Operations):
        use_ns = True

        def init_with_config(self, conn: Any, config: Any) -> None:
            if config is not None:
                # an open file that is unlinked or replaced is renamed to a hidden name by libfuse, so
                # fstat/fchmod of it still have a path; fs.CkptFS._hide keeps nothing on disk for it
                config.hard_remove = 0
                config.use_ino = 1  # st_ino from the backing file: hard links share it (git, tar, rsync -H)
                # No entry/attribute caching: the daemon changes what a path shows behind the kernel's
                # back (a dying writer's O_TRUNC version unpublished, a torn group quarantined).  A cached
                # size cut reads short (an empty `latest`, found by the resume campaign); a cached dentry
                # plus fresh attributes made O_CREAT fail with ENOENT.  Invalidating from the daemon
                # (fuse_invalidate_path) showed the same ENOENT, so nothing is cached (docs/design.md).
                config.entry_timeout = 0.0
                config.attr_timeout = 0.0
                config.negative_timeout = 0.0
            if conn is not None:
                # no FUSE_CAP_HANDLE_KILLPRIV_V2 in libfuse 3.14 (capable lacks it), so the kernel
                # keeps probing security.capability before each write (one round trip)
                log.info("FUSE connection: max_write=%s max_readahead=%s capable=%#x want=%#x",
                         conn.max_write, conn.max_readahead, conn.capable, conn.want)

        def destroy(self, path: str) -> None:
            fs.shutdown()

        def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
            return fs.getattr(path or "", fh, caller())

        def readdir(self, path: str, fh: int) -> list[Any]:
            return fs.readdir(path, caller())

        def readlink(self, path: str) -> str:
            return fs.readlink(path)

        def statfs(self, path: str) -> dict[str, int]:
            return fs.statfs()

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            flags = fi if isinstance(fi, int) else os.O_WRONLY
            fh = fs.create(path, mode, flags, caller())
            pages.decide(fh)  # a writer: the path's cached pages are no longer known clean
            return fh

        def open(self, path: str, flags: int) -> int:
            try:
                return fs.open(path, flags, caller())
            except OSError as e:
                # T6 on libfuse: its node still names the file a rename replaced, and no handle
                # holds it any more.  The kernel repeats an ESTALE open once, but libfuse may answer
                # that repeat ESTALE itself (the name's new node is renamed over too): the open is
                # served by the file now at the name, as an open just after the rename would be
                origin = fs.replaced_origin(path) if e.errno == errno.ESTALE else None
                if origin is None:
                    raise
                fs.stats["replaced_opens_redirected"] += 1
                return fs.open(origin, flags, caller())

        def open_direct_io(self, fh: int) -> bool:
            """Whether the open or create that returned ``fh`` bypasses the page cache (fs.direct_io)."""
            return fs.direct_io(fh)

        def open_keep_cache(self, fh: int) -> bool:
            """Whether the open that returned ``fh`` may keep the kernel's cached pages."""
            return pages.decide(fh)

        def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
            return fs.read(fh, size, offset)

        def read_into(self, buf: memoryview, offset: int, fh: int) -> int:
            return fs.read_into(fh, buf, offset)

        def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
            return fs.write(fh, data, offset, caller())

        def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
            fs.truncate(path or "", length, fh, caller())
            return 0

        def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
            fs.fallocate(fh, mode, offset, size, caller())
            return 0

        def flush(self, path: str | None, fh: int) -> int:
            fs.flush(fh, caller())
            return 0

        def fsync(self, path: str | None, datasync: int, fh: int) -> int:
            fs.fsync(fh, caller())
            return 0

        def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
            fs.fsyncdir(path or "")
            return 0

        def release(self, path: str | None, fh: int) -> int:
            fs.release(fh, caller())
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            fs.mkdir(path, mode, caller())
            return 0

        def rmdir(self, path: str) -> int:
            fs.rmdir(path)
            pages.forget(path)
            return 0

        def unlink(self, path: str) -> int:
            fs.unlink(path, caller())
            pages.forget(path)
            return 0

        def rename(self, old: str, new: str, flags: int = 0) -> int:
            pages.forget(old, new)  # before and after: no open in between keeps a moved node's pages
            try:
                fs.rename(old, new, flags, caller())
            finally:
                pages.forget(old, new)
            return 0

        def symlink(self, target: str, source: str) -> int:
            # mfusepy passes (link path, link target)
            fs.symlink(source, target, caller())
            return 0

        def link(self, target: str, source: str) -> int:
            # mfusepy passes (new name, existing file)
            fs.link(source, target, caller())
            return 0

        def mknod(self, path: str, mode: int, dev: int) -> int:
            fs.mknod(path, mode, dev, caller())
            return 0

        def chmod(self, path: str, mode: int) -> int:
            fs.chmod(path, mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            fs.chown(path, uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int | None, int | None] | None = None) -> int:
            fs.utimens(path, times)
            return 0

        def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
            return fs.getxattr(path, name, caller())

        def listxattr(self, path: str) -> list[str]:
            return fs.listxattr(path)

        def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
            fs.setxattr(path, name, value, options, caller())
            return 0

        def removexattr(self, path: str, name: str) -> int:
            fs.removexattr(path, name)
            return 0

    return Ops()


def make_fuse_class(mfusepy: Any) -> type:
    """mfusepy.FUSE with the libfuse3 arguments it drops passed through."""

    class FUSE(mfusepy.FUSE):
        def open(self, path: bytes, fip: Any) -> int:
            """open, answering keep_cache when the kernel's pages are known identical (pagecache.py)."""
            fi = fip.contents
            fh = self.operations.open(path.decode(self.encoding, self.errors), fi.flags)
            fi.fh = fh
            fi.keep_cache = 1 if self.operations.open_keep_cache(fh) else 0
            fi.direct_io = 1 if self.operations.open_direct_io(fh) else 0
            return 0

        def create(self, path: bytes, mode: int, fip: Any) -> int:
            """create, with the open flags and the page-cache choice (direct_io) of the new handle."""
            fi = fip.contents
            fh = self.operations.create(path.decode(self.encoding, self.errors), mode, fi.flags)
            fi.fh = fh
            fi.direct_io = 1 if self.operations.open_direct_io(fh) else 0
            return 0

        def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
            """read into libfuse's reply buffer directly (mfusepy would build bytes and memmove them)."""
            view = memoryview((ctypes.c_char * size).from_address(ctypes.addressof(buf.contents))).cast("B")
            return self.operations.read_into(view, offset, fip.contents.fh)

        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            return self.operations.rename(old.decode(self.encoding, self.errors),
                                          new.decode(self.encoding, self.errors), flags)

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(
                None if path is None else path.decode(self.encoding, self.errors), length, fh)

        def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
            times = None
            if buf:
                times = (_ts(buf.contents.actime), _ts(buf.contents.modtime))
            return self.operations.utimens(None if path is None else path.decode(self.encoding, self.errors), times)

    return FUSE


UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


def _ts(ts: Any) -> int | None:
    """Nanoseconds of a timespec; None for UTIME_OMIT, now for UTIME_NOW."""
    if ts.tv_nsec == UTIME_OMIT:
        return None
    if ts.tv_nsec == UTIME_NOW:
        return time.time_ns()
    return ts.tv_sec * 10**9 + ts.tv_nsec


def native_possible() -> bool:
    """Whether the native transport can mount here: Linux, /dev/fuse, and root or fusermount3."""
    import shutil

    return (sys.platform.startswith("linux") and os.path.exists(os.environ.get("CKPTFS_DEV_FUSE", "/dev/fuse"))
            and (os.geteuid() == 0 or shutil.which("fusermount3") is not None))


def serve(fs: CkptFS, mountpoint: str, *, allow_other: bool = False, debug: bool = False,
          transport: str = "auto", cache_timeout: float = 60.0, passthrough: bool = True) -> None:
    """Mount ``fs`` at ``mountpoint`` and serve until unmounted (foreground).

    ``transport``: ``kernel`` (ours, fuse/session.py), ``mfusepy`` (libfuse's high-level API), or
    ``auto``: ours where it can mount (:func:`native_possible`)."""
    if transport == "kernel" or (transport == "auto" and native_possible()):
        from ckptfs.fuse.session import serve_native

        log.info("transport: native /dev/fuse (cache timeout %ss, passthrough %s)", cache_timeout,
                 "wanted" if passthrough else "off")
        serve_native(fs, mountpoint, allow_other=allow_other, debug=debug, timeout=cache_timeout,
                     passthrough=passthrough)
        return
    log.info("transport: mfusepy (libfuse high-level API, no kernel caching)")
    mfusepy = load_mfusepy()
    # The kernel has applied the caller's umask to the mode of every create/mkdir/mknod it sends
    # (no FUSE_CAP_DONT_MASK); the daemon must not apply its own on top (open 0620 -> 0600).
    os.umask(0)
    logging.getLogger("mfusepy").setLevel(logging.DEBUG if debug else logging.ERROR)
    fuse_cls = make_fuse_class(mfusepy)
    opts: dict[str, Any] = {
        "foreground": True,
        "nothreads": False,
        "fsname": f"ckptfs:{fs.backing_label}"[:200],
        "subtype": "ckptfs",
        "default_permissions": True,
    }
    if allow_other:
        opts["allow_other"] = True
    if debug:
        opts["debug"] = True
    ra_kb = int(os.environ.get("CKPTFS_READ_AHEAD_KB", READ_AHEAD_KB))
    if ra_kb > 0 and sys.platform.startswith("linux"):
        target = os.path.realpath(mountpoint)  # before mounting: no request to our own mount
        threading.Thread(target=raise_readahead, args=(target, _fuse_devs_at(target), ra_kb),
                         name="ckptfs-readahead", daemon=True).start()
    try:
        fuse_cls(make_operations(mfusepy, fs), mountpoint, **opts)
    except RuntimeError as e:
        # libfuse3 returns non-zero from fuse_main when SIGINT/SIGTERM/SIGHUP
        # ended the loop; it has unmounted and called destroy by then.
        if fs.shut_down:
            log.info("stopped by signal (fuse_main returned %s)", e)
            return
        raise
