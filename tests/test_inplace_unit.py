"""I7 (issue 24): a read-only handle of a file that another handle changes in place reads the
changed bytes at every moment of that change's commit, never the older file.

On the native transport both handles share one kernel inode: a short read from the older file in
the window between the seal and the install made the kernel shrink the writer's i_size, and fsx
(reopening its file beside a reader) died of SIGBUS on its mapping in 1 of 4 runs.  Here the core
alone (no mount): a store that reads through the reader's handle at every call the commit makes.
The mounted form is ``tests/test_fsx.py::test_fsx_beside_a_reader``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from ckptfs.backing import OsBackingStore
from ckptfs.fs import CkptFS


class ProbeStore:
    """Forwards every call; while ``probe`` is set, calls it before each store call made by another
    code path than the probe itself (the probe's own reads are not probed again)."""

    bypassable = False

    def __init__(self, inner: OsBackingStore) -> None:
        self.inner = inner
        self.probe: Any = None
        self.busy = threading.local()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*a: Any, **kw: Any) -> Any:
            p = self.probe
            if p is not None and not getattr(self.busy, "on", False):
                self.busy.on = True
                try:
                    p(name)
                finally:
                    self.busy.on = False
            return attr(*a, **kw)

        return call


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", ["c5.pt", "data.bin"])
def test_a_reader_reads_an_in_place_change_through_its_whole_commit(tmp_path, mode: str, name: str) -> None:
    store = ProbeStore(OsBackingStore(str(tmp_path)))
    fs = CkptFS(store, commit_mode=mode)  # type: ignore[arg-type]
    stuck = False
    try:
        fh = fs.create(name, 0o644)
        fs.write(fh, b"a" * 1000, 0)
        fs.flush(fh)
        fs.release(fh)
        r = fs.open(name, os.O_RDONLY)
        assert fs.read(r, 8192, 0) == b"a" * 1000
        new = b"b" * 3000
        w = fs.open(name, os.O_RDWR)  # no O_TRUNC: a change in place (Version.in_place)
        fs.write(w, new, 0)
        assert fs.read(r, 8192, 0) == new  # while it is open
        seen: list[tuple[str, bytes]] = []

        # the read runs inside the commit's own store calls (the commit's thread), at exactly the
        # moment of each one; a read that waits for a lock the commit holds would never return,
        # so the commit runs in a thread given a minute
        store.probe = lambda call: seen.append((call, fs.read(r, 8192, 0)))

        def commit() -> None:
            fs.flush(w)  # the commit: seal, syncs, install, journal
            fs.fsync(w)  # async: waits for the install

        t = threading.Thread(target=commit, daemon=True)
        t.start()
        t.join(60)
        stuck = t.is_alive()
        assert not stuck, "a read during the commit waited for the commit (deadlock)"
        store.probe = None
        assert len(seen) > 3, seen  # the commit made store calls, each one probed
        older = [(call, len(got)) for call, got in seen if got != new]
        assert older == [], f"the reader read the older file during the commit: {older}"
        assert fs.read(r, 8192, 0) == new and fs.getattr(name, r)["st_size"] == 3000
        fs.release(w)
        assert fs.read(r, 8192, 0) == new  # the writer gone: the installed file
        fs.release(r)
        assert (tmp_path / name).read_bytes() == new
    finally:
        store.probe = None
        if not stuck:  # (a deadlocked commit would hang the shutdown too)
            fs.shutdown()


def test_a_reader_released_while_it_is_moved_to_the_installed_file_keeps_no_fd(tmp_path) -> None:
    """``_follow_in_place`` opens the installed file for each reader handle outside the lock; a
    handle released meanwhile must be left alone.  Before, the new fd was put on the released handle:
    leaked, or, with the release still closing its fds in another thread, an fd closed twice (a
    reader's READ got EBADF: the number had been reused by a version's file)."""
    store = ProbeStore(OsBackingStore(str(tmp_path)))
    fs = CkptFS(store)
    try:
        fh = fs.create("m.bin", 0o644)
        fs.write(fh, b"a" * 1000, 0)
        fs.flush(fh)
        fs.release(fh)
        r = fs.open("m.bin", os.O_RDONLY)
        assert fs.read(r, 8192, 0) == b"a" * 1000
        w = fs.open("m.bin", os.O_RDWR)
        fs.write(w, b"b" * 3000, 0)
        released: list[str] = []

        def probe(call: str) -> None:
            if call == "open" and not released:  # the follow's open of the installed file
                released.append(call)
                fs.release(r)

        fds_before = len(os.listdir("/proc/self/fd"))
        store.probe = probe
        fs.flush(w)
        store.probe = None
        assert released, "the commit never reopened the file for its reader"
        fs.release(w)
        assert len(os.listdir("/proc/self/fd")) == fds_before - 2, "an fd was left open (or closed twice)"
    finally:
        store.probe = None
        fs.shutdown()
