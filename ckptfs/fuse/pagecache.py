"""When an open may keep the kernel's page cache of a file (``fuse_file_info.keep_cache``).

Without ``keep_cache`` the kernel drops the cached pages of a FUSE inode on
every open, so a second ``torch.load`` of an unchanged checkpoint goes through
the daemon again (read + verify-on-read lookups + copies).  With it, the kernel
serves the pages it already has.  That is only safe if those pages are exactly
the bytes the new open would be served.

The kernel's page cache belongs to the FUSE inode of a path (libfuse's
high-level API gives one node per name; a rename through the mount moves the
node, an install behind it - the staged file renamed over the backing path -
does not).  Pages enter it only through handles open on that inode: reads
(``read`` of a committed file returns verified bytes only, integrity.py) and
writes (copied into the page cache by the kernel on the way to the daemon).

Rule (``decide``, called once per open/create, after the handle exists):

* a handle has a *cache key* only if it is a read-only handle of a committed
  file bound to a verification state (``integrity.Check``): the version key
  (inode, size, mtime, ctime, record digest, generation) it is verified
  against.  Writable handles, staged (read-your-writes) versions, untracked
  files and committed-view handles have none.
* ``clean[path] = key`` means: since the last open of ``path`` that made the
  kernel drop its pages, every handle open on the path had exactly this key,
  so every cached page is a verified byte of that version.
* an open keeps the cache iff its key equals ``clean[path]`` *and* every other
  handle now open on the path has the same key.  Otherwise it does not keep
  the cache (the kernel drops the pages at this open) and ``clean[path]``
  becomes its key if all open handles share it, or is removed.

Consequences: a new install, a rollback to a kept generation, a touch/chmod, a
file changed behind ckptfs' back, a version re-verified after a change all give
another key, hence an invalidating open; any writer, staged version or
foreign handle on the path removes the entry while it is open and an
invalidating open is needed after it; quarantine, refusal and unpublishing
never make an unverified or unpublished byte reachable because the key
of what an open serves is checked, not the history of the path.  Namespace
changes through the mount (rename, unlink, rmdir) drop the entries of both
names and their subtrees (``forget``), since a renamed node carries its pages
to the new name.

Invariant: ``keep_cache`` is set only when every page the kernel may hold for
the inode was read, verified, through a handle of the very version key the
new open serves.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable


class PageCachePolicy:
    """Per-path bookkeeping of which version's pages the kernel may hold.

    Explicit dependencies, no reference to the filesystem object: ``served(fh)`` gives the path an
    open handle is at and the verified version key it serves (None: a writer, a staged version, an
    unverified file), ``handles_at(path)`` the open handles at a path."""

    def __init__(self, served: Callable[[int], tuple[str, tuple | None] | None],
                 handles_at: Callable[[str], list[int]], stats: collections.Counter[str]) -> None:
        self.served = served
        self.handles_at = handles_at
        self.stats = stats
        self.lock = threading.Lock()
        self.clean: dict[str, tuple] = {}

    def decide(self, fh: int) -> bool:
        """keep_cache for the open that just returned ``fh`` (see module doc)."""
        got = self.served(fh)
        if got is None:
            return False
        path, mine = got
        # the callbacks take the filesystem's lock: never under ours (a forget runs under theirs, from
        # an event emitted by an install: an open and a commit deadlocked the daemon under fsstress)
        same = mine is not None
        if same:
            for f in self.handles_at(path):
                o = self.served(f) if f != fh else None
                if o is not None and o[1] != mine:
                    same = False
                    break
        with self.lock:
            keep = same and self.clean.get(path) == mine
            if same:
                self.clean[path] = mine  # type: ignore[assignment]
            else:
                self.clean.pop(path, None)
            if keep:
                self.stats["keep_cache_opens"] += 1  # root user.ckptfs.stats
            return keep

    def forget(self, *paths: str) -> None:
        """Namespace change at ``paths``: drop their entries and their subtrees'."""
        norm = [p.strip("/") for p in paths]
        with self.lock:
            for k in list(self.clean):
                if any(k == p or k.startswith(p + "/") or p == "" for p in norm):
                    del self.clean[k]
