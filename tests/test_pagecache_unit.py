"""The page-cache policy never calls back into the filesystem while holding its own lock.

Its ``forget`` runs under the filesystem's lock (from the event an install emits), and ``decide``'s
callbacks take that lock: called under the policy's lock they made a lock-order cycle, and a mount
under fsstress -p 4 deadlocked (an open waiting in ``handles_at``, a commit in ``forget``).  No
mount: the invariant itself, checked at every callback.  The mounted run is
``tests/test_fsx.py::test_fsstress_as_natively``.
"""

from __future__ import annotations

import collections

from ckptfs.fuse.pagecache import PageCachePolicy


def test_decide_calls_back_without_its_lock_held() -> None:
    calls: list[bool] = []
    pc: PageCachePolicy

    def served(fh: int) -> tuple[str, tuple | None]:
        calls.append(pc.lock.locked())
        return "m.pt", ("ino", 1)

    def handles_at(path: str) -> list[int]:
        calls.append(pc.lock.locked())
        return [1, 2, 3]

    pc = PageCachePolicy(served, handles_at, collections.Counter())
    assert pc.decide(1) is False  # the first open: nothing clean yet
    assert pc.decide(2) is True  # every handle serves one verified version: keep the cache
    pc.forget("m.pt")
    assert pc.decide(3) is False
    assert calls and not any(calls), "a callback ran with the policy's lock held"
