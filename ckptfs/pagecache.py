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

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fs import CkptFS, Handle


class PageCachePolicy:
    """Per-path bookkeeping of which version's pages the kernel may hold."""

    def __init__(self, fs: CkptFS) -> None:
        self.fs = fs
        self.lock = threading.Lock()
        self.clean: dict[str, tuple] = {}

    def _key(self, h: Handle) -> tuple | None:
        if h.writable or h.version is not None or h.fd is None:
            return None
        chk = self.fs.integrity.checks.get(h.fd)
        if chk is None:
            return None
        return chk.key

    def decide(self, fh: int) -> bool:
        """keep_cache for the open that just returned ``fh`` (see module doc)."""
        h = self.fs.handles.get(fh)
        if h is None:
            return False
        with self.lock:
            mine = self._key(h)
            same = mine is not None
            if same:
                for f, o in list(self.fs.handles.items()):
                    if f != fh and o.path == h.path and self._key(o) != mine:
                        same = False
                        break
            keep = same and self.clean.get(h.path) == mine
            if same:
                self.clean[h.path] = mine  # type: ignore[assignment]
            else:
                self.clean.pop(h.path, None)
            if keep:
                self.fs.stats["keep_cache_opens"] += 1  # root user.ckptfs.stats
            return keep

    def forget(self, *paths: str) -> None:
        """Namespace change at ``paths``: drop their entries and their subtrees'."""
        norm = [p.strip("/") for p in paths]
        with self.lock:
            for k in list(self.clean):
                if any(k == p or k.startswith(p + "/") or p == "" for p in norm):
                    del self.clean[k]
