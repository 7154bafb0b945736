"""What other processes see of a file being written, and what a killed writer leaves behind.

**Checkpoint file** (the one definition, :meth:`Visibility.checkpoint_file`): a regular file

* whose name is one a checkpoint format uses (``rules.CHECKPOINT_FILES``: ``.pt .pth .bin
  .safetensors .ckpt .distcp .npy .npz .h5 .pkl ...``, DCP's ``.metadata``) or ends in ``.json``
  (``trainer_state.json``, ``config.json``, ``*.index.json``), or
* that is a pointer a group rule follows (``latest``, ``latest_checkpointed_iteration.txt``), or
* that lies inside a checkpoint group (open or sealed), whatever its name.

A file whose staged bytes start with a checkpoint serializer's signature (a zip archive as
``torch.save`` writes, ``\\x93NUMPY``, a safetensors header, a pickle, HDF5) is *format-aware*
too (:func:`format_of`): it is never prefix-committed (below), whatever its name.

**Reader isolation (V1).**  While a writer has a new version of a checkpoint file open (state
OPEN: not yet closed), every *other* process that looks the path up or opens it gets the last
committed version (ENOENT for a file that has none yet), exactly as with a native tmp + rename;
the writer process itself, its threads, and its descendants (children sharing its open file
or opening the path by name) see its own writes.  The version becomes visible to all when it is
sealed at close (sync: installed; async: queued, already complete).  A version opened for
append (``O_APPEND``) is a log, never isolated.  Other files keep POSIX visibility: a
``tail -f`` of a log sees every write at once.

**Killed writer (V2).**  A version whose writer is killed by a signal is all-or-nothing (the
previous committed version stays) unless it only *extends* the committed bytes: every write at
or past the committed size, nothing truncated below it (``O_APPEND``, or a new file written
from empty).  Such a version of a file that is neither a checkpoint file nor format-aware is
committed as it stands when its writer dies, as natively: the committed prefix of a log is a
valid log.  A truncating rewrite of existing bytes (a CSV rewritten whole) and every checkpoint
file stay all-or-nothing.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable

from ckptfs import procinfo
from ckptfs.engine.staged import NOBODY, OPEN, Caller, Version
from ckptfs.rules import CHECKPOINT_FILES, RuleSet

_NAME_RE = re.compile(rf"(?:{CHECKPOINT_FILES})|.*\.json", re.IGNORECASE)
ANCESTRY_DEPTH = 64  # how far up the parent chain a reader is looked for among the writer's descendants


def format_of(head: bytes) -> str | None:
    """The checkpoint serializer whose signature starts ``head`` (the first 16 bytes), or None."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"  # torch.save, .npz, Keras v3
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"  # torch's legacy format, pickle.dump
    if len(head) >= 10 and head[8:10] == b'{"':
        n = struct.unpack("<Q", head[:8])[0]
        if 2 <= n <= 100 << 20:
            return "safetensors"
    return None


class Visibility:
    """Decides V1 (which version a caller sees) and V2 (what a killed writer leaves).

    Explicit dependencies: ``rules`` (pointer names) and ``in_group(path)``, whether a live
    checkpoint group contains ``path`` (engine/groups.py)."""

    def __init__(self, rules: RuleSet, in_group: Callable[[str], bool]) -> None:
        self.rules = rules
        self.in_group = in_group

    def checkpoint_file(self, path: str) -> bool:
        base = os.path.basename(path)
        return (_NAME_RE.fullmatch(base) is not None or base in self.rules.pointer_names()
                or self.in_group(path))

    def isolated(self, v: Version, caller: Caller) -> bool:
        """Whether ``caller`` must not see version ``v`` (V1): v is still being written, it is a
        checkpoint file, not opened for append, and the caller is not its writer."""
        if v.state != OPEN or v.appending or v.in_place or caller is NOBODY or caller.pid <= 0:
            return False
        if caller.pid in v.writer_pids or caller.pid in v.sees or not self.checkpoint_file(v.path):
            return False
        if self.is_writer(v, caller.pid):
            v.sees.add(caller.pid)  # (thread ids are not reused while the version is open, in practice)
            return False
        return True

    @staticmethod
    def relation(v: Version, pid: int) -> str:
        """How the process of thread ``pid`` (FUSE reports the calling thread) relates to v:
        ``writer`` (it opened or wrote v), ``descendant`` (a child, grandchild... of a writer:
        it shares the writer's open file or inherited it), or ``other``."""
        return Visibility.family({procinfo.tgid(p) for p in list(v.writer_pids)}, pid)

    @staticmethod
    def family(writers: set[int], pid: int) -> str:
        """How thread ``pid`` relates to the processes ``writers`` (tgids): ``writer``,
        ``descendant`` or ``other`` (see :meth:`relation`)."""
        me = procinfo.tgid(pid)
        if me in writers:
            return "writer"
        for _ in range(ANCESTRY_DEPTH):
            up = procinfo.parent(me)
            if up is None or up <= 1 or up == me:
                return "other"
            if up in writers:
                return "descendant"
            me = up
        return "other"

    @classmethod
    def is_writer(cls, v: Version, pid: int) -> bool:
        """``pid`` belongs to a process writing v, or descends from one (it sees v, V1)."""
        return cls.relation(v, pid) != "other"

    def keeps_prefix(self, v: Version, head: bytes) -> bool:
        """V2: whether v, whose writer was killed, is committed as it stands (``head``: the first
        bytes of its staged data)."""
        return (v.extends and not v.unlinked and not self.checkpoint_file(v.path)
                and format_of(head) is None)
