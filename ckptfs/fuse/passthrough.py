"""FUSE passthrough for committed files (Linux >= 6.9, ``CONFIG_FUSE_PASSTHROUGH``, CAP_SYS_ADMIN).

A read-only open of a committed file is verified completely at open (:meth:`CkptFS.passthrough_fd`,
once per version) and then answered with ``FOPEN_PASSTHROUGH`` and a backing id for the committed
backing file: the kernel reads (and maps) it directly, no READ request reaches the daemon.

The kernel's rules (``fs/fuse/iomode.c``), which this module keeps:

P1  A kernel inode reads one backing file: every passthrough open of a node shares one backing
    id, registered at the first and closed at the last release.
P2  While a node has passthrough opens, any other open of it fails with EIO in the kernel; while
    it has cached-mode opens, a passthrough open does.  The kernel applies these rules when the
    opener's thread resumes after our reply, so two opens decided in one order may reach them in
    the other: a passthrough reader and a direct-I/O writer decided at once made the writer's
    ``torch.save`` fail with EIO (reader race campaign).  So the modes are exclusive per node
    from decision to release: a node with cached or direct-I/O opens gets no passthrough (its
    reads go through the daemon), and an open that cannot share the node's
    backing file (a writer, another version) is answered ESTALE after the node is *detached*
    (:meth:`Nodes.detach`): the VFS repeats the open once with ``LOOKUP_REVAL``, the lookup
    returns a new node id for the name, and the open lands on a fresh kernel inode.  Readers
    already open keep reading the version they opened, as on a native filesystem where the
    writer's file is renamed over it.
P4  A writer's open reserves its path from before the core sees it until it is answered: no
    reader of the path is given passthrough meanwhile, so a writer never meets passthrough readers
    after the core made its version (a reader given passthrough in that gap made the writer's
    open fail with ESTALE, and the new, empty version was committed at its release: readers
    then loaded a 0-byte shard; DCP reader race).
P5  A writer answered ESTALE comes back at once (the VFS repeats the lookup and the open): until
    then (at most ``RESERVE_SECONDS``) no reader of the name gets passthrough, so the repeated
    open cannot meet passthrough readers again (the VFS repeats only once: a second ESTALE
    reaches the application).
P6  A rewrite of a checkpoint file (V1) never lands on a node with read-only cached or direct opens:
    see :meth:`Passthrough.writer_arrives`.
P7  A writer's new version of a checkpoint file (a create or an O_TRUNC rewrite no other handle
    shares, :meth:`CkptFS.write_passthrough_fd`) on a node with no other open is given passthrough
    to its *staging* file: the kernel writes (and reads back) its bytes directly, no WRITE reaches
    the daemon, and the version's digest is computed from the staging file at its seal.  The
    node's key names the writer's handle, so every other open of the node is split off (P2) while
    it is open, and the node is detached at once: no later lookup of the name returns it, but
    the kernel's dentry may, so the node follows the name's renames (nodes.py T9).  Besides
    checkpoint files, an already-atomic writer's temporary file of one (``model.pt.tmp``) gets it.  A
    write after the seal goes to the installed file: fs.CkptFS._after_bypass (W2).
P3  Where registering a backing file fails (no CAP_SYS_ADMIN, a backing filesystem that stacks
    too deep: ELOOP, no kernel support), the open falls back to daemon reads; counted in
    ``user.ckptfs.stats`` (``passthrough_fallbacks``) and logged once.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time

from ckptfs.fuse import kernel as k
from ckptfs.fuse.nodes import Node
from ckptfs.fuse.ops import Ops

log = logging.getLogger("ckptfs.fuse.passthrough")

CACHED, DIRECT, PASSTHROUGH = "cached", "direct", "passthrough"
RESERVE_SECONDS = 10.0  # P5: how long a name stays reserved for a writer answered ESTALE


class Passthrough:
    def __init__(self, devfd: int, ops: Ops) -> None:
        self.devfd = devfd
        self.ops = ops
        self.fs = ops.fs
        self.lock = threading.Lock()
        self.mode: dict[int, tuple[Node, str]] = {}  # fh -> (node, io mode)
        self.warned = False
        self.writing: dict[str, int] = {}  # P4: path -> writers' opens in progress
        self.reserved: dict[str, float] = {}  # P5: path -> until when (monotonic)
        self.split_for: dict[int, str] = {}  # P6: thread -> path its writer's open was split at

    def install(self) -> None:
        self.ops.passthrough = self

    # ------------------------------------------------------------ open / release
    def writer_arrives(self, node: Node | None, path: str, create: bool = False, isolate: bool = False,
                       tid: int = 0) -> None:
        """Before the core sees a writer's open of ``path`` (``node``: the node it names, if any):
        from now until :meth:`writer_done`, no open of ``path`` is given passthrough (P4), so the
        writer can never find passthrough readers on its node once the core made its version.
        Passthrough readers already on the node (P2): the node is detached and, for an OPEN, the
        writer is answered ESTALE; the name stays writer-reserved (P5) until the writer's repeated
        open arrives.  A CREATE lands on a new node anyway (its reply names one).

        P6: the same for a rewrite other processes must not see (``isolate``: a checkpoint file,
        V1) of a node with a read-only open in cached or direct-I/O mode: the writer moves to a new
        node, so their kernel inode is never truncated under them (an mmap reader got SIGBUS where
        the core's drain timed out).  Except at the VFS's repeat of that open (same thread
        ``tid``, same path): a second ESTALE would reach the application, and cached or direct
        opens do not make the kernel fail it (the core's reader drain covers them as before)."""
        with self.lock:
            repeat = bool(tid) and self.split_for.pop(tid, None) == path
            if node is not None and not create and (node.pt_opens > 0 or (
                    isolate and not repeat and self._readers_on(node))):
                self.reserved[path] = time.monotonic() + RESERVE_SECONDS
                if tid:
                    if len(self.split_for) > 4096:
                        self.split_for.clear()
                    self.split_for[tid] = path
                raise self._stale(node)
            if node is not None and create and (node.pt_opens > 0 or (isolate and self._readers_on(node))):
                self.ops.nodes.detach(node)  # the CREATE reply names a new node (P2, P6)
            self.writing[path] = self.writing.get(path, 0) + 1

    def _readers_on(self, node: Node) -> bool:
        """(lock held) Whether ``node`` has a read-only open in cached or direct-I/O mode (P6: a
        truncation would reach it).  A writer's own earlier handle (its RELEASE may still be on its
        way) does not count: splitting for it cost every save in a loop a round trip."""
        if node.cached_opens == 0 and node.direct_opens == 0:
            return False
        for fh, (n, mode) in self.mode.items():
            if n is node and mode != PASSTHROUGH:
                h = self.fs.handles.get(fh)
                if h is not None and not h.writable:
                    return True
        return False

    def writer_done(self, path: str) -> None:
        """The writer's open of ``path`` was answered (either way): readers may use passthrough
        on nodes the writer does not hold (``choose`` still keeps modes exclusive per node)."""
        with self.lock:
            left = self.writing.get(path, 0) - 1
            if left > 0:
                self.writing[path] = left
            else:
                self.writing.pop(path, None)
            self.reserved.pop(path, None)

    def _held_for_writer(self, path: str | None) -> bool:
        """(lock held) P4/P5: a writer of ``path`` is arriving, or was told to look it up again."""
        if path is None:
            return False
        if path in self.writing:
            return True
        until = self.reserved.get(path)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self.reserved[path]  # the writer never came back (it gave up): readers may share again
        return False

    def choose(self, fh: int, node: Node, direct: bool) -> tuple[int, int]:
        """(open flags, backing id) for handle ``fh`` just opened on ``node``; raises ESTALE (P2)
        where the node cannot serve it (the adapter then abandons the core's handle)."""
        wfd = self.fs.write_passthrough_fd(fh)
        if wfd is not None:
            got = self._writer(fh, node, wfd)
            if got is not None:
                return got
        fd = self.fs.passthrough_fd(fh)
        with self.lock:
            if fd is None and node.pt_opens > 0:
                raise self._stale(node)
            if (fd is not None and node.cached_opens == 0 and node.direct_opens == 0
                    and not (node.pt_opens == 0 and self._held_for_writer(node.path))):
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if node.hidden and node.pt_key[:4] == key[:4]:
                    # renamed over (T6, T7): the rename changed its ctime (its link count dropped),
                    # not its bytes: the node's readers read the same file
                    key = node.pt_key
                if node.pt_opens > 0 and node.pt_key != key:
                    raise self._stale(node)  # a reader of a newer version
                if node.pt_opens == 0:
                    bid = self._register(fd)
                    if bid is not None:
                        node.pt_backing, node.pt_key = bid, key
                if node.pt_opens > 0 or node.pt_key == key:
                    node.pt_opens += 1
                    self.mode[fh] = (node, PASSTHROUGH)
                    self.fs.stats["passthrough_opens"] += 1
                    return k.FOPEN_PASSTHROUGH, node.pt_backing
            if direct:  # bypasses the page cache: takes no io mode in the kernel
                node.direct_opens += 1
                self.mode[fh] = (node, DIRECT)
                return k.FOPEN_DIRECT_IO, 0
            node.cached_opens += 1
            self.mode[fh] = (node, CACHED)
            return 0, 0

    def _writer(self, fh: int, node: Node, wfd: int) -> tuple[int, int] | None:
        """P7: a writer's new version (CkptFS.write_passthrough_fd) on a node nothing else has open:
        the kernel writes its staging file directly.  The node's key names this handle, so no other
        open can share the node while it is open (each is answered ESTALE and split off, P2).
        None: the node is in use, or registering failed (P3); the writer goes through the daemon."""
        with self.lock:
            if node.opens or node.pt_opens or node.cached_opens or node.direct_opens:
                self.fs.stats["passthrough_writers_refused"] += 1
                return None
            bid = self._register(wfd)
            if bid is None:
                return None
            node.pt_backing, node.pt_key, node.pt_opens = bid, ("writer", fh), 1
            self.mode[fh] = (node, PASSTHROUGH)
        # the writer keeps its kernel inode to itself: every later lookup of the name gets another
        # node, so an open answered ESTALE for meeting it (P2) never meets it again at the VFS's
        # one repeat (an isolated reader's second ESTALE would reach the application); it still
        # names the file, and follows its renames (nodes.py T9)
        self.ops.nodes.detach(node, follow=True)
        self.fs.bypass(fh)  # before the reply: no write of the application's can precede it
        return k.FOPEN_PASSTHROUGH, bid

    def _stale(self, node: Node) -> OSError:
        self.ops.nodes.detach(node)
        self.fs.stats["passthrough_node_splits"] += 1
        return OSError(errno.ESTALE, "node held by passthrough readers: look the name up again")

    def _register(self, fd: int) -> int | None:
        try:
            bid = fcntl.ioctl(self.devfd, k.DEV_IOC_BACKING_OPEN, bytearray(k.BACKING_MAP.pack(fd, 0, 0)))
        except OSError as e:
            self.fs.stats["passthrough_fallbacks"] += 1
            if not self.warned:
                self.warned = True
                log.warning("passthrough unavailable (%s): reads go through the daemon", e)
            return None
        return int(bid)

    def released(self, fh: int) -> None:
        with self.lock:
            got = self.mode.pop(fh, None)
            if got is None:
                return
            node, mode = got
            if mode == CACHED:
                node.cached_opens -= 1
                return
            if mode == DIRECT:
                node.direct_opens -= 1
                return
            if mode != PASSTHROUGH:
                return
            node.pt_opens -= 1
            if node.pt_opens > 0:
                return
            bid, node.pt_backing, node.pt_key = node.pt_backing, 0, ()
        try:
            fcntl.ioctl(self.devfd, k.DEV_IOC_BACKING_CLOSE, bytearray(bid.to_bytes(4, "little")))
        except OSError as e:
            log.warning("closing backing id %d: %s", bid, e)
