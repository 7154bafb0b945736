"""Inode numbers the mount reports (``use_ino``): stable across versions, unique, shared by hard links.

ckptfs commits a rewrite by installing a new backing file (stage + rename), so the backing inode
number of a path changes with every commit.  Tools notice: SQLite takes a database whose
``stat().st_ino`` differs from the one it opened for a moved file and turns read-only; ``git clone
--local``, ``tar`` and ``rsync -H`` compare inode numbers of hard links.  So the mount reports, for
each backing inode, the number of the file's *first* version while the file lives on through new
versions (``carry``), and the backing number otherwise (hard links share it).

Invariants:

N1  While a file is rewritten through the mount, its reported ``st_ino`` does not change.
N2  Two live files never report the same number: a backing inode that reuses a number still
    reported for another file (its old inode was freed and reused) gets a fresh virtual number
    from a range above every real one.
N3  A version of a file with more than one name (a hard link) is not carried: the rewrite breaks
    the link (docs/design.md), so it must not report the other name's number.
"""

from __future__ import annotations

import collections
import threading

VIRTUAL_BASE = 1 << 62


class InodeMap:
    def __init__(self) -> None:
        self.alias: dict[int, int] = {}  # backing ino -> reported ino (absent: reported as itself)
        self.held: collections.Counter[int] = collections.Counter()  # reported ino -> backing inos holding it
        self.next_virtual = VIRTUAL_BASE
        self.lock = threading.Lock()

    def _set(self, b: int, r: int) -> None:
        old = self.alias.get(b)
        if old is not None:
            self.held[old] -= 1
            if self.held[old] <= 0:
                del self.held[old]
        self.alias[b] = r
        self.held[r] += 1

    def reported(self, b: int) -> int:
        """The st_ino the mount shows for backing inode ``b``."""
        with self.lock:
            r = self.alias.get(b)
            if r is not None:
                return r
            if b in self.held:  # reused number, still shown for another file (N2)
                r = self.next_virtual
                self.next_virtual += 1
                self._set(b, r)
                return r
            return b

    def carry(self, new: int, old: int, old_nlink: int) -> None:
        """``new`` is a new version of the file whose current backing inode is ``old`` (N1, N3)."""
        if old_nlink != 1 or new == old:
            return
        r = self.reported(old)
        with self.lock:
            self._set(old, r)  # the current holder, explicitly (so its number is not taken as reused)
            self._set(new, r)

    def drop(self, b: int) -> None:
        """Backing inode ``b`` no longer has a name in the mount (replaced, discarded, unlinked)."""
        with self.lock:
            r = self.alias.pop(b, None)
            if r is not None:
                self.held[r] -= 1
                if self.held[r] <= 0:
                    del self.held[r]
