"""What an unmounted ckptfs directory holds, read from its metadata without changing anything.

Used by the command line and by the Python API (:mod:`ckptfs.api`) where no daemon serves the
directory: the snapshot and journal are replayed read-only (no recovery runs)."""

from __future__ import annotations

from collections.abc import Callable

from ckptfs.backing import OsBackingStore
from ckptfs.engine.replay import Replayed, replay
from ckptfs.engine.seals import OPEN, TORN
from ckptfs.log.journal import Journal
from ckptfs.log.metadata import load_trusted


def state(root: str, warn: Callable[[str], None] = lambda p: None) -> Replayed:
    """Records, groups and the quarantine table of the unmounted directory ``root``.

    Groups still open here were torn by a crash; the next mount quarantines them (or rolls a torn
    re-save back), so they are labelled torn here.  A directory made by mkdir that never held a
    checkpoint file is no group (issue 10).  ``warn`` hears each metadata problem (the result is
    then partial)."""
    store = OsBackingStore(root)
    try:
        r = replay(load_trusted(Journal(store)), last="apply")
    finally:
        store.shutdown()
    for p in r.problems:
        warn(p)
    groups = r.groups
    for p in [p for p, g in groups.items() if g.state == OPEN and g.tentative]:
        del groups[p]
    for g in groups.values():
        if g.state == OPEN:
            g.state, g.reason = TORN, "not sealed before the daemon stopped (recovery will quarantine it)"
    return r
