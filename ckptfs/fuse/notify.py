"""Kernel-cache invalidation for the native transport: core events -> FUSE notifications.

The core announces every change of what a path shows (:mod:`ckptfs.events`, E3).  The kernel may
cache entries and attributes for ``--cache-timeout`` seconds (:mod:`ckptfs.fuse.ops`), so each
event is turned into notifications on the device fd:

* ``FUSE_NOTIFY_INVAL_ENTRY(parent, name)`` for the path (the name may now resolve differently:
  appear, vanish, or be another file), and for a removed or moved subtree's root;
* ``FUSE_NOTIFY_INVAL_INODE(node)`` for the path's node, every mapped node below it (a rollback or
  a restore changes the files in it) and its parent directory (size, mtime).

Invariant C1: after an event for path P has been handled here, no cached entry or attribute of P,
of a node below P or of P's parent from before the event is used by the kernel.  Notifications
are written on this module's own thread (the kernel takes inode locks that the request which
caused the event may hold; writing from that request's thread deadlocks).  A removed subtree is
unmapped from the node table at once (a lookup of the name afterwards gets a fresh answer).
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
from collections.abc import Callable

from ckptfs import events
from ckptfs.fuse import kernel as k
from ckptfs.fuse.nodes import split
from ckptfs.fuse.ops import Ops

log = logging.getLogger("ckptfs.fuse.notify")

GONE = (events.QUARANTINED, events.REMOVED)  # the daemon removed the name: its nodes are stale


class Notifier:
    def __init__(self, fd: int, ops: Ops) -> None:
        self.fd = fd
        self.ops = ops
        self.q: queue.SimpleQueue[tuple[int, int, bytes] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self._unsub: Callable[[], None] | None = None
        self.sent = 0

    def start(self, hub: events.Events) -> None:
        self._unsub = hub.subscribe(self.on_event)
        self.thread = threading.Thread(target=self._run, name="ckptfs-notify", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self._unsub is not None:
            self._unsub()
        if self.thread is not None:
            self.q.put(None)
            self.thread.join(5)

    # ------------------------------------------------------------ events -> notifications
    def on_event(self, ev: events.Event) -> None:
        """Subscriber: runs on the thread that made the change (engine locks possibly held):
        only looks nodes up and enqueues."""
        nodes = self.ops.nodes
        paths = [ev.path] + ([ev.dst] if ev.kind == events.RENAMED and ev.dst else [])
        for path in paths:
            self._entry(path)
            for n in nodes.under(path):
                self.q.put((k.NOTIFY_INVAL_INODE, n.nid, b""))
        if ev.kind == events.CORRUPT:  # the group holding it is quarantined on the next look at it
            p = split(ev.path)[0]
            while p:
                self._entry(p)
                p = split(p)[0]
        if ev.kind in GONE:
            nodes.unmap(ev.path, subtree=True)  # a later lookup of the name is a new node
        self.ops.pages.forget(*[p for p in paths if p])

    def _entry(self, path: str) -> None:
        """INVAL_ENTRY of ``path``'s name in its parent and INVAL_INODE of the parent (if the kernel
        knows the parent: otherwise it has no entry to drop)."""
        if not path:
            return
        d, name = split(path)
        pn = self.ops.nodes.at(d)
        if pn is not None:
            self.q.put((k.NOTIFY_INVAL_ENTRY, pn.nid, name.encode("utf-8", "surrogateescape")))
            self.q.put((k.NOTIFY_INVAL_INODE, pn.nid, b""))

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            code, nid, name = item
            if code == k.NOTIFY_INVAL_ENTRY:
                payload = k.NOTIFY_INVAL_ENTRY_OUT.pack(nid, len(name), 0) + name + b"\0"
            else:
                payload = k.NOTIFY_INVAL_INODE_OUT.pack(nid, 0, 0)
            try:
                os.writev(self.fd, [k.OUT_HEADER.pack(k.OUT_HEADER.size + len(payload), code, 0), payload])
                self.sent += 1
                self.ops.fs.stats["kernel_invalidations"] += 1
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.EBADF):
                    log.warning("invalidation %d of node %d failed: %s", code, nid, e)
                if e.errno in (errno.ENODEV, errno.EBADF):
                    return
