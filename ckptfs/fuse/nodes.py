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
T5  *Reader nodes* (V1 on the native transport): while a checkpoint file has a new version open,
    a lookup by a process isolated from it (``CkptFS.isolated``) returns the path's reader node,
    one per path in ``readers``, never ``by_path[path]`` (the writer's).  So the writer's
    truncation and writes change the size and pages of a kernel inode no isolated reader holds:
    their ``fstat``, reads, passthrough and mmap see the committed version, as with a native
    tmp + rename.  A reader node is unmapped with its name (unlink, rename, removal); once nobody
    is isolated any more :meth:`drop_reader` retires it (it keeps its path for opens already on
    their way); its open handles keep answering.
T6  A node whose name was renamed over answers as the file it named (the kernel may send requests
    for it whose walk began before the rename).  T7: a kernel-known regular file renamed over keeps
    an open read-only handle (``keeper``, fuse/ops.py) until the kernel forgets the node: an open
    whose lookup came before the rename opens that file, as natively, never ESTALE.
T8  A request that resolves a node to its path and then asks the core by path (OPEN, GETATTR)
    gets the file the node named *when the core answered*: a rename (or the hide before it) of
    the node's name marks the nodes it moves (:meth:`begin_move` .. :meth:`end_move`); such a
    request waits until none is in progress on its node (:meth:`settled`), and if one began
    before the core answered (:meth:`unchanged` is false) it asks again.  Without it an open
    racing a rename over its name opened the *new* file for the old node (its passthrough
    readers read the old one: ESTALE, and under three writers twice in a row, reaching a reader).
T9  A *follower* (a passthrough writer's node, detached so that other lookups of its name get
    another node: fuse/passthrough.py P7) still names the file at its path: the kernel's dentry
    may point to it until the kernel forgets it.  So a rename through the mount (and an exchange)
    moves the followers at and below the old name with the mapped nodes (T3).  Without it a
    renamed ``model.pt.tmp`` written through passthrough kept its old path, and ``model.pt``
    answered ENOENT through the moved dentry (30 of 30 trials).  A follower whose name is renamed
    over, removed or hidden stops following (it keeps its path, as any detached node).
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
    reader: bool = False  # a reader node (T5): only isolated readers of the committed version hold it
    entry_cached: bool = False  # the kernel may hold a dentry for it with a timeout (ops.Ops.entry)
    replaced: bool = False  # its name was renamed over: the name now names another file (T6)
    gone_attr: dict | None = None  # T6: the attributes of the file it named when it was renamed over
    keeper: int = 0  # T7: a read-only handle of that file, held until the kernel forgets the node
    moving: int = 0  # T8: renames (or hides) of its name in progress
    moves: int = 0  # T8: raised at the start and the end of each: an unchanged count means no move
    follows: bool = False  # T9: a detached node that still names the file at its path


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
        self.moved = threading.Condition(self.lock)  # T8: a move ended
        root = Node(ROOT_ID, "", nlookup=1 << 62)
        self.by_id: dict[int, Node] = {ROOT_ID: root}
        self.by_path: dict[str, Node] = {"": root}
        self.kids: dict[str, set[str]] = {}
        self.readers: dict[str, Node] = {}  # T5: path -> its reader node (few: paths being rewritten)
        self.followers: dict[str, list[Node]] = {}  # T9: path -> detached nodes that follow it
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

    def _drop_readers(self, path: str, subtree: bool, renamed: bool = False) -> list[Node]:
        """(lock held) Unmap the reader nodes at ``path`` (and below it).  ``renamed``: the name
        still exists (a rename to or from it): each keeps its path, as :meth:`drop_reader` (an open
        already on its way, whose walk returned it, opens what the name shows that caller now, as
        natively an open racing a rename gets one file or the other); else the name is gone."""
        if not self.readers:
            return []
        pre = path + "/" if path else ""
        hit = [p for p in self.readers if p == path or p.startswith(pre)] if subtree else (
            [path] if path in self.readers else [])
        gone = []
        for p in hit:
            r = self.readers.pop(p)
            if not renamed:
                r.path = None  # (a rename keeps it: RS1 readers' opens racing the hide before a
                # re-save's tmp + rename were ENOENT, "stale node", for a file that exists)
            gone.append(r)
        return gone

    def _take_followers(self, path: str, subtree: bool = True) -> list[tuple[str, list[Node]]]:
        """(lock held) Remove and return the followers at ``path`` (and below it) (T9)."""
        if not self.followers:
            return []
        pre = path + "/" if path else ""
        hit = [p for p in self.followers if p == path or subtree and p.startswith(pre)]
        return [(p, self.followers.pop(p)) for p in hit]

    def _unfollow(self, path: str, subtree: bool = True) -> None:
        """(lock held) The followers at ``path`` (and below it) stop following (T9): the name they
        followed is gone or names another file now; each keeps its path, as any detached node."""
        for _p, fs in self._take_followers(path, subtree):
            for f in fs:
                f.follows = False

    def _refollow(self, taken: list[tuple[str, list[Node]]], src: str, dst: str) -> None:
        """(lock held) Put followers taken at ``src`` (and below) back at ``dst`` (T9)."""
        for p, fs in taken:
            q = dst + p[len(src):]
            for f in fs:
                f.path = q
            self.followers.setdefault(q, []).extend(fs)

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

    def reader_looked_up(self, path: str) -> Node:
        """The reader node of ``path`` (T5), made at the first isolated lookup, lookup count + 1."""
        with self.lock:
            n = self.readers.get(path)
            if n is None:
                n = Node(self._next, path, reader=True)
                self._next += 1
                self.by_id[n.nid] = n
                self.readers[path] = n
            n.nlookup += 1
            return n

    def drop_reader(self, path: str) -> Node | None:
        """Nobody is isolated from ``path`` any more: its next lookups return ``by_path[path]``.
        The reader node keeps its path (as :meth:`detach`): a process whose lookup returned it just
        before may still open it, and gets the path's committed version, as natively (T5)."""
        if path not in self.readers:  # unlocked peek: the common case costs one dict lookup
            return None
        with self.lock:
            return self.readers.pop(path, None)

    def forget(self, nid: int, count: int) -> Node | None:
        """The kernel dropped ``count`` lookups of ``nid``.  Returns the node where it is now
        forgotten but still holds a keeper handle (T7): the caller releases it, then forgets the
        node again with count 0 (the kernel sends nothing more for it)."""
        with self.lock:
            n = self.by_id.get(nid)
            if n is None or nid == ROOT_ID:
                return None
            n.nlookup -= count
            if n.nlookup <= 0 and n.keeper:
                return n
            if n.nlookup <= 0 and n.opens <= 0:
                del self.by_id[nid]
                if n.follows:
                    self._drop_follower(n)
                if n.reader:
                    if n.path is not None and self.readers.get(n.path) is n:
                        del self.readers[n.path]
                elif n.path is not None and self.by_path.get(n.path) is n:
                    self._pop(n.path)
            return None

    def _drop_follower(self, n: Node) -> None:
        """(lock held) ``n`` stops following its path (T9)."""
        n.follows = False
        fs = self.followers.get(n.path or "")
        if fs is not None and n in fs:
            fs.remove(n)
            if not fs:
                del self.followers[n.path or ""]

    def unmap(self, path: str, subtree: bool = False) -> list[Node]:
        """The name ``path`` (and, with ``subtree``, every name below it) is gone (T2)."""
        with self.lock:
            below = self._below(path) if subtree else []
            self._unfollow(path, subtree)
            gone = self._drop_readers(path, subtree)
            for p in [path, *below]:
                n = self._pop(p)
                if n is not None:
                    n.path = None
                    gone.append(n)
            return gone

    def detach(self, n: Node, follow: bool = False) -> None:
        """Give ``n``'s name a fresh node at the next lookup; ``n`` keeps its path for requests
        on its open handles (passthrough: a kernel inode reads one backing file, fuse/passthrough.py).
        ``follow``: ``n`` still names the file at its path and follows its renames (T9)."""
        with self.lock:
            if n.reader:
                if n.path is not None and self.readers.get(n.path) is n:
                    del self.readers[n.path]  # keeps its path: its handles' requests name it
            elif n.path is not None and self.by_path.get(n.path) is n:
                self._pop(n.path)
                if follow and not n.follows:
                    n.follows = True
                    self.followers.setdefault(n.path, []).append(n)

    def begin_move(self, *paths: str) -> list[Node]:
        """T8: the names ``paths`` (and every name below them) are about to move or be hidden; the
        nodes they name are marked until :meth:`end_move` of the list returned."""
        with self.lock:
            got = [n for p in paths for q in [p, *self._below(p)] if (n := self.by_path.get(q)) is not None]
            for n in got:
                n.moving += 1
                n.moves += 1
            return got

    def end_move(self, moved: list[Node]) -> None:
        with self.lock:
            for n in moved:
                n.moving -= 1
                n.moves += 1
            self.moved.notify_all()

    def settled(self, n: Node, wait: float = 2.0) -> tuple[str | None, int]:
        """T8: (path, move count) of ``n`` once no move of it is in progress (at most ``wait``
        seconds: past it the caller goes on, and :meth:`unchanged` says no)."""
        with self.lock:
            if n.moving:
                self.moved.wait_for(lambda: not n.moving, timeout=wait)
            return n.path, n.moves

    def unchanged(self, n: Node, path: str | None, moves: int) -> bool:
        """T8: ``n`` still has ``path`` and no move of it began since :meth:`settled` said ``moves``."""
        with self.lock:
            return not n.moving and n.moves == moves and n.path == path

    def move(self, old: str, new: str) -> None:
        """A rename through the mount: ``old`` and its subtree now live at ``new`` (T3); reader
        nodes of either side are unmapped (T5: the next lookups make new ones), keeping their
        paths for opens already on their way."""
        with self.lock:
            self._drop_readers(old, True, renamed=True)
            self._drop_readers(new, True, renamed=True)
            following = self._take_followers(old)  # T9
            self._unfollow(new)
            for p in [new, *self._below(new)]:
                victim = self._pop(p)
                if victim is not None:
                    victim.path = None
                    victim.replaced = True  # T6: a request on it is answered ESTALE (look again)
            moving = [(p, self._pop(p)) for p in [old, *self._below(old)]]
            for p, m in moving:
                if m is not None:
                    m.path = new + p[len(old):]
                    self._put(m.path, m)
            self._refollow(following, old, new)

    def exchange(self, a: str, b: str) -> None:
        """RENAME_EXCHANGE: the nodes (and subtrees) at ``a`` and ``b`` swap names."""
        with self.lock:
            self._drop_readers(a, True, renamed=True)
            self._drop_readers(b, True, renamed=True)
            sides = [[(p, self._pop(p)) for p in [src, *self._below(src)]] for src in (a, b)]
            following = [self._take_followers(a), self._take_followers(b)]  # T9
            for (src, dst), side in zip(((a, b), (b, a)), sides, strict=True):
                for p, m in side:
                    if m is not None:
                        m.path = dst + p[len(src):]
                        self._put(m.path, m)
            self._refollow(following[0], a, b)
            self._refollow(following[1], b, a)

    def under(self, path: str) -> list[Node]:
        """Mapped nodes at ``path`` and below it, reader nodes included."""
        pre = path + "/" if path else ""
        with self.lock:
            got = [n for p in [path, *self._below(path)] if (n := self.by_path.get(p)) is not None]
            if self.readers:
                got += [r for p, r in self.readers.items() if p == path or p.startswith(pre)]
            if self.followers:
                got += [f for p, fs in self.followers.items() if p == path or p.startswith(pre) for f in fs]
            return got
