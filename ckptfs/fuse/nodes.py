"""The native transport's node table: kernel node ids <-> mount paths, lookup counts, open counts.

The core (:class:`ckptfs.fs.CkptFS`) is addressed by path; the kernel by node id.  One node per
name, as libfuse's high-level API keeps them: a hard link's second name is another node (its
attributes are never cached, ``ops.Ops._ttl``).

Invariants:

T1  A node id is never reused during a mount (a counter), so ``generation`` is always 0.
T2  ``by_path[p].path == p`` for every mapped path; a node whose name went away (unlink, rmdir,
    a rename over it, a daemon-initiated removal) is unmapped but stays in ``by_id`` until the
    kernel forgets it (lookup count 0): the kernel may still send requests for it (ENOENT then,
    or its open handles answer).  A *detached* node (:meth:`detach`) keeps its path but is no
    longer ``by_path[path]``: the name's next lookup makes a new node.
T3  A rename through the mount moves the node and every mapped node below it.
T4  (the child index, :class:`Nodes`) subtree operations find exactly the mapped paths below.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ckptfs.fuse.kernel import ROOT_ID


@dataclass(eq=False)
class Node:
    nid: int
    path: str | None  # mount-relative ("" is the root); None once the name is gone (T2)
    nlookup: int = 0
    opens: int = 0  # open file handles on this node (an unlinked open file is hidden, not removed)
    hidden: bool = False  # renamed to a .fuse_hidden name while open (unlink or rename over it)
    cached_opens: int = 0  # opens in the kernel's cached I/O mode (neither direct I/O nor passthrough)
    direct_opens: int = 0  # direct I/O opens (a writer of a checkpoint file, an isolated reader)
    pt_opens: int = 0  # passthrough opens; they share one backing id (one per kernel inode)
    pt_backing: int = 0
    pt_key: tuple = ()  # identity of the backing file they read (st_dev, st_ino, size, mtime, ctime)


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def split(path: str) -> tuple[str, str]:
    head, _, tail = path.rpartition("/")
    return head, tail


class Nodes:
    """The table.  Besides ``by_id`` and ``by_path`` it keeps ``kids``: parent path -> the child
    names *listed* under it, so subtree operations cost the subtree, not the table (events for
    every commit, every rename and rmdir walk a subtree).

    T4  A path is listed in ``kids[parent]`` iff it is mapped or has listed children; so every
        mapped path below ``p`` is reached from ``kids[p]`` even where a directory between them is
        not mapped (the kernel's dentry tree makes that rare: a child dentry pins its parent).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        root = Node(ROOT_ID, "", nlookup=1 << 62)
        self.by_id: dict[int, Node] = {ROOT_ID: root}
        self.by_path: dict[str, Node] = {"": root}
        self.kids: dict[str, set[str]] = {}
        self._next = ROOT_ID + 1

    # -- the index (callers hold self.lock) --

    def _put(self, path: str, n: Node) -> None:
        self.by_path[path] = n
        p = path
        while p:  # list p under its parent, and the parent under its own, up to a listed one (T4)
            parent, name = split(p)
            names = self.kids.setdefault(parent, set())
            if name in names:
                return
            names.add(name)
            p = parent

    def _pop(self, path: str) -> Node | None:
        n = self.by_path.pop(path, None)
        if n is None:
            return None
        p = path
        while p and p not in self.by_path and not self.kids.get(p):  # p is no longer listed (T4)
            parent, name = split(p)
            names = self.kids.get(parent)
            if not names or name not in names:
                break
            names.discard(name)
            if not names:
                del self.kids[parent]
            p = parent
        return n

    def _below(self, path: str) -> list[str]:
        """Mapped paths strictly below ``path`` (parents before children)."""
        out: list[str] = []
        stack = [path]
        while stack:
            p = stack.pop()
            for name in self.kids.get(p, ()):
                c = join(p, name)
                if c in self.by_path:
                    out.append(c)
                stack.append(c)
        return out

    # -- the operations --

    def get(self, nid: int) -> Node | None:
        return self.by_id.get(nid)

    def at(self, path: str) -> Node | None:
        return self.by_path.get(path)

    def looked_up(self, path: str) -> Node:
        """The node of ``path`` with its lookup count raised by one (a LOOKUP/CREATE/MKDIR reply)."""
        with self.lock:
            n = self.by_path.get(path)
            if n is None:
                n = Node(self._next, path)
                self._next += 1
                self.by_id[n.nid] = n
                self._put(path, n)
            n.nlookup += 1
            return n

    def forget(self, nid: int, count: int) -> None:
        with self.lock:
            n = self.by_id.get(nid)
            if n is None or nid == ROOT_ID:
                return
            n.nlookup -= count
            if n.nlookup <= 0 and n.opens <= 0:
                del self.by_id[nid]
                if n.path is not None and self.by_path.get(n.path) is n:
                    self._pop(n.path)

    def unmap(self, path: str, subtree: bool = False) -> list[Node]:
        """The name ``path`` (and, with ``subtree``, every name below it) is gone (T2)."""
        with self.lock:
            below = self._below(path) if subtree else []
            gone = []
            for p in [path, *below]:
                n = self._pop(p)
                if n is not None:
                    n.path = None
                    gone.append(n)
            return gone

    def detach(self, n: Node) -> None:
        """Give ``n``'s name a fresh node at the next lookup; ``n`` keeps its path for requests
        on its open handles (passthrough: a kernel inode reads one backing file, fuse/passthrough.py)."""
        with self.lock:
            if n.path is not None and self.by_path.get(n.path) is n:
                self._pop(n.path)

    def move(self, old: str, new: str) -> None:
        """A rename through the mount: ``old`` and its subtree now live at ``new`` (T3)."""
        with self.lock:
            for p in [new, *self._below(new)]:
                victim = self._pop(p)
                if victim is not None:
                    victim.path = None
            moving = [(p, self._pop(p)) for p in [old, *self._below(old)]]
            for p, m in moving:
                if m is not None:
                    m.path = new + p[len(old):]
                    self._put(m.path, m)

    def exchange(self, a: str, b: str) -> None:
        """RENAME_EXCHANGE: the nodes (and subtrees) at ``a`` and ``b`` swap names."""
        with self.lock:
            sides = [[(p, self._pop(p)) for p in [src, *self._below(src)]] for src in (a, b)]
            for (src, dst), side in zip(((a, b), (b, a)), sides, strict=True):
                for p, m in side:
                    if m is not None:
                        m.path = dst + p[len(src):]
                        self._put(m.path, m)

    def under(self, path: str) -> list[Node]:
        """Mapped nodes at ``path`` and below it."""
        with self.lock:
            return [n for p in [path, *self._below(path)] if (n := self.by_path.get(p)) is not None]
