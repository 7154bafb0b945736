"""Kernel-cache invalidation for the native transport: core events -> FUSE notifications.

The core announces every change of what a path shows (:mod:`ckptfs.events`, E3).  The kernel may
cache entries and attributes for ``--cache-timeout`` seconds (:mod:`ckptfs.fuse.ops`), so each
event is turned into notifications on the device fd:

* ``FUSE_NOTIFY_INVAL_INODE(node, off=-1)`` for the path's node, every mapped node below it (a
  rollback or a restore changes the files in it) and its parent directory: attributes only;
  cached pages are dropped by the kernel when it sees the new size/mtime (``AUTO_INVAL_DATA``)
  and at the next open that does not keep the cache (``fuse/pagecache.py``);
* ``FUSE_NOTIFY_INC_EPOCH`` when a name may now resolve differently for a reason the kernel did
  not see (a group quarantined, removed, restored, rolled back, found corrupt, opened): every
  dentry from before, negative ones included, is looked up again at its next use;
* for ``REWRITING`` (a checkpoint file's rewrite begins: lookups by other processes now return
  the path's reader node, nodes.py T5) that epoch bump is written at once, on the writer's
  request thread, before the core truncates anything.

Neither takes a lock in the kernel.  ``FUSE_NOTIFY_INVAL_ENTRY`` (and page invalidation) would:
the parent directory's inode lock, which a CREATE in flight holds; a daemon killed while its
notification thread waited for that lock could never exit (the thread sleeps uninterruptibly),
its device fd stayed open and the mount hung for good instead of failing with ENOTCONN (found by
the daemon-kill campaign test).  Where the kernel lacks INC_EPOCH (before Linux 6.16) entries
are not cached at all (``Ops.entry_cache = False``).

Invariant C1: after an event for path P has been handled here, no cached entry or attribute of P,
of a node below P or of P's parent from before the event is used by the kernel.  Notifications
are written on this module's own thread, never on the thread of the request that caused them.
A removed subtree is unmapped from the node table at once (a later lookup is a new node).
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import select
import threading
from collections.abc import Callable

from ckptfs import events
from ckptfs.fuse import kernel as k
from ckptfs.fuse.nodes import Node, split
from ckptfs.fuse.ops import Ops

log = logging.getLogger("ckptfs.fuse.notify")

GONE = (events.QUARANTINED, events.REMOVED)  # the daemon removed the name: its nodes are stale
# names that may resolve differently for a reason the kernel did not see (request-caused renames,
# publishes of files that were volatile while written, and seals change no name)
NAMES_CHANGE = (events.QUARANTINED, events.REMOVED, events.RESTORED, events.ROLLED_BACK, events.CORRUPT,
                events.OPENED, events.UNPUBLISHED, events.RELEASED)


class MountTable:
    """This process's mount points, read again only when the mount table changed: the kernel marks
    ``/proc/self/mountinfo`` ``POLLPRI`` at every mount or unmount in the namespace, and a poll
    resets the mark (``mounts_poll``).  Every epoch bump asks (``Notifier._submounts``); a group's
    life bumps it a few times, and parsing the whole table each time was ~5 % of the daemon's
    Python time in W1 (issue 27).  Where the file cannot be polled (Darwin, no /proc), it is read
    every time, as before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._poll: select.poll | None = None
        self._cached: list[str] | None = None

    def mountpoints(self) -> list[str]:
        from ckptfs.mounts import MOUNTINFO, parse_mountinfo, read_mountinfo

        with self._lock:
            if self._poll is None and self._fd is None:
                try:
                    self._fd = os.open(MOUNTINFO, os.O_RDONLY | os.O_CLOEXEC)
                    self._poll = select.poll()
                    self._poll.register(self._fd, select.POLLPRI)
                except (OSError, AttributeError, ValueError):
                    if self._fd is not None:
                        os.close(self._fd)
                    self._fd, self._poll = -1, None
            if self._poll is None:
                return [m.mountpoint for m in read_mountinfo()]
            if self._cached is not None and not self._poll.poll(0):
                return self._cached
            try:
                chunks = []
                os.lseek(self._fd, 0, os.SEEK_SET)  # type: ignore[arg-type]
                while b := os.read(self._fd, 1 << 16):  # type: ignore[arg-type]
                    chunks.append(b)
                self._cached = [m.mountpoint for m in parse_mountinfo(b"".join(chunks))]
            except OSError:
                self._cached = None
                return [m.mountpoint for m in read_mountinfo()]
            return self._cached

    def close(self) -> None:
        """Close the file; later questions read the table each time (an epoch bump while the
        mount goes away)."""
        with self._lock:
            if self._fd is not None and self._fd >= 0:
                os.close(self._fd)
            self._fd, self._poll, self._cached = -1, None, None


class Notifier:
    def __init__(self, fd: int, ops: Ops) -> None:
        self.fd = fd
        self.ops = ops
        self.q: queue.SimpleQueue[tuple[int, ...] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self._unsub: Callable[[], None] | None = None
        self.sent = 0
        self.epochs_now = 0  # epoch bumps sent on a request's thread (epoch_now)
        self.table = MountTable()

    def start(self, hub: events.Events) -> None:
        self._unsub = hub.subscribe(self.on_event)
        self.ops.invalidate = self.inode
        self.ops.invalidate_now = self.inode_now
        self.ops.epoch_now = self.epoch_now
        self.thread = threading.Thread(target=self._run, name="ckptfs-notify", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self._unsub is not None:
            self._unsub()
        if self.thread is not None:
            self.q.put(None)
            self.thread.join(5)
        self.table.close()

    def inode(self, n: Node) -> None:
        """Queue an attribute invalidation of node ``n`` (a writer opened it: fuse/ops.py)."""
        self.q.put((k.NOTIFY_INVAL_INODE, n.nid))

    def inode_now(self, n: Node) -> None:
        """Invalidate node ``n``'s attributes before the current request is answered (a LINK: the
        other name's node caches the old link count).  Attribute-only INVAL_INODE takes no lock
        in the kernel, so this is safe on the request's own thread."""
        self._send(k.NOTIFY_INVAL_INODE, n.nid)

    def _submounts(self) -> bool:
        """Whether a filesystem is mounted somewhere below this mount.  The kernel revalidates every
        dentry after an epoch bump and one it invalidates takes the mounts on it along
        (``d_invalidate`` detaches them: issue 26, a tmpfs in the mount vanished when a group sealed
        beside it).  So with submounts no epoch is bumped and entries are no longer cached."""
        top = getattr(self.ops.fs, "mountpoint", None)
        if not top:
            return False
        pre = top.rstrip("/") + "/"
        return any(mp.startswith(pre) for mp in self.table.mountpoints())

    def epoch_now(self) -> None:
        """Make every cached dentry be looked up again at its next use, before the current
        request is answered (a writer's open made a name resolve per caller: nodes.py T5).
        INC_EPOCH only bumps a counter in the kernel: safe on the request's own thread."""
        self.epochs_now += 1
        self._send(k.NOTIFY_INC_EPOCH, 0)

    # ------------------------------------------------------------ events -> notifications
    def on_event(self, ev: events.Event) -> None:
        """Subscriber: runs on the thread that made the change (engine locks possibly held):
        only looks nodes up and enqueues."""
        nodes = self.ops.nodes
        if ev.kind == events.REWRITING:
            n = nodes.at(ev.path)
            if n is not None and n.entry_cached:
                # (on the writer's request thread, before the core truncates anything) other
                # processes' cached dentries of the writer's node are looked up again and return
                # the reader node from now on (nodes.py T5); INC_EPOCH takes no lock
                n.entry_cached = False
                self.epoch_now()
        paths = [ev.path] + ([ev.dst] if ev.kind == events.RENAMED and ev.dst else [])
        for path in paths:
            if path:
                pn = nodes.at(split(path)[0])
                if pn is not None:
                    self.q.put((k.NOTIFY_INVAL_INODE, pn.nid, 0))  # its attributes and cached listing (C2)
            for n in nodes.under(path):
                self.q.put((k.NOTIFY_INVAL_INODE, n.nid))
        if ev.kind in NAMES_CHANGE:
            self.q.put((k.NOTIFY_INC_EPOCH, 0))
        if ev.kind in GONE:
            nodes.unmap(ev.path, subtree=True)  # a later lookup of the name is a new node
        self.ops.pages.forget(*[p for p in paths if p])

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if not self._send(*item):
                return

    def _send(self, code: int, nid: int, off: int = -1) -> bool:
        """Write one notification; False once the connection is gone.  INVAL_INODE with ``off`` -1
        drops the node's attributes, with 0 also its cached pages: for a directory, the listing
        the kernel keeps (FOPEN_CACHE_DIR), cheap to drop and refetched at the next readdir."""
        if code == k.NOTIFY_INC_EPOCH and self._submounts():
            if self.ops.entry_cache:
                log.warning("a filesystem is mounted inside the mount: names are no longer cached by the "
                            "kernel (an epoch bump would detach it)")
                self.ops.entry_cache = False
            self.ops.fs.stats["epochs_withheld_for_submounts"] += 1
            return True
        payload = b"" if code == k.NOTIFY_INC_EPOCH else k.NOTIFY_INVAL_INODE_OUT.pack(nid, off, 0)
        try:
            os.writev(self.fd, [k.OUT_HEADER.pack(k.OUT_HEADER.size + len(payload), code, 0), payload])
            self.sent += 1
            self.ops.fs.stats["kernel_invalidations"] += 1
        except OSError as e:
            if code == k.NOTIFY_INC_EPOCH and e.errno in (errno.EINVAL, errno.ENOSYS):
                log.warning("kernel lacks FUSE_NOTIFY_INC_EPOCH (%s): entries are no longer cached", e)
                self.ops.entry_cache = False
                return True
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.EBADF):
                log.warning("invalidation %d of node %d failed: %s", code, nid, e)
            if e.errno in (errno.ENODEV, errno.EBADF):
                return False
        return True
