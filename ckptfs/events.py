"""What changed: the core announces it, adapters and the mirror subscribe.

The filesystem changes what a path shows in two ways: in answer to a request for that path (a
write, a rename: the kernel already knows), and on its own (a dying writer's version unpublished,
a torn group quarantined, retention, a rollback, an abandoned deletion undone, an asynchronous
install, an idle seal).  Every change of either kind emits one :class:`Event` here, once the
change is in effect: an install's event follows its rename (also when the directory fsync after
it failed: the path shows the new version, and the writer got the error).  Subscribers are the kernel-cache
invalidation of a transport (it must notify the kernel from another thread than the one serving
the request: a subscriber must not block) and, later, the mirror (it uploads sealed groups).

Invariant (E3): no daemon-initiated change of what a path shows is made without an event naming
that path (tests/test_events.py).  Subscribers run synchronously on the thread that made the
change, possibly with the engine's locks held: they only record or enqueue; an exception in one is
logged and never reaches the filesystem.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("ckptfs.events")

PUBLISHED = "published"  # a new committed version of a file is in place (install)
UNPUBLISHED = "unpublished"  # a staged version readers saw is gone (writer killed, refused, failed)
SEALED = "sealed"  # a directory became (or stayed, resealed) a sealed group
QUARANTINED = "quarantined"  # a group moved to .ckptfs/quarantine (torn or corrupt): its path is gone
REMOVED = "removed"  # a group deleted by the daemon (retention, a finished abandoned deletion)
RESTORED = "restored"  # a group put back (an abandoned deletion undone)
ROLLED_BACK = "rolled_back"  # a torn re-save replaced by the group's sealed files (G11)
RENAMED = "renamed"  # path moved to dst
RELEASED = "released"  # a directory stopped being a group (no checkpoint in it): an ordinary directory again
OPENED = "opened"  # a directory became an open group: what it shows is checked on access from now on (torn)
CORRUPT = "corrupt"  # a committed file found corrupt: reads fail, or a kept generation is served instead
# a checkpoint file's O_TRUNC rewrite begins: from now until it is sealed other processes see the
# committed version (V1), and the path answers per caller (emitted on the writer's request thread)
REWRITING = "rewriting"
KINDS = (PUBLISHED, UNPUBLISHED, SEALED, QUARANTINED, REMOVED, RESTORED, ROLLED_BACK, RENAMED, RELEASED, OPENED,
         CORRUPT, REWRITING)


@dataclass(frozen=True)
class Event:
    kind: str
    path: str  # mount-relative, "" is the root
    dst: str = ""  # RENAMED: the new path; QUARANTINED: where it went under .ckptfs
    reason: str = ""


Subscriber = Callable[[Event], None]


class Events:
    """A synchronous publish/subscribe hub (one per filesystem)."""

    def __init__(self) -> None:
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(event)`` for every event from now on; returns the unsubscribe function."""
        with self._lock:
            self._subs = [*self._subs, fn]

        def unsubscribe() -> None:
            with self._lock:
                self._subs = [s for s in self._subs if s is not fn]

        return unsubscribe

    def emit(self, kind: str, path: str, dst: str = "", reason: str = "") -> None:
        assert kind in KINDS, kind
        ev = Event(kind, path, dst, reason)
        log.debug("event %s %s%s%s", kind, path, f" -> {dst}" if dst else "", f" ({reason})" if reason else "")
        for fn in self._subs:  # (a copy-on-write list: no lock needed to read it)
            try:
                fn(ev)
            except Exception:  # a subscriber never breaks the filesystem
                log.exception("event subscriber failed on %s", ev)
