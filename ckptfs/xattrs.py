"""Every ``user.ckptfs.*`` extended attribute, and the rules for presenting them.

Status is shown through extended attributes so any tool reads it (``getfattr -n
user.ckptfs.status``), as S3QL controls its filesystem through xattrs.  The daemon (facade) fills
in the values; the command line reads them by the same names; nothing else spells them.

Presentation rules (invariants, tests/test_transparency.py):

* The attributes are *virtual*: readable by name, never listed, never stored, so ``cp -a``,
  ``rsync -aX`` and ``tar --xattrs`` neither copy them nor try to remove them (as CephFS does
  with ``ceph.*``).  Setting one is EPERM (read-only), removing one ENODATA.
* The control verbs are set, never read: :data:`X_SEAL` on a directory seals it as a group,
  :data:`X_GC` on the root deletes quarantined groups (root or the mount's owner only; the value
  ``dry-run`` deletes nothing), and :data:`X_GC_REPORT` then says what it deleted (or would),
  :data:`X_CONTROL` (``verify`` / ``scrub``) runs an integrity check.
* With ``--allow-other``, a caller other than root or the mount root's owner sees in the root's
  aggregate attributes only entries about paths whose directory it may read
  (:func:`for_caller`), and never the daemon-wide detail (metadata problems, scrub findings).
"""

from __future__ import annotations

import json
from collections.abc import Callable

PREFIX = "user.ckptfs."
VALUE_MAX = 60000  # Linux caps an xattr value at 64 KiB

X_ATTRS = PREFIX + "attrs"  # every status attribute of a path, as one JSON object (`ckptfs show`)

# -- on the mount root
X_VERSION = PREFIX + "version"
X_PID = PREFIX + "pid"  # the daemon's pid (`ckptfs umount` waits for it)
X_COMMIT_MODE = PREFIX + "commit_mode"
X_BACKING = PREFIX + "backing"
X_STATS = PREFIX + "stats"  # JSON counters
X_ABORTS = PREFIX + "aborts"  # JSON: the last versions not committed, and why
X_RULES = PREFIX + "rules"
X_CORRUPT = PREFIX + "corrupt"  # JSON: the last corruption findings
X_METADATA = PREFIX + "metadata"  # JSON: untrusted metadata found by recovery
X_SCRUB = PREFIX + "scrub"  # JSON: scrubber state and findings
X_ON_CORRUPT = PREFIX + "on_corrupt"
X_KEEP_GENERATIONS = PREFIX + "keep_generations"
X_GC_REPORT = PREFIX + "gc_report"  # JSON: what the last gc (or dry run) deleted, bytes freed
X_SPACE = PREFIX + "space"  # JSON: bytes ckptfs holds out of sight (generations, quarantine, staging, trash)
# the tiered mirror (ckptfs/mirror): on the root, JSON (where, backlog, pinned bytes, alert); on a
# sealed group, its upload state: pending / uploading k/n / waiting for other nodes / committed / failed: why
X_MIRROR = PREFIX + "mirror"

# -- on a directory (the root too)
X_QUARANTINE = PREFIX + "quarantine"  # JSON: what was moved out of sight from it, why, when, kept where

# -- on a directory
X_GROUPS = PREFIX + "groups"  # JSON: the groups directly in it
X_GROUP = PREFIX + "group"  # JSON: the group it is

# -- on a group or a file
X_STATUS = PREFIX + "status"  # see STATUS_VALUES
X_LINEAGE = PREFIX + "lineage"
X_MANIFEST_FILES = PREFIX + "manifest_files"
X_ERROR = PREFIX + "error"
X_BLAKE3 = PREFIX + "blake3"
X_SIZE = PREFIX + "size"
X_GENERATION = PREFIX + "generation"
X_COMMITTED_AT = PREFIX + "committed_at"
X_LAST_ABORT = PREFIX + "last_abort"
X_VERIFIED = PREFIX + "verified"
X_ROLLBACK = PREFIX + "rollback"
X_KEPT_GENERATIONS = PREFIX + "kept_generations"

# -- control verbs (setfattr)
X_SEAL = PREFIX + "seal"
X_GC = PREFIX + "gc"
X_CONTROL = PREFIX + "control"
CONTROL_VERBS = (X_SEAL, X_GC, X_CONTROL)

# values of X_STATUS (a group's: open / sealed / corrupt; a file's: the rest)
STAGING = "staging"  # a new version is being written
COMMITTED = "committed"
UNTRACKED = "untracked"  # written past ckptfs (while unmounted): no record
CORRUPT = "corrupt"  # failed verification
STATUS_VALUES = ("open", "sealed", CORRUPT, STAGING, COMMITTED, UNTRACKED)

# root attributes about other paths (filtered per caller) and daemon-wide ones (root only)
_PER_PATH_LISTS = (X_ABORTS, X_CORRUPT)
_DAEMON_WIDE = (X_METADATA, X_SCRUB, X_GC_REPORT, X_MIRROR, X_SPACE)


def is_status_name(name: str) -> bool:
    return name.startswith(PREFIX)


def short(name: str) -> str:
    """``user.ckptfs.status`` -> ``status`` (command-line output)."""
    return name.removeprefix(PREFIX)


def as_json(attrs: dict[str, str]) -> bytes:
    """The value of :data:`X_ATTRS`."""
    return json.dumps(attrs, sort_keys=True).encode()


def for_caller(attrs: dict[str, str], path: str, privileged: bool,
               may_read_dir: Callable[[str], bool]) -> dict[str, str]:
    """Status attributes of ``path`` as a caller may see them (module doc).  ``privileged``: root
    or the mount root's owner; ``may_read_dir(d)``: whether the caller may list ``d`` and search
    every directory above it."""
    if path != "" or privileged:
        return attrs
    out = dict(attrs)
    for name in _PER_PATH_LISTS:
        if name in out:
            try:
                events = json.loads(out[name])
                out[name] = json.dumps([e for e in events if isinstance(e, dict)
                                        and may_read_dir(_dirname(str(e.get("path", ""))))])
            except ValueError:
                out[name] = "[]"
    for name in _DAEMON_WIDE:
        out.pop(name, None)
    return out


def _dirname(path: str) -> str:
    return path.rpartition("/")[0]
