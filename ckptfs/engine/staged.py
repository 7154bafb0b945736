"""Staged versions and open-file handles (in-memory state of the write path), and :class:`Staging`,
which makes new versions and changes their bytes.

A :class:`Version` is one shadow copy in ``.ckptfs/staging``: the bytes a path
will hold once committed.  Life cycle::

    open --(flush/fsync: checks pass)--> committing/queued --> installed
      \\--(release while still dirty and doomed, or unlinked)--> discarded

Invariant: a version's staging file is written only while ``state == "open"``;
once it leaves ``open`` its bytes are frozen (a later write through the same
handle first clones it into a new version: copy-on-write).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptfs import acl, procinfo
from ckptfs.backing import BackingStore
from ckptfs.engine.pool import StagingPool
from ckptfs.inodes import InodeMap
from ckptfs.layout import STAGING, parent
from ckptfs.records import FileRecord
from ckptfs.streamhash import AsyncDigest
from ckptfs.xattrs import PREFIX

log = logging.getLogger("ckptfs")

# Version states (the life cycle above)
OPEN = "open"  # being written; the only state in which its staging file changes
QUEUED = "queued"  # sealed, waiting for the async committer
COMMITTING = "committing"  # sealed, being installed
INSTALLED = "installed"  # renamed over its path: it is the committed version
DISCARDED = "discarded"  # never installed; its staging file is gone


@dataclass(eq=False)
class Version:
    path: str
    staging: str
    fd: int
    digest: AsyncDigest = field(default_factory=AsyncDigest)  # hashed off the request path
    size: int = 0
    dirty: bool = True
    state: str = OPEN  # OPEN | QUEUED | COMMITTING | INSTALLED | DISCARDED
    refs: int = 0  # handles referencing this version
    writers: int = 0  # write handles referencing this version
    doomed: str | None = None  # reason it must never commit (writer killed...)
    doomed_errno: int | None = None  # errno of the failed write that doomed it (close reports it)
    unlinked: bool = False
    error: OSError | None = None  # async commit failure
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    record: FileRecord | None = None
    ino: int = 0  # backing inode number of the staging file (inodes.InodeMap)
    # who may see it and what a killed writer leaves (engine/visibility.py, V1 and V2)
    writer_pids: set[int] = field(default_factory=set)  # callers (thread ids) that opened it for writing
    sees: set[int] = field(default_factory=set)  # other callers found to be its writers' threads or descendants
    appending: bool = False  # opened with O_APPEND: a log, never isolated from readers
    base: int = 0  # size of the committed bytes it started from (0: a new or truncated file)
    extends: bool = True  # only extends those bytes: no write below ``base``, no truncate below it
    # written by the kernel straight into its staging file (FUSE passthrough, CkptFS.bypass): the
    # daemon sees none of those writes, so its digest is computed at seal, and a write that reaches
    # the file after the seal is found by ``sealed_key`` (size, mtime) and sealed again (W2)
    bypassed: bool = False
    sealed_key: tuple = ()
    shows_ino: int = 0  # bypassed: the backing inode whose path shows its bytes once installed
    hinted: int = 0  # bypassed: bytes from offset 0 whose writeback was started (the facade's pacer)
    seal_seconds: float = 0.0  # how long its seal took (hashing, format check): part of its commit time
    # async mode (C4, engine/commit.py): the sealed file's stat whose digest the committer computes
    # before the install (the close returned after the format check); None: the record is made
    digest_due: os.stat_result | None = None
    keep_prev: bool = True  # False: the file it replaces is no generation to keep (written in place, W2)
    # made by a write through an open that neither created nor truncated the file (copy-on-write of
    # the committed file, ``CkptFS._writable_version``) and not emptied since: an in-place change,
    # which every process sees as natively (never isolated, V1), read-only handles of the file
    # included (issue 24); a truncate to 0 makes it a rewrite like an O_TRUNC one
    in_place: bool = False


@dataclass(eq=False)
class Handle:
    path: str
    writable: bool
    fd: int | None = None  # backing fd of the committed file (reads before first write)
    version: Version | None = None
    appending: bool = False  # opened with O_APPEND (engine/visibility.py)
    pid: int = 0  # the caller that opened it
    direct: bool = False  # bypasses the kernel page cache (fs.CkptFS.direct_io)
    published: bool = False  # this open made ``version`` (a create, an O_TRUNC): CkptFS.abandon undoes it
    retired: list[int] = field(default_factory=list)  # fds it read before (CkptFS._follow_in_place), closed at release
    retired_versions: list[Version] = field(default_factory=list)  # versions it read before: unref'd at release
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Caller:
    """Who made a request (the FUSE request's uid, gid and pid)."""

    uid: int = 0
    gid: int = 0
    pid: int = 0


NOBODY = Caller()  # a request from the daemon itself (tests, control verbs): no owner rules apply


class Staging:
    """Makes and changes staged versions: the shadow copies in ``.ckptfs/staging``.

    Explicit dependencies: the store, ``inodes`` (a new version of a file keeps its st_ino), the
    facade's ``lock`` and a ``visible(path)`` lookup (the version readers see), and ``unpublish(v)``
    (engine/commit.py: a poisoned version stops being visible).  Invariants: a new version of an
    existing file gets that file's owner, group, mode and xattrs (transparency); a version's bytes
    change only through :meth:`change`, only while it is OPEN (see the module doc)."""

    def __init__(self, store: BackingStore, inodes: InodeMap, lock: threading.RLock,
                 visible: Callable[[str], Version | None], unpublish: Callable[[Version], None],
                 unref: Callable[[Version], None]) -> None:
        self.store = store
        self.inodes = inodes
        self.lock = lock
        self.visible = visible
        self.unpublish = unpublish
        self.unref = unref  # drop a reference taken under lock (the facade closes a finished version's fd)
        self.as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self.pool: StagingPool | None = None  # set by the facade (engine/pool.py); None: create each file

    def staging_name(self) -> str:
        return f"{STAGING}/{uuid.uuid4().hex}"

    def _pooled(self) -> tuple[str, int] | None:
        """(staging name, fd) of an empty file made ahead in ``staging/`` (engine/pool.py), dated
        now (it was made earlier: a new file's times are its creation's); None where the pool has
        none."""
        got = self.pool.take() if self.pool is not None else None
        if got is None:
            return None
        name, fd = got
        try:
            self.store.utime(name, None)
        except OSError as e:  # never leave ``name`` behind: the caller creates it with O_EXCL
            log.debug("staging pool: %s: %s", name, e)
            self.store.close(fd)
            with contextlib.suppress(OSError):
                self.store.unlink(name)
            return None
        return name, fd

    def new_owner(self, path: str, caller: Caller) -> tuple[int, int]:
        """Owner of a new file, directory, node or link at ``path``, as the kernel gives it natively:
        the caller's uid, and the caller's gid unless the parent directory is setgid (then its gid)."""
        gid = caller.gid
        try:
            pst = self.store.lstat(parent(path))
            if pst.st_mode & stat.S_ISGID:
                gid = pst.st_gid
        except OSError:
            pass
        return caller.uid, gid

    def default_acl(self, directory: str) -> bytes | None:
        """The default ACL value of ``directory`` on the backing store, None where it has none (or
        the backing filesystem keeps no ACLs)."""
        try:
            return self.store.getxattr(directory, acl.DEFAULT)
        except OSError:
            return None

    def new_version(self, path: str, mode: int, caller: Caller, src: Version | None = None,
                     src_fd: int | None = None, like: os.stat_result | None = None,
                     xattrs_from: int | None = None, umask: int | None = None) -> Version:
        """Create a staged version of ``path``; cloned from src/src_fd if given.

        Invariant (transparency): a new version of an existing file (``like``: the stat of the
        version it replaces) gets that file's owner, group, mode and extended attributes
        (``xattrs_from``: an open fd of it), so a rewrite through the mount changes
        the bytes only, as an in-place write does natively.  A new file gets the mode and access
        ACL a native create in its directory gives (``acl.create_mode``: the directory's default
        ACL masked by the requested mode, or else the requested mode less ``umask``; ``umask``
        None: the kernel applied it already) and the owner :meth:`new_owner` gives."""
        got = self._pooled()
        if got is not None:
            name, fd = got
        else:
            name = self.staging_name()
            fd = self.store.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        v = Version(path=path, staging=name, fd=fd)
        try:
            v.ino = self.store.fstat(fd).st_ino
            if like is not None:
                self.inodes.carry(v.ino, like.st_ino, like.st_nlink)  # same st_ino as the file it replaces
            if like is not None:
                uid, gid, perm = like.st_uid, like.st_gid, stat.S_IMODE(like.st_mode)
                access = None  # its ACL is among the attributes copied from it
            else:
                uid, gid = self.new_owner(path, caller)
                perm, access = acl.create_mode(self.default_acl(parent(path)), stat.S_IMODE(mode), umask)
                if perm & stat.S_ISGID and caller.uid != 0 and caller is not NOBODY \
                        and gid != caller.gid and gid not in procinfo.groups(caller.pid):
                    perm &= ~stat.S_ISGID  # as the VFS does for a non-member (kernels before 6.0 leave it to us)
            if self.as_root:
                self.store.fchown(fd, uid, gid)
            else:
                try:
                    self.store.fchown(fd, -1, gid)  # the group at least, where the daemon's user may
                except OSError:
                    pass
            self.store.fchmod(fd, perm)  # after the chown, which clears setuid/setgid
            if access is not None:
                self.store.fsetxattr(fd, acl.ACCESS, access)  # inherited (the mode's bits agree with it)
            if xattrs_from is not None:
                self.copy_xattrs(xattrs_from, fd)
            if src is not None:
                self.store.copy_range(src.fd, fd, src.size)
                v.size = v.base = src.size
                v.digest = src.digest.copy()
            elif src_fd is not None:
                size = self.store.fstat(src_fd).st_size
                self.store.copy_range(src_fd, fd, size)
                v.size = v.base = size
                v.digest.stale = size > 0
            else:  # empty: extends nothing only if it replaces bytes (O_TRUNC of a non-empty file)
                v.extends = like is None or like.st_size == 0
        except OSError:
            self.drop_staging(v)
            raise
        return v

    def copy_xattrs(self, src: int, dst: int) -> None:
        """Copy every extended attribute (user.*, ACLs, security labels) of the open file ``src`` to
        ``dst``, except ``security.capability``: natively any write drops it, and a rewrite through
        the mount is a write."""
        try:
            names = self.store.flistxattr(src)
        except OSError:
            return
        for n in names:
            if n == "security.capability" or n.startswith(PREFIX):
                continue
            try:
                self.store.fsetxattr(dst, n, self.store.fgetxattr(src, n))
            except OSError as e:
                if e.errno in (errno.EIO, errno.ENOSPC, errno.EDQUOT):
                    raise  # the disk failed: the caller must hear it
                log.debug("xattr %s not copied to the new version: %s", n, e)  # (not permitted, unsupported)

    def drop_staging(self, v: Version) -> None:
        """Remove a version that was never published (its inode number mapping goes too)."""
        if v.ino:
            self.inodes.drop(v.ino)
        try:
            self.store.close(v.fd)
        except OSError:
            pass
        try:
            self.store.unlink(v.staging)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove staging %s: %s", v.staging, e)

    def existing_attrs(self, path: str) -> tuple[os.stat_result | None, int | None, Callable[[], None]]:
        """(stat, an fd to copy its xattrs from, what to call when done with that fd) of the
        version a new one of ``path`` replaces, if any.  A staged version is referenced while its
        fd is used (no release closes it, and no other file gets its number, meanwhile)."""
        with self.lock:
            v = self.visible(path)
            if v is not None and v.fd >= 0:
                v.refs += 1
            else:
                v = None
        if v is not None:
            try:
                return self.store.fstat(v.fd), v.fd, lambda: self.unref(v)
            except OSError:
                self.unref(v)
        try:
            st = self.store.lstat(path)
        except OSError:
            return None, None, _nothing
        if not stat.S_ISREG(st.st_mode):
            return None, None, _nothing
        try:
            fd = self.store.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None, None, _nothing  # replaced meanwhile; an I/O error reaches the caller
        return st, fd, lambda: self.store.close(fd)

    def new_version_like(self, path: str, mode: int, caller: Caller, umask: int | None = None) -> Version:
        """A new, empty version of ``path`` with the attributes of the version it replaces (if any)."""
        like, xfd, done = self.existing_attrs(path)
        try:
            return self.new_version(path, mode, caller, like=like, xattrs_from=xfd, umask=umask)
        finally:
            done()

    def change(self, v: Version | None, change: Callable[[Version], None], what: str) -> bool:
        """Apply ``change`` to v's staged bytes if v is still open; False if it is not.

        The one place staged bytes change (write, truncate by handle, truncate by path).  The state
        is checked under ``v.lock``, which a seal holds while it freezes the version (engine/commit.py),
        so once sealed its bytes and its record agree; a version is discarded only when no writer
        has it open.  A change that fails
        poisons v: its content is unknown, so it never commits."""
        if v is None:
            return False
        with v.lock:
            if v.state != OPEN:
                return False
            try:
                change(v)
            except OSError as e:
                self.poison(v, f"{what} failed: {e}", e.errno)
                raise
            v.dirty = True
            return True

    def truncated(self, length: int) -> Callable[[Version], None]:
        def change(v: Version) -> None:
            if length < v.base:
                v.extends = False  # committed bytes cut: all-or-nothing if its writer dies (V2)
            if length == 0:
                v.in_place = False  # emptied: a rewrite (``open(p, "r+b"); truncate(0)``), isolated (V1)
            self.store.ftruncate(v.fd, length)
            v.digest.truncated(length)
            v.size = length
        return change

    def poison(self, v: Version, reason: str, code: int | None = None) -> None:
        """A write to v failed: its content is unknown, so it must never commit."""
        if v.doomed is None:
            v.doomed = reason
            v.doomed_errno = code
        self.unpublish(v)


def _nothing() -> None:
    pass
