"""Writers killed mid-save (SIGKILL, SIGTERM, SIGINT) never leave a torn file."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, Mount

from campaigns.common import ForkServer

sys.path.insert(0, str(ROOT / "tests" / "workloads"))
import saver  # noqa: E402

TRIALS = {signal.SIGKILL: 60, signal.SIGTERM: 25, signal.SIGINT: 25}


def stats(m: Mount) -> dict:
    return json.loads(os.getxattr(str(m.path), "user.ckptfs.stats"))


@pytest.mark.portable
@pytest.mark.parametrize("sig", list(TRIALS), ids=lambda s: signal.Signals(s).name)
def test_killed_writer_leaves_old_or_new(mnt: Mount, sig: int, tmp_path: Path) -> None:
    rng = random.Random(1000 + sig)
    path = mnt.path / "latest.pt"
    marker = tmp_path / "marker"
    os.mkfifo(marker)
    mfd = os.open(marker, os.O_RDONLY | os.O_NONBLOCK)
    fs = ForkServer("saver")
    try:
        pid = fs.call("saver.save_gens", str(path), 0, 1)
        assert fs.reap(pid) == 0
        assert saver.check(str(path)) == 1
        gen = 1
        interrupted = 0
        aborts0 = stats(mnt).get("aborts", 0)
        for trial in range(TRIALS[sig]):
            if trial % 2:
                # aimed: the file is open and its save has begun (the marker byte), the kill lands
                # within a few ms: mid-write.  (With writer passthrough the bytes reach the disk so
                # fast that a kill at a random time lands mostly in the close's commit, which then
                # completes: ~13% of random kills were mid-write, against ~35% before.)
                _drain(mfd)  # what an earlier saver wrote after its last mark was read
                pid = fs.call("saver.save_gens", str(path), gen, 40, "ckptfs", str(marker))
                _await_marks(mfd, rng.randint(1, 3))
                time.sleep(rng.uniform(0.0, 0.003))
            else:  # anywhere: starting, writing, closing (the commit runs on), between saves
                pid = fs.call("saver.save_gens", str(path), gen, 40)
                time.sleep(rng.uniform(0.0, 0.35))
            os.kill(pid, sig)
            status = fs.reap(pid)
            if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
                interrupted += 1
            got = saver.check(str(path))  # loads bit-exact or raises
            assert gen <= got <= gen + 40
            assert os.getxattr(str(path), "user.ckptfs.status") == b"committed"
            gen = got
        aborted = stats(mnt).get("aborts", 0) - aborts0
        # the campaign must actually hit saves in progress, or it proves nothing
        assert interrupted >= TRIALS[sig] * 0.8
        # ~35-40% of kills land mid-write (load-dependent).  With 25 trials a 30% bar failed about one
        # run in five on correct code (7 of 25 seen); at least 4 (P < 0.5% for a 35% rate) still proves
        # the kills hit saves in progress.  60 SIGKILL trials keep the 30% bar.
        need = TRIALS[sig] * 0.3 if TRIALS[sig] >= 60 else 4
        assert aborted >= need, f"only {aborted} saves were cut mid-write"
        staged = [p for p in os.listdir(mnt.path) if p != "latest.pt"]
        assert staged == []
    finally:
        fs.close()
        os.close(mfd)


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            return


def _await_marks(fd: int, n: int, timeout: float = 30.0) -> None:
    """Read ``n`` marker bytes from the FIFO ``fd`` (non-blocking: it reads EOF until the saver
    opens its end)."""
    got, deadline = 0, time.monotonic() + timeout
    while got < n:
        try:
            b = os.read(fd, n - got)
        except BlockingIOError:
            b = b""
        got += len(b)
        if got < n:
            if time.monotonic() > deadline:
                raise AssertionError("the saver never began a save")
            time.sleep(0.0005)


@pytest.mark.portable
def test_keyboard_interrupt_partial_torch_zip_refused(mnt: Mount) -> None:
    """Ctrl-C inside torch.save closes normally after a partial write: refused, old kept."""
    path = mnt.path / "m.pt"
    fs = ForkServer("saver")
    try:
        pid = fs.call("saver.save_gens", str(path), 0, 1)
        fs.reap(pid)
        prev = 1
        for i in range(15):
            pid = fs.call("saver.save_gens", str(path), i + 1, 1)
            time.sleep(0.005 + 0.003 * i)
            os.kill(pid, signal.SIGINT)
            fs.reap(pid)
            g = saver.check(str(path))
            assert g in (prev, i + 2)
            prev = g
        aborts = json.loads(os.getxattr(str(mnt.path), "user.ckptfs.aborts"))
        refused = sum("torch archive" in a["reason"] or "zip" in a["reason"] for a in aborts)
        assert refused >= 1, aborts
        assert any(a["path"] == "m.pt" for a in aborts)
    finally:
        fs.close()
