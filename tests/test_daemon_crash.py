"""kill -9 of the ckptfs daemon (at named protocol points and at random times),
then remount: the visible state is a prefix of the workload and nothing acked is lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, Mount, _env

from ckptfs import META_DIR, crashpoints

sys.path.insert(0, str(ROOT / "tests" / "workloads"))
from sequence import check_prefix_state, read_acks  # noqa: E402

STEPS = 8
WORKLOAD = str(ROOT / "tests" / "workloads" / "sequence.py")


def run_workload(m: Mount, ackfile: Path, steps: int = STEPS, timeout: float = 120,
                 env: dict[str, str] | None = None) -> int:
    r = subprocess.run([sys.executable, WORKLOAD, str(m.path), str(ackfile), str(steps)],
                       capture_output=True, env={**_env(), **(env or {})}, timeout=timeout)
    return r.returncode


def staging_empty(backing: Path) -> bool:
    return os.listdir(backing / META_DIR / "staging") == []


POINTS = [p for p in crashpoints.POINTS if p != "recovery_replayed"]


@pytest.mark.parametrize("commit", ["sync", "async"])
@pytest.mark.parametrize("point", POINTS)
def test_crash_at_protocol_point(tmp_path: Path, point: str, commit: str) -> None:
    rng = random.Random(zlib.crc32(f"{point}-{commit}".encode()))
    d = tmp_path / "ckpts"
    d.mkdir()
    ack = tmp_path / "acks"
    # hit 1 of compact_snapshot is the compaction of the mount-time recovery
    # (an unlink, a mkdir and latest.tmp -> latest journal no intent since I8, fs.py: for this point the
    # pointer's temporary file is named so that its STEPS renames do)
    top = STEPS if point == "ns_intent_logged" else 3 * STEPS
    wenv = {"SEQ_POINTER_TMP": "latest.new"} if point == "ns_intent_logged" else None
    nth = rng.randint(2, 4) if point == "compact_snapshot" else rng.randint(1, top)
    env = {"CKPTFS_CRASH_AT": f"{point}:{nth}", "CKPTFS_COMPACT_EVERY": "5", **crashpoints.POINT_ENV.get(point, {})}
    m = Mount(d, commit=commit, env=env).start()
    try:
        rc = run_workload(m, ack, env=wenv)
        status = m.wait_dead(10)
        assert status == -signal.SIGKILL, f"crash point {point}:{nth} was not reached"
        assert rc != 0
        m.kill()
        m.remount(env=None)
        check_prefix_state(d, read_acks(ack))
        # the workload can continue after recovery
        rc2 = run_workload(m, tmp_path / "acks2", steps=STEPS + 2)
        assert rc2 == 0
        assert check_prefix_state(d, read_acks(tmp_path / "acks2")) == STEPS + 1
    finally:
        m.stop()
    assert staging_empty(d)


def test_crash_during_recovery_is_idempotent(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    ack = tmp_path / "acks"
    m = Mount(d, env={"CKPTFS_CRASH_AT": "intent_logged:5", **crashpoints.POINT_ENV["intent_logged"]}).start()
    try:
        run_workload(m, ack)
        m.wait_dead()
        m.kill()
        m.env = {"CKPTFS_CRASH_AT": "recovery_replayed"}
        with pytest.raises(RuntimeError):
            m.start()
        m.wait_dead()
        m.env = None
        m.start()
        check_prefix_state(d, read_acks(ack))
    finally:
        m.stop()
    assert staging_empty(d)


@pytest.mark.parametrize("commit", ["sync", "async"])
def test_daemon_killed_at_random_times(tmp_path: Path, commit: str) -> None:
    rng = random.Random(7 if commit == "sync" else 8)
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d, commit=commit)
    acked: list[int] = []
    try:
        latest = -1
        for trial in range(6):
            m.start()
            ack = tmp_path / f"acks{trial}"
            w = subprocess.Popen([sys.executable, WORKLOAD, str(d), str(ack), str(STEPS), str(latest + 1)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
            time.sleep(rng.uniform(1.0, 2.5))  # torch import ~1 s, then saves
            m.kill(detach=False)
            w.wait(60)  # the writer fails with ENOTCONN; detached earlier, it could write past ckptfs
            m.detach()
            m.start()
            acked += read_acks(ack)
            latest = check_prefix_state(d, acked)  # resume from the newest visible step
            m.stop()
            assert staging_empty(d)
    finally:
        m.stop()


def test_the_staging_pool_gives_new_files_their_own_times_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Issue 27, engine/pool.py: new versions take empty files made ahead in ``.ckptfs/staging``.  A
    file made from one has its creation's mode and times, not the pooled file's (P2); the pool holds
    nothing after a clean unmount, and recovery deletes what a killed daemon left there (P1), as it
    deletes ``staging/``."""
    d, b = tmp_path / "ckpts", tmp_path / "backing"  # (in place, .ckptfs is hidden under the mount)
    d.mkdir()
    b.mkdir()
    pool = b / META_DIR / "staging"  # (made there under their versions' names: no rename, P1)
    m = Mount(d, backing=b).start()
    try:
        (m.path / "first.txt").write_bytes(b"1")  # starts the pool's thread
        deadline = time.monotonic() + 10
        while len(os.listdir(pool)) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(os.listdir(pool)) >= 8, os.listdir(pool)
        time.sleep(1.2)  # the pooled files are older than what is made from them now
        t0 = time.time()
        fd = os.open(m.path / "new.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        os.close(fd)
        st = os.stat(m.path / "new.txt")
        assert st.st_size == 0 and st.st_mode & 0o7777 == 0o640
        for t in (st.st_mtime, st.st_atime, st.st_ctime):
            assert t >= t0 - 0.05, (t, t0)  # its creation's time, not the pooled file's
        assert json.loads(os.getxattr(m.path, "user.ckptfs.stats")).get("staging_pool_taken", 0) >= 1
        m.stop()
        assert os.listdir(pool) == [] and staging_empty(b)  # clean stop: P1
        m.start()
        (m.path / "second.txt").write_bytes(b"2")
        deadline = time.monotonic() + 10
        while not os.listdir(pool) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(pool)
        m.kill()
        assert os.listdir(pool)  # a crash leaves them ...
        m.start()
        assert os.listdir(pool) == []  # ... recovery deletes them (this daemon makes its own at its first write)
        assert (m.path / "second.txt").read_bytes() == b"2" and staging_empty(b)
    finally:
        m.stop()
    assert os.listdir(pool) == [] and staging_empty(b)


def _close_files(root: Path, names: list[str]) -> dict[str, bytes]:
    out = {}
    for i, n in enumerate(names):
        data = os.urandom(1000 + 97 * i)
        with open(root / n, "wb") as f:
            f.write(data)
        out[n] = data
    return out


@pytest.mark.parametrize("point", ["stage_synced", "intent_logged", "installed", "dir_synced"])
def test_a_daemon_killed_inside_an_async_group_commit_leaves_a_prefix_of_its_closes(tmp_path: Path,
                                                                                     point: str) -> None:
    """C5 (engine/commit.py): twelve files closed back to back in two directories form one group
    commit (the committer held until the fsync); the daemon is killed at each step of it.  Before
    the batch's intent is durable none of them is installed, from it on recovery finishes every
    rename: all twelve, whole, with their records.  Never some of them."""
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d, commit="async", env={"CKPTFS_HOLD_COMMITS": "1", "CKPTFS_CRASH_AT": f"{point}:1"}).start()
    try:
        (m.path / "a").mkdir()
        (m.path / "b").mkdir()
        names = [f"{'ab'[i % 2]}/f{i}.dat" for i in range(12)]
        written = _close_files(m.path, names)
        with pytest.raises(OSError):  # the fsync runs the group commit, and the daemon dies in it
            fd = os.open(m.path / "a", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        assert m.wait_dead(10) == -signal.SIGKILL, f"crash point {point} was not reached"
        m.kill()
        m.remount(env=None)
        present = [n for n in names if (d / n).exists()]
        assert present == (names if point != "stage_synced" else []), present
        for n in present:
            assert (m.path / n).read_bytes() == written[n]
            assert os.getxattr(str(m.path / n), "user.ckptfs.status") == b"committed"
    finally:
        m.stop()
    assert staging_empty(d)
