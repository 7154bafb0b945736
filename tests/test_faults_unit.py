"""I/O errors at every backing-store call of a save (no mount: CkptFS directly).

For each N, the N-th mutating backing call during an overwrite fails with EIO
or ENOSPC.  Required: the error reaches the caller; the path holds the old
version, or (only when the failure came after the atomic rename) the complete
new one; staging space is reclaimed; other paths keep working; a restart
(recovery) agrees.  The sweep itself is ``campaigns/faultsweep.py`` (also run
by ``scripts/reliability_report`` for the I/O-error matrix).
"""

from __future__ import annotations

import errno

import pytest

from campaigns import faultsweep


@pytest.mark.parametrize("keep", [None, 1], ids=["default", "keep1"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_error_at_every_call_of_an_overwrite(tmp_path, err: int, mode: str, keep: int | None) -> None:
    """``keep``: the file outside groups keeps no generation by default (its install journals
    nothing before the rename, and an unsynced "done" entry after it); with
    ``--keep-generations 1`` it journals an intent that carries the generation instead."""
    outcomes = faultsweep.sweep(tmp_path, mode, err, keep)
    assert len(outcomes) >= 6
    assert faultsweep.violations(outcomes, err) == []
    s = faultsweep.summary(outcomes)
    # every error reaches the caller, but for ENOSPC setting the record on the file (a full xattr
    # block: journaled instead, the save completes) and for the "done" entry written after a
    # durable install (the file carries its record: the save succeeded); faultsweep's two designed
    # exceptions
    assert s["errors_surfaced"] + s["absorbed_by_fallback"] + s["after_install"] == s["calls_swept"] \
        == len(outcomes)
    assert s["absorbed_by_fallback"] == (1 if err == errno.ENOSPC else 0)
    assert s["after_install"] == (1 if keep is None else 0), s
    assert s["partial_visible"] == 0 and s["old_intact"] >= 1
