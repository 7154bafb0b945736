"""Named crash points of the commit protocol, for kill-the-daemon tests.

Set ``CKPTFS_CRASH_AT=name`` (or ``name:N`` for the N-th hit) in the daemon's
environment; when execution reaches that point the daemon SIGKILLs itself,
exactly like a power cut of the process (no cleanup, no flush).
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = (
    "stage_synced",        # staged data fsynced, no intent yet
    "intent_logged",       # install intent durable in the journal, not renamed
    "installed",           # renamed into place, parent dir not yet fsynced
    "dir_synced",          # parent dir fsynced, in-memory state not updated
    "ns_intent_logged",    # namespace op (unlink/rename/mkdir/...) intent durable, op not done
    "ns_done",             # namespace op done, dir not yet fsynced
    "compact_snapshot",    # new snapshot written, old journal not yet removed
    "recovery_replayed",   # recovery finished the in-flight op, before compaction
)

#: environment a point needs to be reached by a workload of new small files (tests, campaigns):
#: ``intent_logged`` sits on the install path that journals an intent before the rename (a record
#: too large to travel with its file, a backing fs without user xattrs, a kept generation), which
#: CKPTFS_CARRY_RECORDS=0 makes every install take
POINT_ENV: dict[str, dict[str, str]] = {"intent_logged": {"CKPTFS_CARRY_RECORDS": "0"}}

GROUP_POINTS = (
    "group_commit_written",  # manifest + COMMIT durable, group_seal not yet journaled
    "retire_moved",          # retention moved a group to trash, not yet deleted
    "rollback_logged",       # group_rollback durable in the journal, nothing moved yet
)

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get("CKPTFS_CRASH_AT")
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    return name, int(nth or 1)


def hit(name: str) -> None:
    """Die here if this is the configured crash point."""
    target = _target()
    if target is None or target[0] != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] == target[1]:
            os.kill(os.getpid(), signal.SIGKILL)
