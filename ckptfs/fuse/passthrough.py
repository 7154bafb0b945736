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

from ckptfs.fuse import kernel as k
from ckptfs.fuse.nodes import Node
from ckptfs.fuse.ops import Ops

log = logging.getLogger("ckptfs.fuse.passthrough")

CACHED, DIRECT, PASSTHROUGH = "cached", "direct", "passthrough"


class Passthrough:
    def __init__(self, devfd: int, ops: Ops) -> None:
        self.devfd = devfd
        self.ops = ops
        self.fs = ops.fs
        self.lock = threading.Lock()
        self.mode: dict[int, tuple[Node, str]] = {}  # fh -> (node, io mode)
        self.warned = False

    def install(self) -> None:
        self.ops.passthrough = self

    # ------------------------------------------------------------ open / release
    def conflicts(self, node: Node, flags: int) -> bool:
        """Whether an open with ``flags`` of ``node`` cannot be served on it (P2): a writer while
        passthrough readers hold it.  The caller detaches the node and answers ESTALE."""
        return node.pt_opens > 0 and ((flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC))

    def choose(self, fh: int, node: Node, direct: bool) -> tuple[int, int]:
        """(open flags, backing id) for handle ``fh`` just opened on ``node``; raises ESTALE (P2)."""
        fd = self.fs.passthrough_fd(fh)
        with self.lock:
            if fd is None and node.pt_opens > 0:
                raise self._stale(node)
            if fd is not None and node.cached_opens == 0 and node.direct_opens == 0:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if node.pt_opens > 0 and node.pt_key != key:
                    raise self._stale(node, writer=False)  # a reader of a newer version
                if node.pt_opens == 0:
                    bid = self._register(fd)
                    if bid is not None:
                        node.pt_backing, node.pt_key = bid, key
                if node.pt_opens > 0 or node.pt_key == key:
                    node.pt_opens += 1
                    self.mode[fh] = (node, PASSTHROUGH)
                    return k.FOPEN_PASSTHROUGH, node.pt_backing
            if direct:  # bypasses the page cache: takes no io mode in the kernel
                node.direct_opens += 1
                self.mode[fh] = (node, DIRECT)
                return k.FOPEN_DIRECT_IO, 0
            node.cached_opens += 1
            self.mode[fh] = (node, CACHED)
            return 0, 0

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
