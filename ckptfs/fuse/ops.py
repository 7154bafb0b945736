"""The native transport's request handlers: FUSE requests (node ids, structs) -> :class:`CkptFS` calls.

No filesystem logic: each handler resolves node ids to paths (:mod:`ckptfs.fuse.nodes`), unpacks
its request struct, calls the core with the caller (uid, gid, pid of the request) and packs the
reply.  What libfuse's high-level API did for the mfusepy transport is done here the same way, so
the core sees the same calls on both transports:

* an unlinked (or renamed-over) file that is still open is renamed to ``.fuse_hidden<16 hex>``
  (libfuse's ``hard_remove=0``), and that name is unlinked at its last release;
* a regular file the kernel knows that a rename replaces keeps a read-only handle (its *keeper*,
  T7 in fuse/nodes.py) until the kernel forgets its node, so it is hidden as an open file is: an
  open whose lookup came before the rename opens the file it looked up, as natively (it was
  answered ESTALE, and a second rename before the VFS's one repeat made that reach the reader);
* a directory's entries are listed once per ``opendir`` stream (offset 0) and served from that
  list for the following READDIR requests;
* SETATTR is chmod, chown, truncate, utimens in that order, then getattr.

Kernel caching (``entry_valid`` / ``attr_valid``): ``timeout`` seconds for every answer the core
says is stable (:meth:`CkptFS.volatile` is False, a single-link file or a directory); 0 otherwise.
A stable answer changes only through a request the kernel sees or an event, and
:mod:`ckptfs.fuse.notify` invalidates on every event (C1 in docs/design.md).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptfs import procinfo
from ckptfs.engine.staged import NOBODY, Caller
from ckptfs.fs import CkptFS
from ckptfs.fuse import kernel as k
from ckptfs.fuse.nodes import Node, Nodes, join, split
from ckptfs.fuse.pagecache import PageCachePolicy

log = logging.getLogger("ckptfs.fuse")

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
KEEPERS_MAX = 4096  # T7: keeper handles at once (each an fd); past it a late open is answered ESTALE


class Reply(Exception):
    """Raised by a handler that has nothing to send (FORGET, INTERRUPT)."""


def _name(b: bytes | memoryview) -> str:
    raw = bytes(b)
    end = raw.find(b"\0")
    return (raw if end < 0 else raw[:end]).decode("utf-8", "surrogateescape")


def _names(b: bytes | memoryview) -> tuple[str, str]:
    raw = bytes(b)
    a, _, rest = raw.partition(b"\0")
    c = rest.split(b"\0", 1)[0]
    return a.decode("utf-8", "surrogateescape"), c.decode("utf-8", "surrogateescape")


def _gone(node: Node | None) -> OSError:
    """The error for a request on a node whose name went away (T2).  A name renamed over (T6: tmp +
    rename replacing ``latest`` while a reader opens it) still exists and names another file: ESTALE,
    so the VFS looks the name up again (``LOOKUP_REVAL``) and opens the file that is there now, as
    libfuse answers; an unlinked name: ENOENT, as natively."""
    if node is not None and node.replaced:
        return OSError(errno.ESTALE, "renamed over: look the name up again")
    return OSError(errno.ENOENT, "stale node")


def _enc(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


class Ops:
    """Handlers by opcode: ``handle(opcode, nodeid, caller, body) -> bytes | list[bytes]`` (the reply
    payload) or raises OSError (the reply's error) or :class:`Reply` (no reply)."""

    # requests about the node itself, reached by a path walk (not through an open handle): on a node
    # whose name was renamed over, their ENOENT becomes ESTALE (T6, ``_gone``)
    ON_NODE = frozenset({k.GETATTR, k.SETATTR, k.OPEN, k.GETXATTR, k.LISTXATTR, k.SETXATTR,
                         k.REMOVEXATTR, k.READLINK})

    def __init__(self, fs: CkptFS, timeout: float = 0.0) -> None:
        self.fs = fs
        self.nodes = Nodes()
        self.timeout = float(timeout)
        self.entry_cache = True  # False where the kernel cannot drop entries lock-free (fuse/notify.py)
        self.pages = PageCachePolicy(fs.served, fs.handles_at, fs.stats)
        self.fh_node: dict[int, Node] = {}  # open file handle -> its node (open counts, hidden names)
        self.dirs: dict[int, list[tuple[str, dict, int]] | None] = {}  # opendir handle -> listing
        self.dir_path: dict[int, str] = {}
        self._next_dh = 1
        self._hidectr = 0
        self._redirected: dict[int, int] = {}  # thread -> node id its last open was redirected from
        self.keepers = 0  # T7: keeper handles held now (at most KEEPERS_MAX)
        self.lock = threading.Lock()
        self.passthrough: Any = None  # fuse/passthrough.Passthrough once negotiated at INIT
        self.invalidate: Callable[[Node], None] = lambda n: None  # fuse/notify.Notifier.inode
        self.invalidate_now: Callable[[Node], None] = lambda n: None  # fuse/notify.Notifier.inode_now
        self.epoch_now: Callable[[], None] = lambda: None  # fuse/notify.Notifier.epoch_now
        self.table: dict[int, Callable[[Node | None, int, Caller, memoryview], Any]] = {
            k.LOOKUP: self.lookup, k.GETATTR: self.getattr, k.SETATTR: self.setattr,
            k.READLINK: self.readlink, k.SYMLINK: self.symlink, k.MKNOD: self.mknod, k.MKDIR: self.mkdir,
            k.UNLINK: self.unlink, k.RMDIR: self.rmdir, k.RENAME: self.rename, k.RENAME2: self.rename2,
            k.LINK: self.link, k.OPEN: self.open, k.READ: self.read, k.WRITE: self.write,
            k.STATFS: self.statfs, k.RELEASE: self.release, k.FSYNC: self.fsync, k.SETXATTR: self.setxattr,
            k.GETXATTR: self.getxattr, k.LISTXATTR: self.listxattr, k.REMOVEXATTR: self.removexattr,
            k.FLUSH: self.flush, k.OPENDIR: self.opendir, k.READDIR: self.readdir,
            k.RELEASEDIR: self.releasedir, k.FSYNCDIR: self.fsyncdir, k.CREATE: self.create,
            k.IOCTL: self.ioctl, k.FALLOCATE: self.fallocate, k.COPY_FILE_RANGE: self.copy_file_range,
        }

    # ------------------------------------------------------------ helpers
    def path_of(self, node: Node | None) -> str:
        if node is None or node.path is None:
            raise _gone(node)
        return node.path

    def fh_of(self, node: Node) -> int | None:
        """An open handle of ``node``, if it has one (O(open handles): for nodes whose name went)."""
        with self.lock:
            return next((fh for fh, m in self.fh_node.items() if m is node), None)

    def _own_handle(self, node: Node, c: Caller) -> int | None:
        """An open handle on ``node`` that the process of thread ``c.pid`` opened, if any."""
        me = procinfo.tgid(c.pid) if c.pid > 0 else 0
        with self.lock:
            fhs = [fh for fh, m in self.fh_node.items() if m is node]
        for fh in fhs:
            h = self.fs.handles.get(fh)
            if h is not None and h.pid > 0 and procinfo.tgid(h.pid) == me:
                return fh
        return None

    def child(self, node: Node | None, name: str) -> str:
        return join(self.path_of(node), name)

    def ttl(self, path: str, st: dict[str, Any] | None, attr: bool = True) -> float:
        """The cache timeout of an answer about ``path``: its attributes, or (``attr`` False) its
        entry (see the module docstring)."""
        if self.timeout <= 0 or self.fs.volatile(path, attr):
            return 0.0
        if st is not None and not stat.S_ISDIR(st["st_mode"]) and st.get("st_nlink", 1) > 1:
            return 0.0  # another name of this file is another node: its attributes would go stale
        return self.timeout

    def entry(self, path: str, st: dict[str, Any], reader: bool = False) -> bytes:
        n = self.nodes.reader_looked_up(path) if reader else self.nodes.looked_up(path)
        a = k.sec_nsec(0.0 if reader else self.ttl(path, st))  # a reader node is never cached (T5)
        e = k.sec_nsec(0.0 if reader else self.ttl(path, st, attr=False)) if self.entry_cache else (0, 0)
        if e != (0, 0):
            n.entry_cached = True
        return k.ENTRY_OUT.pack(n.nid, 0, e[0], a[0], e[1], a[1], *k.pack_attr(st))

    def attr(self, path: str, st: dict[str, Any], reader: bool = False) -> bytes:
        t = k.sec_nsec(0.0 if reader else self.ttl(path, st))
        return k.ATTR_OUT.pack(t[0], t[1], 0, *k.pack_attr(st))

    # ------------------------------------------------------------ names
    def lookup(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        path = self.child(node, _name(body))
        try:
            st = self.fs.getattr(path, None, c)
        except OSError as e:
            if e.errno == errno.ENOENT and self.timeout > 0 and self.entry_cache and not self.fs.volatile(path):
                # a negative entry: cached until an event names the path (a publish, a restore)
                t = k.sec_nsec(self.timeout)
                return k.ENTRY_OUT.pack(0, 0, t[0], 0, t[1], 0, *k.pack_attr({}))
            raise
        if self.fs.isolated(path, c):
            self.fs.stats["reader_node_lookups"] += 1
            return self.entry(path, st, reader=True)  # T5: not the writer's kernel inode
        if path in self.nodes.readers and not self.fs.rewriting(path):
            self.nodes.drop_reader(path)
        return self.entry(path, st)

    def getattr(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        if node is None:
            return self._getattr(node, c, body)
        for _ in range(8):  # T8: asked again where a rename of the node's name began meanwhile
            path, moves = self.nodes.settled(node)
            out = self._getattr(node, c, body)
            if self.nodes.unchanged(node, path, moves):
                break
            self.fs.stats["getattrs_after_a_move"] += 1
        return out

    def _getattr(self, node: Node | None, c: Caller, body: memoryview) -> Any:
        flags, _, fh = k.GETATTR_IN.unpack_from(body)
        fh_ = fh if flags & k.GETATTR_FH else None
        if node is not None and fh_ is None and (node.path is None or node.reader or node.hidden):
            # fstat(2) sends no handle: an open file answers from it after its name went, and a
            # reader node for the version its readers opened (T5)
            fh_ = self.fh_of(node)
        elif node is not None and fh_ is None and node.pt_key and node.pt_key[0] == "writer":
            # a passthrough writer's node (P7) is its own: fstat answers from the file the kernel
            # writes for it, which after a reseal (W2) is no longer the one at its path (fsx -y:
            # truncate after fsync, then fstat gave the path's older size)
            fh_ = node.pt_key[1]
        if (node is not None and node.replaced and node.gone_attr is not None and fh_ not in self.fs.handles
                and (node.path is None or node.hidden)):
            # T6: renamed over and no longer open here: the file it was, unlinked (an fstat racing the
            # release of another handle, or a stat whose walk began before the rename), never cached
            return self.attr("", dict(node.gone_attr, st_nlink=0), reader=True)
        if node is None or node.path is None:
            # by its handle only: a handle released since gives the node's gone attributes, never
            # another path's (it was the root's: a directory, and the kernel made the inode bad, EIO)
            try:
                if fh_ is None:
                    raise FileNotFoundError(errno.ENOENT, "no handle")
                return self.attr("", self.fs.fgetattr(fh_), reader=True)
            except FileNotFoundError:
                if node is not None and node.replaced and node.gone_attr is not None:
                    return self.attr("", dict(node.gone_attr, st_nlink=0), reader=True)
                raise _gone(node) from None
        path = node.path
        asker = c
        if node is not None and not node.reader and fh_ is None and path and self.fs.isolated(path, c):
            # a process isolated from the version being written (V1) that still reaches the writer's
            # node (its dentry came before the write began): the kernel inode is the writer's, and
            # the committed size in this reply would become the writer's i_size (fsx beside a
            # reader: "Size error", SIGBUS on its mapping).  An fstat of its own open file answers
            # from that file; a stat is answered ESTALE once, so the VFS looks the name up again
            # and gets the reader node (T5, as an open is redirected); the VFS's repeat, if it lands
            # here again, is answered as the writer sees the file
            own = self._own_handle(node, c)
            if own is not None:
                fh_ = own
            elif self._redirect(node, self._last_redirect(c), True, c):
                raise OSError(errno.ESTALE, "isolated: look the name up again (reader node)")
            else:
                asker = NOBODY
        st = self.fs.getattr(path, fh_, asker)
        return self.attr(path, st, reader=node is not None and node.reader)

    def setattr(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        (valid, _, fh, size, _lo, atime, mtime, _ct, atimens, mtimens, _ctn, mode, _u4, uid, gid,
         _u5) = k.SETATTR_IN.unpack_from(body)
        fh_ = fh if valid & k.FATTR_FH else None
        path = node.path if node is not None and node.path is not None else None
        if path is None:
            if fh_ not in self.fs.handles:
                raise OSError(errno.ENOENT, "stale node")
            path = self.fs.handles[fh_].path
        if valid & k.FATTR_MODE:
            self.fs.chmod(path, mode)
        if valid & (k.FATTR_UID | k.FATTR_GID):
            self.fs.chown(path, uid if valid & k.FATTR_UID else -1, gid if valid & k.FATTR_GID else -1)
        if valid & k.FATTR_SIZE:
            self.fs.truncate(path, size, fh_, c)
        if valid & (k.FATTR_ATIME | k.FATTR_MTIME | k.FATTR_ATIME_NOW | k.FATTR_MTIME_NOW):
            now = time.time_ns()
            a = now if valid & k.FATTR_ATIME_NOW else (
                atime * 10**9 + atimens if valid & k.FATTR_ATIME else None)
            m = now if valid & k.FATTR_MTIME_NOW else (
                mtime * 10**9 + mtimens if valid & k.FATTR_MTIME else None)
            if a is not None and a >= 1 << 63:
                a -= 1 << 64
            if m is not None and m >= 1 << 63:
                m -= 1 << 64
            self.fs.utimens(path, (a, m))
        st = self.fs.getattr(path, fh_, c)
        return self.attr(path, st)

    def readlink(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        return _enc(self.fs.readlink(self.path_of(node)))

    def symlink(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        name, target = _names(body)
        path = self.child(node, name)
        self.fs.symlink(target, path, c)
        return self.entry(path, self.fs.getattr(path, None, c))

    def mknod(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        mode, rdev, umask, _ = k.MKNOD_IN.unpack_from(body)
        path = self.child(node, _name(body[k.MKNOD_IN.size:]))
        self.fs.mknod(path, mode, rdev, c, umask & 0o777)
        return self.entry(path, self.fs.getattr(path, None, c))

    def mkdir(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        mode, umask = k.MKDIR_IN.unpack_from(body)
        path = self.child(node, _name(body[k.MKDIR_IN.size:]))
        self.fs.mkdir(path, mode | stat.S_IFDIR, c, umask & 0o777)
        return self.entry(path, self.fs.getattr(path, None, c))

    def _hide(self, path: str, n: Node, c: Caller, before: str) -> str:
        """Rename the open file at ``path`` to a hidden name instead of removing it (libfuse's
        ``hard_remove=0``) before an ``unlink`` or a ``rename`` over it (``before``); the core keeps
        nothing on disk for it (``CkptFS._hide``).  Returns the hidden name."""
        d, _ = split(path)
        while True:
            with self.lock:
                self._hidectr += 1
                hidden = join(d, f".fuse_hidden{n.nid & 0xFFFFFFFF:08x}{self._hidectr & 0xFFFFFFFF:08x}")
            if self.nodes.at(hidden) is None:
                break
        self.fs.hide(path, hidden, c, before)
        self.nodes.move(path, hidden)
        n.hidden = True
        return hidden

    def _keep(self, victim: Node, path: str, c: Caller) -> None:
        """T7: before a rename over ``path``, give its kernel-known regular file ``victim`` a
        read-only handle held until the kernel forgets the node.  Best effort: a file that cannot
        be opened (EIO, corrupt) or past KEEPERS_MAX gets none (a late open is then ESTALE)."""
        st = victim.gone_attr
        if victim.keeper or victim.nlookup <= 0 or st is None or not stat.S_ISREG(st["st_mode"]):
            return
        with self.lock:
            if self.keepers >= KEEPERS_MAX:
                self.fs.stats["keepers_refused"] += 1
                return
            self.keepers += 1
        try:
            fh = self.fs.open(path, os.O_RDONLY, c)
        except OSError as e:
            log.debug("no keeper for %s: %s", path, e)
            with self.lock:
                self.keepers -= 1
            return
        with self.lock:
            victim.opens += 1
            victim.keeper = fh
            self.fh_node[fh] = victim
        self.fs.stats["keepers"] += 1

    def _drop_keeper(self, n: Node) -> None:
        """Release ``n``'s keeper handle (T7), as a RELEASE of it would."""
        fh = n.keeper
        if not fh:
            return
        n.keeper = 0
        with self.lock:
            self.keepers -= 1
        self._release(fh, NOBODY)

    def forget(self, nid: int, count: int) -> None:
        """FORGET: the kernel dropped ``count`` lookups; a forgotten node's keeper is released."""
        n = self.nodes.forget(nid, count)
        if n is not None:
            self._drop_keeper(n)
            self.nodes.forget(nid, 0)

    def unlink(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        path = self.child(node, _name(body))
        n = self.nodes.at(path)
        if n is not None and n.opens > 0:
            moved = self.nodes.begin_move(path)  # T8: an open racing it finds the hidden name
            try:
                self._hide(path, n, c, "unlink")
            finally:
                self.nodes.end_move(moved)
        else:
            self.fs.unlink(path, c)
            self.nodes.unmap(path)
        self.pages.forget(path)
        return b""

    def rmdir(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        path = self.child(node, _name(body))
        self.fs.rmdir(path)
        self.nodes.unmap(path, subtree=True)
        self.pages.forget(path)
        return b""

    def _rename(self, node: Node | None, newdir: int, flags: int, c: Caller, names: memoryview) -> Any:
        oldname, newname = _names(names)
        old = self.child(node, oldname)
        new = self.child(self.nodes.get(newdir), newname)
        self.pages.forget(old, new)
        moved = self.nodes.begin_move(old, new)  # T8: opens and getattrs of these nodes wait
        try:
            victim, hidden = None, None
            if flags == 0 and old != new:
                victim = self.nodes.at(new)
                if victim is not None:
                    try:  # T6: what a request still arriving on it (its walk began before) is answered
                        victim.gone_attr = self.fs.getattr(new, None, c)
                    except OSError:
                        victim.gone_attr = None
                    self._keep(victim, new, c)
                if victim is not None and victim.opens > 0:
                    # hidden before the rename: an OPEN of the victim racing it (its lookup came
                    # before) must not find ``new`` naming the renamed file (it did, and was split
                    # off as another version: ESTALE, twice in a row reaching the reader)
                    hidden = self._hide(new, victim, c, "rename")
                    victim.replaced = True  # T6: renamed over, not unlinked
            try:
                self.fs.rename(old, new, flags, c)
            except OSError:
                if victim is not None and hidden is not None:  # nothing changed on disk: undo the hide
                    self.fs.unhide(hidden, new)
                    self.nodes.move(hidden, new)
                    victim.hidden = victim.replaced = False
                if victim is not None:
                    self._drop_keeper(victim)
                raise
            if flags & RENAME_EXCHANGE:
                self.nodes.exchange(old, new)
            elif old != new:
                self.nodes.move(old, new)
        finally:
            self.nodes.end_move(moved)
            self.pages.forget(old, new)
        return b""

    def rename(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        (newdir,) = k.RENAME_IN.unpack_from(body)
        return self._rename(node, newdir, 0, c, body[k.RENAME_IN.size:])

    def rename2(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        newdir, flags, _ = k.RENAME2_IN.unpack_from(body)
        return self._rename(node, newdir, flags, c, body[k.RENAME2_IN.size:])

    def link(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        (oldnid,) = k.LINK_IN.unpack_from(body)
        oldnode = self.nodes.get(oldnid)
        old = self.path_of(oldnode)
        path = self.child(node, _name(body[k.LINK_IN.size:]))
        self.fs.link(old, path, c)
        assert oldnode is not None
        self.invalidate_now(oldnode)  # its cached link count is stale; from now on it is never cached
        return self.entry(path, self.fs.getattr(path, None, c))

    # ------------------------------------------------------------ files
    def _opened(self, fh: int, n: Node, c: Caller, flags: int, created: bool = False) -> bytes:
        """The OPEN reply for new handle ``fh`` on ``n``: direct I/O, passthrough or cached (with
        keep_cache where the page-cache rule allows).  On an error the handle is released."""
        # a reader node is never shared with a writer (T5): no need to bypass the page cache
        direct = self.fs.direct_io(fh) and not n.reader
        try:
            if self.passthrough is not None:
                oflags, backing = self.passthrough.choose(fh, n, direct)
            else:
                oflags, backing = (k.FOPEN_DIRECT_IO if direct else 0), 0
        except OSError:
            self.fs.abandon(fh, c)  # the application never gets this open: undo what it made
            raise
        with self.lock:
            n.opens += 1
            self.fh_node[fh] = n
        if n.reader:
            self.fs.stats["reader_node_opens"] += 1
        if flags & os.O_ACCMODE != os.O_RDONLY:
            # a new version is open: attributes other processes had cached with a long timeout
            # must be asked again (they get the committed ones while it is open: V1, ttl 0)
            self.invalidate(n)
            if n.entry_cached and not n.reader and self.fs.rewriting(n.path or ""):
                # and their cached dentries must be looked up again, before this open is answered:
                # their next lookup returns the reader node (T5), not this writer's.  (An O_TRUNC
                # rewrite did this already when it began: the REWRITING event, fuse/notify.py)
                n.entry_cached = False
                self.epoch_now()
        if not oflags & (k.FOPEN_DIRECT_IO | k.FOPEN_PASSTHROUGH) and not n.reader and self.pages.decide(fh):
            oflags |= k.FOPEN_KEEP_CACHE
        if not created and flags & os.O_ACCMODE == os.O_RDONLY and not flags & os.O_TRUNC:
            # CkptFS.flush does nothing for a reader: no round trip at close.  Never for a create,
            # even O_RDONLY: the new file's version is committed at its flush
            oflags |= k.FOPEN_NOFLUSH
        return k.OPEN_OUT.pack(fh, oflags, backing)

    def open(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        flags, _ = k.OPEN_IN.unpack_from(body)
        path = self.path_of(node)
        assert node is not None
        pt = self.passthrough
        writes = flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & os.O_TRUNC)  # a new version
        moves = 0
        if not writes:
            settled, moves = self.nodes.settled(node)  # T8
            if settled is None:
                raise _gone(node)
            path = settled
        writer = writes and pt is not None
        if writer:
            # ESTALE here, before the core sees it: nothing to undo (P4, P6)
            pt.writer_arrives(node, path, isolate=self.fs.isolates(path), tid=c.pid)
        last = self._last_redirect(c) if not writes else None
        if not writes and self._redirect(node, last, self.fs.isolated(path, c), c):
            raise OSError(errno.ESTALE, "isolated reader: look the name up again (reader node)")
        try:
            if writes:
                fh = self.fs.open(path, flags, c)
            else:
                fh, path = self._open_settled(node, path, moves, flags, c)
            if not writes and self.fs.direct_io(fh) and self._redirect(node, last, self.fs.isolated(path, c), c):
                # a rewrite began between the check above and the core's open, which isolated
                # this reader (a direct I/O handle of the committed version): it goes to the reader node
                self.fs.abandon(fh, c)
                raise OSError(errno.ESTALE, "isolated reader: look the name up again (reader node)")
            return self._opened(fh, node, c, flags)
        finally:
            if writer:
                pt.writer_done(path)

    def _open_settled(self, node: Node, path: str, moves: int, flags: int, c: Caller) -> tuple[int, str]:
        """T8: a reader's handle for ``node`` opened at ``path``; where a rename (or hide) of the
        node's name began before the core answered, opened again at the node's new path (its hidden
        name after a rename over it: the file the kernel looked up, as natively)."""
        for attempt in range(8):
            last = attempt == 7
            try:
                fh = self.fs.open(path, flags, c)
            except OSError:
                if last or self.nodes.unchanged(node, path, moves):
                    raise
            else:
                if last or self.nodes.unchanged(node, path, moves):
                    return fh, path
                self.fs.abandon(fh, c)
            self.fs.stats["opens_after_a_move"] += 1
            got, moves = self.nodes.settled(node)
            if got is None:
                raise _gone(node)
            path = got
        raise AssertionError("unreachable")

    def _last_redirect(self, c: Caller) -> int | None:
        """The node the last open of thread ``c.pid`` was redirected from, if that was its last
        open; every read-only open ends the record, so only the VFS's repeat finds it."""
        if not self._redirected:
            return None
        with self.lock:
            return self._redirected.pop(c.pid, None)

    def _redirect(self, node: Node, last: int | None, isolated: bool, c: Caller) -> bool:
        """Whether a read-only open on the writer's node comes from a caller ``isolated`` from the
        version being written (it looked the name up just before the rewrite began): answered
        ESTALE, the VFS repeats the lookup, which returns the reader node (T5).  Never twice in a
        row for one thread and node (``last``): that is the VFS's one repeat, and a second ESTALE
        would reach the application (the thread is served on the writer's node instead)."""
        if node.reader or not isolated or last == node.nid:
            return False
        with self.lock:
            if len(self._redirected) > 4096:
                self._redirected.clear()  # threads that never opened again
            self._redirected[c.pid] = node.nid
        self.fs.stats["reader_node_redirects"] += 1
        return True

    def create(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        flags, mode, umask, _ = k.CREATE_IN.unpack_from(body)
        path = self.child(node, _name(body[k.CREATE_IN.size:]))
        pt = self.passthrough
        if pt is not None:  # a writer never lands on a node passthrough readers hold (P2, P4)
            pt.writer_arrives(self.nodes.at(path), path, create=True, isolate=self.fs.isolates(path))
        try:
            fh = self.fs.create(path, mode, flags, c, umask & 0o777)
            try:
                st = self.fs.getattr(path, fh, c)
            except OSError:
                self.fs.abandon(fh, c)
                raise
            ent = self.entry(path, st)
            n = self.nodes.at(path)
            assert n is not None
            self.pages.decide(fh)  # a writer: the path's cached pages are no longer known clean
            return [ent, self._opened(fh, n, c, flags, created=True)]
        finally:
            if pt is not None:
                pt.writer_done(path)

    def read(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        fh, offset, size, *_ = k.READ_IN.unpack_from(body)
        buf = _read_buffer(size)
        n = self.fs.read_into(fh, buf[:size], offset)
        return buf[:n]

    def write(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        fh, offset, size, *_ = k.WRITE_IN.unpack_from(body)
        data = body[k.WRITE_IN.size:k.WRITE_IN.size + size]
        return k.WRITE_OUT.pack(self.fs.write(fh, data, offset, c), 0)

    def flush(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        fh, *_ = k.FLUSH_IN.unpack_from(body)
        self.fs.flush(fh, c)
        return b""

    def release(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        fh, *_ = k.RELEASE_IN.unpack_from(body)
        self._release(fh, c)
        return b""

    def _release(self, fh: int, c: Caller) -> None:
        try:
            self.fs.release(fh, c)
        finally:
            if self.passthrough is not None:
                self.passthrough.released(fh)
            with self.lock:
                n = self.fh_node.pop(fh, None)
                last = n is not None and n.opens == 1
                if n is not None:
                    n.opens -= 1
            if n is not None and last and n.hidden and n.path is not None:
                hidden = n.path
                try:
                    self.fs.unlink(hidden, c)
                except OSError as e:
                    log.debug("unlink of hidden %s: %s", hidden, e)
                self.nodes.unmap(hidden)
            if n is not None and last and n.nlookup <= 0:
                self.nodes.forget(n.nid, 0)  # forgotten before this release arrived: drop it now

    def fsync(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        fh, *_ = k.FSYNC_IN.unpack_from(body)
        self.fs.fsync(fh, c)
        return b""

    def fallocate(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        fh, offset, length, mode, _ = k.FALLOCATE_IN.unpack_from(body)
        self.fs.fallocate(fh, mode, offset, length, c)
        if node is not None:
            self.invalidate(node)  # a size or a hole the kernel's cached pages and size do not know
        return b""

    def copy_file_range(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        """copy_file_range(2) between two open files of the mount, done by the daemon (reads of the
        source handle, writes to the destination's version), so the kernel updates the
        destination's size and drops its cached pages itself: ``cp`` and fsx's COPY op."""
        fh_in, off_in, nodeid_out, fh_out, off_out, length, _flags = k.COPY_FILE_RANGE_IN.unpack_from(body)
        done = self.fs.copy_range(fh_in, off_in, fh_out, off_out, length, c)
        out = self.nodes.get(nodeid_out)
        if out is not None:
            self.invalidate(out)
        return k.WRITE_OUT.pack(done, 0)

    def ioctl(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        """The inode flags (``lsattr``, ``FS_IOC_GETFLAGS``) and ``FS_IOC_FSGETXATTR``, which the kernel
        asks through FUSE_IOCTL (``fuse_fileattr_get``), answered from the backing file as ext4
        does; everything else ENOTTY (isatty() in every Python open(): answered at once; setting
        flags: docs/design.md, "What the kernel refuses")."""
        fh, _flags, cmd, _arg, _in, out_size = k.IOCTL_IN.unpack_from(body)
        if cmd & 0xFFFFFFFF in (k.FS_IOC_GETFLAGS, k.FS_IOC_FSGETXATTR):
            dpath = self.dir_path.get(fh)  # an OPENDIR handle (lsattr -d): by the directory's path
            if dpath is not None and (node is None or node.path != dpath):
                dpath = None  # a file handle with the same number
            data = self.fs.fileattr(fh, cmd, out_size, dpath)
            return k.IOCTL_OUT.pack(0, 0, 0, 0) + data
        raise OSError(errno.ENOTTY, "no such ioctl")

    def statfs(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        s = self.fs.statfs()
        return k.STATFS_OUT.pack(s["f_blocks"], s["f_bfree"], s["f_bavail"], s["f_files"], s["f_ffree"],
                                 s["f_bsize"], s["f_namemax"], s["f_frsize"], 0)

    # ------------------------------------------------------------ xattrs
    def setxattr(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        size, flags = k.SETXATTR_IN.unpack_from(body)
        rest = bytes(body[k.SETXATTR_IN.size:])
        name, _, tail = rest.partition(b"\0")
        self.fs.setxattr(self.path_of(node), name.decode("utf-8", "surrogateescape"), tail[:size], flags, c)
        return b""

    def _sized(self, value: bytes, size: int) -> bytes:
        if size == 0:
            return k.GETXATTR_OUT.pack(len(value), 0)
        if len(value) > size:
            raise OSError(errno.ERANGE, "buffer too small")
        return value

    def getxattr(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        size, _ = k.GETXATTR_IN.unpack_from(body)
        value = self.fs.getxattr(self.path_of(node), _name(body[k.GETXATTR_IN.size:]), c)
        return self._sized(bytes(value), size)

    def listxattr(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        size, _ = k.GETXATTR_IN.unpack_from(body)
        names = self.fs.listxattr(self.path_of(node))
        return self._sized(b"".join(_enc(n) + b"\0" for n in names), size)

    def removexattr(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        self.fs.removexattr(self.path_of(node), _name(body))
        return b""

    # ------------------------------------------------------------ directories
    def opendir(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        path = self.path_of(node)
        with self.lock:
            dh = self._next_dh
            self._next_dh += 1
            self.dirs[dh] = None
            self.dir_path[dh] = path
        # a listing every caller sees alike and nothing judges on access: the kernel keeps it
        # (C2: requests through the mount drop it in the kernel, events in fuse/notify.py)
        cache = self.timeout > 0 and self.fs.listing_stable(path)
        self.fs.stats["dir_listings_cacheable" if cache else "dir_listings_uncached"] += 1
        return k.OPEN_OUT.pack(dh, k.FOPEN_CACHE_DIR | k.FOPEN_KEEP_CACHE if cache else 0, 0)

    def readdir(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        dh, offset, size, *_ = k.READ_IN.unpack_from(body)
        entries = self.dirs.get(dh)
        if entries is None or offset == 0:
            path = node.path if node is not None and node.path is not None else self.dir_path.get(dh)
            if path is None:
                raise OSError(errno.ENOENT, "stale node")
            entries = self.fs.readdir(path, c)
            self.dirs[dh] = entries
        out: list[bytes] = []
        used = 0
        for i in range(offset, len(entries)):
            name, st, _ = entries[i]
            rec = k.dirent(st.get("st_ino", 0), i + 1, _enc(name), (st.get("st_mode", 0) >> 12) & 0xF)
            if used + len(rec) > size:
                break
            out.append(rec)
            used += len(rec)
        return b"".join(out)

    def releasedir(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        dh, *_ = k.RELEASE_IN.unpack_from(body)
        with self.lock:
            self.dirs.pop(dh, None)
            self.dir_path.pop(dh, None)
        return b""

    def fsyncdir(self, node: Node | None, nid: int, c: Caller, body: memoryview) -> Any:
        self.fs.fsyncdir(self.path_of(node))
        return b""


_local = threading.local()


def _read_buffer(size: int) -> memoryview:
    """A per-thread reply buffer of at least ``size`` bytes (reads go straight into it)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = memoryview(bytearray(max(size, 1 << 20)))
        _local.buf = buf
    return buf
