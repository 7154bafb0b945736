"""Checkpoint groups on a real mount: sealing events, torn-group hiding, pointer
ordering, committed-only view, retention, CLI (ls/show/seal/gc/verify)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import Mount, _env, kill_if_running, release_and_reap, run_py

from ckptfs import META_DIR
from ckptfs.log.journal import decode_frames

VIEW = ".ckptfs-committed"


def status(p: Path) -> str:
    return os.getxattr(p, "user.ckptfs.status").decode()


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True, env=_env(),
                       timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"ckptfs {args} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return r


def save_hf_like(d: Path, step: int, marker: bool = True) -> dict:
    g = d / f"checkpoint-{step}"
    g.mkdir(parents=True)
    sd = {"w": torch.full((64,), float(step))}
    torch.save(sd, g / "model.pt")
    torch.save({"opt": torch.arange(8) * step}, g / "optimizer.pt")
    if marker:
        (g / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return sd


def journal_ops(backing: Path) -> list[dict]:
    frames: list[dict] = []
    for name in sorted(os.listdir(backing / META_DIR)):
        if name.startswith("journal."):
            frames += decode_frames((backing / META_DIR / name).read_bytes())[0]
    return frames


@pytest.mark.portable
def test_marker_seals_and_view_hides_open_group(mnt: Mount) -> None:
    d = mnt.path / "run"
    save_hf_like(d, 10)
    assert status(d / "checkpoint-10") == "sealed"
    save_hf_like(d, 20, marker=False)
    g20 = d / "checkpoint-20"
    assert status(g20) == "open"
    # read-your-writes in the normal view; the committed view hides the open group
    assert sorted(os.listdir(d)) == ["checkpoint-10", "checkpoint-20"]
    assert os.listdir(mnt.path / VIEW / "run") == ["checkpoint-10"]
    assert not (mnt.path / VIEW / "run" / "checkpoint-20").exists()
    assert VIEW not in os.listdir(mnt.path)
    # the view is read-only and serves the committed bytes
    sd = torch.load(mnt.path / VIEW / "run/checkpoint-10/model.pt")
    assert torch.equal(sd["w"], torch.full((64,), 10.0))
    with pytest.raises(OSError) as ei:
        (mnt.path / VIEW / "run/checkpoint-10/x").write_bytes(b"1")
    assert ei.value.errno == 30  # EROFS
    (g20 / "trainer_state.json").write_text("{}")
    assert status(g20) == "sealed"
    assert sorted(os.listdir(mnt.path / VIEW / "run")) == ["checkpoint-10", "checkpoint-20"]
    info = json.loads(os.getxattr(g20, "user.ckptfs.group"))
    assert info["files"] == 3 and info["rule"] == "hf-trainer" and info["step"] == 20
    lin = json.loads(os.getxattr(g20, "user.ckptfs.lineage"))
    assert lin["step"] == 20 and lin["parent"] == "run/checkpoint-10" and lin["pid"] > 0


@pytest.mark.portable
def test_torn_group_hidden_after_daemon_kill(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d).start()
    try:
        save_hf_like(d, 1)
        save_hf_like(d, 2, marker=False)  # the daemon dies before the marker
        m.kill()
        m.start()
        assert os.listdir(d) == ["checkpoint-1"]  # the torn group shows what was there before: nothing
        assert status(d / "checkpoint-1") == "sealed"
        rows = json.loads(cli("ls", str(d), "--all", "--json").stdout)
        assert [(r["step"], r["state"]) for r in rows] == [(1, "sealed"), (2, "torn")]
        assert "no COMMIT" in rows[1]["reason"]
        assert [r["step"] for r in json.loads(cli("ls", str(d), "--json").stdout)] == [1]
        # a new save at the torn group's name works (no collision with the quarantined copy)
        save_hf_like(d, 2)
        assert status(d / "checkpoint-2") == "sealed"
        cli("gc", str(d))
        rows = json.loads(cli("ls", str(d), "--all", "--json").stdout)
        assert [(r["step"], r["state"]) for r in rows] == [(1, "sealed"), (2, "sealed")]
    finally:
        m.stop()
    assert not os.listdir(d / META_DIR / "quarantine")


WRITER = r"""
import os, sys, time, torch
g = sys.argv[1]
os.makedirs(g)
torch.save({"w": torch.ones(4)}, os.path.join(g, "model.pt"))
print("ready", flush=True)
time.sleep(60)  # killed here, between two files of the group
"""


def test_group_of_killed_writer_hidden_live(mnt: Mount) -> None:
    save_hf_like(mnt.path, 5)
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(mnt.path / "checkpoint-6")], stdout=subprocess.PIPE,
                         text=True, env=_env())
    try:
        assert p.stdout.readline().strip() == "ready"
        assert status(mnt.path / "checkpoint-6") == "open"
        assert "checkpoint-6" in os.listdir(mnt.path)  # writer alive: still in progress
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    # every writer is gone and the group never sealed: the next listing no longer shows it
    assert os.listdir(mnt.path) == ["checkpoint-5"]
    rows = json.loads(cli("ls", str(mnt.path), "--all", "--json").stdout)
    assert [(r["step"], r["state"]) for r in rows] == [(5, "sealed"), (6, "torn")]


def test_pointer_committed_only_after_group_commit(mnt: Mount) -> None:
    g = mnt.path / "global_step7"
    g.mkdir()
    torch.save({"w": torch.ones(3)}, g / "mp_rank_00_model_states.pt")
    torch.save({"o": torch.ones(3)}, g / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert status(g) == "open"
    (mnt.path / "latest").write_text("global_step7")
    assert status(g) == "sealed"
    # Megatron-style pointer through tmp + rename
    it = mnt.path / "iter_0000009"
    it.mkdir()
    torch.save({"w": torch.ones(3)}, it / "model_optim_rng.pt")
    (mnt.path / "tracker.tmp").write_text("9")
    os.rename(mnt.path / "tracker.tmp", mnt.path / "latest_checkpointed_iteration.txt")
    assert status(it) == "sealed"
    mnt.kill()  # keep the journal uncompacted to read the order of operations
    ops = journal_ops(mnt.path)
    seal = next(i for i, e in enumerate(ops) if e["op"] == "group_seal" and e["path"] == "global_step7")
    ptr = next(i for i, e in enumerate(ops) if e["op"] == "install" and e["path"] == "latest")
    assert seal < ptr, "pointer journaled before the group it names was sealed"
    seal9 = next(i for i, e in enumerate(ops) if e["op"] == "group_seal" and e["path"] == "iter_0000009")
    ren = next(i for i, e in enumerate(ops) if e["op"] == "rename" and e["dst"].startswith("latest_check"))
    assert seal9 < ren


def test_pointer_to_group_with_open_file_fails(mnt: Mount) -> None:
    g = mnt.path / "global_step3"
    g.mkdir()
    with open(g / "shard.pt", "wb") as f:
        f.write(b"partial")
        f.flush()
        with pytest.raises(OSError) as ei:
            (mnt.path / "latest").write_text("global_step3")
        assert ei.value.errno == 5
    assert not (mnt.path / "latest").exists()


def test_dcp_metadata_rename_and_orbax_dir_rename_seal(mnt: Mount) -> None:
    d = mnt.path / "dcp"
    d.mkdir()
    for r in range(2):
        (d / f"__{r}_0.distcp").write_bytes(os.urandom(1000))
    assert status(d) == "open"
    (d / ".metadata.tmp").write_bytes(b"meta")
    os.rename(d / ".metadata.tmp", d / ".metadata")
    assert status(d) == "sealed"
    assert json.loads(os.getxattr(d, "user.ckptfs.group"))["files"] == 3
    tmp = mnt.path / "5.orbax-checkpoint-tmp-1234"
    tmp.mkdir()
    (tmp / "state").write_bytes(b"x" * 100)
    os.rename(tmp, mnt.path / "5")
    assert status(mnt.path / "5") == "sealed"


def test_explicit_and_idle_seal(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--idle-seal", "1"]) as m:
        (m.path / "custom").mkdir()
        (m.path / "custom" / "a.bin").write_bytes(b"a")
        r = cli("seal", str(m.path / "custom"))
        assert "sealed" in r.stdout and status(m.path / "custom") == "sealed"
        (m.path / "step_7").mkdir()
        (m.path / "step_7" / "w.bin").write_bytes(b"w")
        assert status(m.path / "step_7") == "open"
        deadline = time.monotonic() + 20
        while status(m.path / "step_7") != "sealed":
            assert time.monotonic() < deadline, "idle seal never happened"
            time.sleep(0.2)


def test_config_rule_and_bad_config(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / ".ckptfs.toml").write_text('[[group]]\nname = "mine"\npattern = "snap_\\\\d+"\nmarker = "DONE"\n')
    with Mount(d) as m:
        (m.path / "snap_3").mkdir()
        (m.path / "snap_3" / "data").write_bytes(b"d")
        assert status(m.path / "snap_3") == "open"
        (m.path / "snap_3" / "DONE").write_bytes(b"")
        assert status(m.path / "snap_3") == "sealed"
    (d / ".ckptfs.toml").write_text("[[group]]\nmarker = 3\n")
    r = cli("mount", str(d), check=False)
    assert r.returncode == 2 and "bad group configuration" in r.stderr and "pattern" in r.stderr
    assert not os.path.ismount(d)


@pytest.mark.portable
def test_retention_keeps_newest_and_milestones(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--keep-last", "2", "--keep-every", "100"]) as m:
        for step in (50, 100, 150, 200, 250):
            save_hf_like(m.path, step)
        assert sorted(os.listdir(m.path)) == ["checkpoint-100", "checkpoint-200", "checkpoint-250"]
        save_hf_like(m.path, 275)
        assert sorted(os.listdir(m.path)) == ["checkpoint-100", "checkpoint-200", "checkpoint-250",
                                              "checkpoint-275"]
        # an open newer group blocks retention: nothing is deleted while it is unsealed
        save_hf_like(m.path, 290, marker=False)
        (m.path / "checkpoint-9").mkdir()  # an unrelated sibling group, open too
        save_hf_like(m.path, 295)
        assert "checkpoint-250" in os.listdir(m.path)
        (m.path / "checkpoint-290" / "trainer_state.json").write_text("{}")
        assert "checkpoint-250" in os.listdir(m.path)  # checkpoint-9 is still open
        os.rmdir(m.path / "checkpoint-9")
        save_hf_like(m.path, 299)
        assert sorted(os.listdir(m.path)) == ["checkpoint-100", "checkpoint-200", "checkpoint-295",
                                              "checkpoint-299"]
        for step in (100, 200, 295, 299):
            assert torch.equal(torch.load(m.path / f"checkpoint-{step}/model.pt")["w"],
                               torch.full((64,), float(step)))


def test_crash_during_retention_keeps_what_it_should(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d, extra_args=["--keep-last", "2"])
    m.start()
    try:
        save_hf_like(d, 1)
        save_hf_like(d, 2)
        m.stop()
        m.env = {"CKPTFS_CRASH_AT": "retire_moved"}
        m.start()
        with pytest.raises(OSError):
            save_hf_like(d, 3)  # sealing 3 retires 1; the daemon dies right after the move
        assert m.wait_dead() is not None
        m.kill()
        m.env = None
        m.start()
        assert sorted(os.listdir(d)) == ["checkpoint-2", "checkpoint-3"]
        for s in (2, 3):
            assert status(d / f"checkpoint-{s}") == "sealed"
            assert torch.equal(torch.load(d / f"checkpoint-{s}/model.pt")["w"], torch.full((64,), float(s)))
    finally:
        m.stop()
    assert not os.listdir(d / META_DIR / "trash")


def test_verify_unmounted_detects_modified_file(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d) as m:
        save_hf_like(m.path, 1)
        save_hf_like(m.path, 2)
        r = cli("verify", str(m.path))
        assert "and 2 groups (6 files against their manifests): OK" in r.stdout
    assert "and 2 groups (6 files against their manifests): OK" in cli("verify", str(d)).stdout
    assert "and 1 group (3 files against their manifests): OK" in cli("verify", str(d / "checkpoint-2")).stdout
    f = d / "checkpoint-2" / "optimizer.pt"
    b = bytearray(f.read_bytes())
    b[100] ^= 0x01
    f.write_bytes(bytes(b))
    r = cli("verify", str(d), check=False)
    assert r.returncode == 1 and "checkpoint-2/optimizer.pt" in r.stderr
    shown = json.loads(cli("show", str(d / "checkpoint-1")).stdout)
    assert shown["lineage"]["step"] == 1 and shown["state"] == "sealed"
    assert sorted(shown["manifest_files"]) == ["model.pt", "optimizer.pt", "trainer_state.json"]


def test_rotation_before_new_group_seals_is_deferred(tmp_path: Path) -> None:
    """The rotation trap: deleting the only sealed group while the next one is open."""
    import shutil

    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d)
    m.start()
    try:
        save_hf_like(d, 1)
        os.chown(d / "checkpoint-1", 65534, 65534)  # a user's checkpoint, private (issue 26)
        os.chmod(d / "checkpoint-1", 0o700)
        save_hf_like(d, 2, marker=False)
        shutil.rmtree(d / "checkpoint-1")  # the app rotates too early
        assert os.listdir(d) == ["checkpoint-2"]
        m.kill()  # ... and checkpoint-2 never completes
        m.start()
        assert os.listdir(d) == ["checkpoint-1"]
        assert status(d / "checkpoint-1") == "sealed"
        st = os.stat(d / "checkpoint-1")  # back with its owner and mode (was root:root 0755)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (65534, 65534, 0o700)
        assert torch.equal(torch.load(d / "checkpoint-1/model.pt")["w"], torch.full((64,), 1.0))
        # now the same with the newer group sealing: the deferred deletion happens then
        save_hf_like(d, 2, marker=False)
        shutil.rmtree(d / "checkpoint-1")
        (d / "checkpoint-2" / "trainer_state.json").write_text("{}")
        stats = json.loads(os.getxattr(d, "user.ckptfs.stats"))
        assert stats["deferred_deletes"] == 3 and stats["deferred_deletes_done"] == 1
        assert os.listdir(d) == ["checkpoint-2"]
        m.kill()
        m.start()
        assert os.listdir(d) == ["checkpoint-2"]
    finally:
        m.stop()
    assert not os.listdir(d / META_DIR / "trash")


DELETER = r"""
import os, sys, time
g = sys.argv[1]
os.unlink(os.path.join(g, "trainer_state.json"))
print("ready", flush=True)
time.sleep(60)  # killed half-way through the rotation
"""


@pytest.mark.parametrize("newer_sealed", [True, False])
def test_rotation_killed_half_way(mnt: Mount, newer_sealed: bool) -> None:
    """A half-deleted sealed group is never left visible: finished if a newer group is sealed,
    restored whole otherwise."""
    save_hf_like(mnt.path, 1)
    if newer_sealed:
        save_hf_like(mnt.path, 2)
    p = subprocess.Popen([sys.executable, "-c", DELETER, str(mnt.path / "checkpoint-1")], stdout=subprocess.PIPE,
                         text=True, env=_env())
    try:
        assert p.stdout.readline().strip() == "ready"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    want = ["checkpoint-2"] if newer_sealed else ["checkpoint-1"]
    assert sorted(os.listdir(mnt.path)) == want
    for name in want:
        assert status(mnt.path / name) == "sealed"
        assert (mnt.path / name / "trainer_state.json").exists()
    mnt.kill()
    mnt.start()
    assert sorted(os.listdir(mnt.path)) == want


@pytest.mark.parametrize("end", ["umount", "daemon killed"])
def test_offline_verify_after_a_rotation_stopped_half_way(tmp_path: Path, end: str) -> None:
    """Issue 25 item 7: files of a sealed group deleted part-way (a rotation that stopped after 2 of
    its unlinks) wait in ``.ckptfs/trash`` with their records.  The offline ``verify`` right after
    the daemon ends (umount or SIGKILL) must agree with the daemon: OK, the group noted as being
    deleted.  Before, the snapshot's and journal's trash records were dropped as "bad path" and
    verify failed ("metadata problems", "committed file is missing").  The next mount finishes the
    deletion (a newer group is sealed), and verify stays OK."""
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d).start()
    try:
        save_hf_like(d, 1)
        save_hf_like(d, 2)
        for name in ("model.pt", "optimizer.pt"):
            (d / "checkpoint-1" / name).unlink()
        if end == "umount":
            m.stop()
        else:
            m.kill()
        r = cli("verify", str(d), check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "checkpoint-1 is trashed" in r.stdout + r.stderr
        m.start()
        assert sorted(os.listdir(d)) == ["checkpoint-2"]
        assert status(d / "checkpoint-2") == "sealed"
    finally:
        m.stop()
    r = cli("verify", str(d), check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trashed" not in r.stdout + r.stderr


def test_dcp_shards_in_step_dir_never_idle_sealed(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--idle-seal", "0.5"]) as m:
        g = m.path / "step_4"
        g.mkdir()
        (g / "__0_0.distcp").write_bytes(b"s" * 100)
        time.sleep(2.5)  # well past the idle interval: a DCP group still waits for .metadata
        assert status(g) == "open"
        assert json.loads(os.getxattr(g, "user.ckptfs.group"))["rule"] == "dcp"
        (g / ".metadata").write_bytes(b"m")
        assert status(g) == "sealed"


def _damage(src: Path, cls: str) -> None:
    """One fault of each class of issue 4 in checkpoint-2 of the backing directory."""
    f = src / "checkpoint-2" / "model.pt"
    data = bytearray(f.read_bytes())
    if cls == "swap":  # two files of the group exchanged
        o = src / "checkpoint-2" / "optimizer.pt"
        os.rename(f, src / "x.tmp")
        os.rename(o, f)
        os.rename(src / "x.tmp", o)
        return
    if cls == "bitflip":
        data[300] ^= 0x10
    elif cls == "zero-range":
        data[100:400] = bytes(300)
    elif cls == "truncation":
        del data[-50:]
    elif cls == "extension":
        data += b"\0" * 10
    with open(f, "r+b") as fh:  # in place: same inode (bit rot, not a replacement)
        fh.write(data)
        fh.truncate(len(data))


@pytest.mark.parametrize("cls", ["bitflip", "zero-range", "truncation", "extension", "swap"])
def test_corrupt_group_hidden_resume_falls_back(tmp_path: Path, cls: str) -> None:
    src, mp = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mp.mkdir()
    with Mount(mp, backing=src, extra_args=["--scrub-interval", "0"]) as m:
        save_hf_like(m.path, 1)
        save_hf_like(m.path, 2)
        _damage(src, cls)
        with pytest.raises((OSError, RuntimeError)):
            torch.load(m.path / "checkpoint-2" / "model.pt")
        # resume logic of the HF kind: newest checkpoint-N directory
        newest = max(os.listdir(m.path), key=lambda n: int(n.split("-")[1]))
        assert newest == "checkpoint-1"
        assert torch.equal(torch.load(m.path / newest / "model.pt")["w"], torch.full((64,), 1.0))
        rows = json.loads(cli("ls", str(m.path), "--all", "--json").stdout)
        assert [(r["step"], r["state"]) for r in rows] == [(1, "sealed"), (2, "corrupt")]
        assert "model.pt" in rows[1]["reason"]
    with Mount(mp, backing=src):  # stays hidden after a remount
        assert os.listdir(mp) == ["checkpoint-1"]


def test_checkpoint_dir_written_while_unmounted_is_untracked(tmp_path: Path) -> None:
    """A checkpoint-named directory that never was a group (written past ckptfs) says so."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d) as m:
        save_hf_like(m.path, 1)
    save_hf_like(d, 2)  # unmounted: plain files, no manifest
    (d / "checkpoint-3").mkdir()  # empty and unmounted: may still become a group
    with Mount(d) as m:
        assert status(m.path / "checkpoint-1") == "sealed"
        assert status(m.path / "checkpoint-2") == "untracked"
        assert status(m.path / "checkpoint-2" / "model.pt") == "untracked"
        assert torch.equal(torch.load(m.path / "checkpoint-2/model.pt")["w"], torch.full((64,), 2.0))
        torch.save({"w": torch.zeros(2)}, m.path / "checkpoint-2" / "extra.pt")
        assert status(m.path / "checkpoint-2") == "untracked"  # legacy files: never adopted as a group
        with pytest.raises(OSError):  # empty: an ordinary directory (issue 10), no status at all
            status(m.path / "checkpoint-3")
        torch.save({"w": torch.ones(2)}, m.path / "checkpoint-3" / "model.pt")
        assert status(m.path / "checkpoint-3") == "open"
        (m.path / "checkpoint-3" / "trainer_state.json").write_text("{}")
        assert status(m.path / "checkpoint-3") == "sealed"


LATE_WRITER = """
import os, sys, time
f = open(sys.argv[1], "wb")
f.write(b"x" * (1 << 20))
f.flush()
print("writing", flush=True)
time.sleep(60)
"""


def manifest_files(m: Mount, g: Path) -> list[str]:
    return sorted(json.loads(cli("show", str(g)).stdout)["manifest_files"])


def wait_sealed(g: Path, timeout: float = 10.0) -> None:
    """Until the group at g is sealed (a torn group's rollback or reseal runs within a second)."""
    deadline = time.monotonic() + timeout
    while status(g) != "sealed" and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def writer_mid_file(code: str, arg: Path) -> Iterator[subprocess.Popen]:
    """A process running ``code`` (argv[1] = arg) that has printed "writing" with a file open;
    SIGKILLed and reaped when the block ends."""
    w = subprocess.Popen([sys.executable, "-c", code, str(arg)], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert w.stdout is not None and w.stdout.readline().strip() == "writing"
        yield w
    finally:
        w.kill()
        w.wait()


def test_file_added_after_seal_reseals_the_group(mnt: Mount) -> None:
    """G10: older transformers write rng_state.pth after trainer_state.json; a file added to a sealed
    group must not make it torn when the writer exits: the group is resealed with it."""
    d = mnt.path
    save_hf_like(d, 1)
    g = d / "checkpoint-1"
    run_py(f"import torch; torch.save({{'rng': 1}}, {str(g / 'rng_state.pth')!r})")
    assert status(g) == "sealed"
    assert manifest_files(mnt, g) == ["model.pt", "optimizer.pt", "rng_state.pth", "trainer_state.json"]
    time.sleep(1.5)  # the housekeeper's torn sweep runs every second: the writer is gone
    assert status(g) == "sealed"
    mnt.remount()
    assert status(g) == "sealed" and "and 1 group (4 files against their manifests): OK" in cli("verify", str(g)).stdout
    # a late file written by tmp + rename: added under its final name, resealed after the rename
    run_py(f"import os; open({str(g / 'notes.tmp')!r}, 'w').write('n'); "
           f"os.rename({str(g / 'notes.tmp')!r}, {str(g / 'NOTES')!r})")
    assert status(g) == "sealed" and "NOTES" in manifest_files(mnt, g)


def test_killed_late_writer_leaves_the_sealed_group(mnt: Mount) -> None:
    d = mnt.path
    save_hf_like(d, 1)
    g = d / "checkpoint-1"
    with writer_mid_file(LATE_WRITER, g / "rng_state.pth"):
        assert status(g) == "open"
    wait_sealed(g)
    assert status(g) == "sealed"
    assert sorted(os.listdir(g)) == ["model.pt", "optimizer.pt", "trainer_state.json"]  # the torn file is gone
    assert manifest_files(mnt, g) == ["model.pt", "optimizer.pt", "trainer_state.json"]
    # the killed late writer says nothing about the next change: a live re-save is not torn
    torch.save({"w": torch.full((64,), 9.0)}, g / "model.pt")
    time.sleep(1.5)  # the housekeeper's sweep runs every second
    assert status(g) == "open"
    (g / "trainer_state.json").write_text("{}")
    assert status(g) == "sealed" and torch.equal(torch.load(g / "model.pt")["w"], torch.full((64,), 9.0))


def test_daemon_crash_during_late_write_reseals_in_recovery(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d).start()
    try:
        save_hf_like(d, 1)
        g = d / "checkpoint-1"
        (g / "NOTES").write_text("added after the seal")  # committed, group resealed
        with writer_mid_file(LATE_WRITER, g / "rng_state.pth"):
            (d / "x.txt").write_text("1")  # ... while the group is open again
            m.kill(detach=False)
        m.detach()
        m.start()
        assert status(g) == "sealed"
        assert sorted(os.listdir(g)) == ["NOTES", "model.pt", "optimizer.pt", "trainer_state.json"]
        assert torch.equal(torch.load(g / "model.pt")["w"], torch.full((64,), 1.0))
        shown = json.loads(cli("show", str(g)).stdout)
        assert shown["lineage"]["event"] == "recovery: files added after the seal"
        assert "and 1 group (4 files against their manifests): OK" in cli("verify", str(g)).stdout
    finally:
        m.stop()


def test_rewrite_of_a_sealed_group_needs_its_completion_event(tmp_path: Path) -> None:
    """A re-save over a sealed group's files is not resealed file by file (that could seal new weights
    with the old optimizer): without its marker again it is torn once the writer is gone, and with no
    kept generation (--keep-generations 0) there is nothing to roll back to: quarantined (G7)."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--keep-generations", "0"]) as m:
        save_hf_like(m.path, 1)
        g = m.path / "checkpoint-1"
        r = run_py(f"import os, time, torch; torch.save({{'w': torch.zeros(64)}}, {str(g / 'model.pt')!r}); "
                   f"time.sleep(1.5); print(os.getxattr({str(g)!r}, 'user.ckptfs.status').decode())")
        assert r.stdout.strip() == "open"  # while the writer lives it may still write the rest and the marker
        deadline = time.monotonic() + 10
        while g.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not g.exists()
        rows = json.loads(cli("ls", str(m.path), "--all", "--json").stdout)
        assert [(r["step"], r["state"]) for r in rows] == [(1, "torn")]
        # and a rename onto a file the group holds is a rewrite too
        save_hf_like(m.path, 2)
        g2 = m.path / "checkpoint-2"
        (g2 / "m.tmp").write_bytes(b"new")
        assert status(g2) == "open"  # a temporary file added: not resealed with it (G10), its writer lives
        (g2 / "NOTES").write_text("n")
        assert status(g2) == "sealed"  # an added file that is not temporary: resealed (with both)
        (g2 / "m2.tmp").write_bytes(b"new")
        os.rename(g2 / "m2.tmp", g2 / "model.pt")
        assert status(g2) == "open"
        (g2 / "trainer_state.json").write_text("{}")  # the completion event again
        assert status(g2) == "sealed"


RESAVE = """
import sys, torch
g = sys.argv[1]
torch.save({"w": torch.zeros(64)}, g + "/model.pt")     # the re-save rewrites the weights ...
torch.save({"x": torch.ones(3)}, g + "/extra.pt")      # ... adds a file ...
f = open(g + "/optimizer.pt", "wb")                     # ... and dies inside the optimizer
f.write(b"PK" + b"\\0" * 100000)
f.flush()
print("writing", flush=True)
import time; time.sleep(60)
"""


def assert_rolled_back(g: Path, step: int = 1) -> None:
    assert status(g) == "sealed"
    assert sorted(os.listdir(g)) == ["model.pt", "optimizer.pt", "trainer_state.json"]
    assert torch.equal(torch.load(g / "model.pt")["w"], torch.full((64,), float(step)))
    assert torch.equal(torch.load(g / "optimizer.pt")["opt"], torch.arange(8) * step)
    assert "and 1 group (3 files against their manifests): OK" in cli("verify", str(g)).stdout


@pytest.mark.portable
def test_torn_resave_rolls_back_to_the_seal_live(mnt: Mount) -> None:
    """G11: the re-save's writer exits (or is killed) without the completion event: the group goes back
    to its sealed files (kept generations), the re-save's files are kept aside, nothing is lost."""
    d = mnt.path
    save_hf_like(d, 1)
    g = d / "checkpoint-1"
    run_py(f"import torch; torch.save({{'w': torch.zeros(64)}}, {str(g / 'model.pt')!r})")  # exits after
    wait_sealed(g)
    assert_rolled_back(g)
    with writer_mid_file(RESAVE, g):
        assert status(g) == "open"
    wait_sealed(g)
    assert_rolled_back(g)
    stats = json.loads(os.getxattr(d, "user.ckptfs.stats"))
    assert stats["groups_rolled_back"] == 2
    mnt.remount()
    assert_rolled_back(g)
    mnt.stop()
    aside = sorted(p.name for q in (d / META_DIR / "quarantine").iterdir() for p in q.iterdir())
    assert aside == ["extra.pt", "model.pt", "model.pt.1"]  # both re-saves' committed files, kept (never replaced)
    mnt.start()
    cli("gc", str(d))
    mnt.stop()
    assert not os.listdir(d / META_DIR / "quarantine")
    mnt.start()


def test_torn_resave_by_tmp_and_rename_rolls_back(mnt: Mount) -> None:
    """G11 when the re-save replaces files by tmp + rename (safetensors, DCP's .metadata): the file
    replaced by the rename is kept as a generation, so the group still goes back to its seal."""
    d = mnt.path
    save_hf_like(d, 1)
    g = d / "checkpoint-1"
    run_py(f"import os, torch; torch.save({{'w': torch.zeros(64)}}, {str(g / '.tmp.model')!r}); "
           f"os.rename({str(g / '.tmp.model')!r}, {str(g / 'model.pt')!r})")  # then exits
    wait_sealed(g)
    assert_rolled_back(g)
    assert json.loads(os.getxattr(d, "user.ckptfs.stats"))["groups_rolled_back"] == 1


@pytest.mark.parametrize("crash_in_recovery", [False, True])
def test_torn_resave_rolls_back_after_daemon_crash(tmp_path: Path, crash_in_recovery: bool) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    m = Mount(d).start()
    try:
        save_hf_like(d, 1)
        g = d / "checkpoint-1"
        with writer_mid_file(RESAVE, g):
            m.kill(detach=False)
        m.detach()
        if crash_in_recovery:
            m.env = {"CKPTFS_CRASH_AT": "rollback_logged"}
            with pytest.raises(RuntimeError):
                m.start()  # recovery journals the rollback and dies before moving anything
            m.kill()
            m.env = None
        m.start()
        assert_rolled_back(g)
        m.remount()
        assert_rolled_back(g)
    finally:
        m.stop()
    aside = [p.name for q in (d / META_DIR / "quarantine").iterdir() for p in q.iterdir()]
    assert sorted(aside) == ["extra.pt", "model.pt"]  # the re-save's committed files, kept


@pytest.mark.parametrize("damage", ["commit-garbage", "manifest-garbage", "both-gone"])
def test_damaged_seal_records_of_an_intact_group_are_rebuilt_not_quarantined(tmp_path: Path, damage: str) -> None:
    """Issue 25: garbage in ``.ckptfs/groups/*`` written while unmounted sent an intact group to
    quarantine ("COMMIT record unreadable") although every file verified against its own record.
    Recovery rebuilds the seal from those records; a group whose files do not all verify (or one
    missing) is still quarantined as corrupt."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        want = save_hf_like(d, 1)
        save_hf_like(d, 2)
    seals = d / META_DIR / "groups"
    files = sorted(seals.iterdir())
    assert files, "no seal records"
    for f in files:
        if damage == "commit-garbage" and f.name.endswith(".commit"):
            f.write_bytes(b"\x00garbage")
        elif damage == "manifest-garbage" and f.name.endswith(".manifest"):
            f.write_bytes(b"{not json")
        elif damage == "both-gone":
            f.unlink()
    (d / "checkpoint-2" / "optimizer.pt").write_bytes(b"changed while unmounted")  # really corrupt
    with Mount(d).start():
        assert status(d / "checkpoint-1") == "sealed"
        assert torch.equal(torch.load(d / "checkpoint-1" / "model.pt")["w"], want["w"])
        assert not (d / "checkpoint-2").exists()  # its data does not verify: quarantined as before
        rows = {r["path"]: r for r in json.loads(os.getxattr(d, "user.ckptfs.quarantine"))}
        assert "checkpoint-2" in rows and "checkpoint-1" not in rows, rows
    r = subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(d)], capture_output=True, text=True,
                       env=_env())
    assert "checkpoint-1" not in r.stderr, r.stderr


def test_retention_never_retires_the_group_sealed_last(tmp_path: Path) -> None:
    """Issue 25: a lower step saved after a higher one (a rollback's re-run) was retired by
    ``--keep-last 1`` the moment it sealed: the only copy of what was just saved."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--keep-last", "1"]).start():
        save_hf_like(d, 5)
        save_hf_like(d, 3)
        assert status(d / "checkpoint-3") == "sealed"
        assert sorted(os.listdir(d)) == ["checkpoint-3", "checkpoint-5"]


TMP_ADDER = r"""
import os, sys, torch
g = sys.argv[1]
torch.save({"w": 1}, os.path.join(g, "model.pt.tmp"))
print("added", flush=True)
sys.stdin.readline()
"""


def test_a_tmp_file_added_to_a_sealed_group_does_not_reseal_it(mnt: Mount) -> None:
    """G10: a re-save by tmp + rename first adds ``model.pt.tmp`` to the sealed group.  Resealing
    with it (as for any added file) made the tmp file part of the checkpoint every reader saw,
    until the rename reopened the group.  A temporary name leaves the group open (late) and its
    sealed files in view of other jobs (RS1); its writer's exit 0 reseals it, tmp file included,
    as before."""
    d = mnt.path
    save_hf_like(d, 1)
    g = d / "checkpoint-1"
    w = subprocess.Popen([sys.executable, "-c", TMP_ADDER, str(g)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert w.stdout is not None and w.stdin is not None
        assert w.stdout.readline().strip() == "added"
        time.sleep(1.5)  # the housekeeper's sweep runs every second: the writer lives, nothing changes
        assert status(g) == "open"
        lister = "import os, sys; print(sorted(os.listdir(sys.argv[1])))"
        listed = subprocess.run(["setsid", "-w", sys.executable, "-c", lister, str(g)], capture_output=True,
                                text=True, env=_env(), timeout=60)
        assert listed.stdout.strip() == "['model.pt', 'optimizer.pt', 'trainer_state.json']", listed
        assert release_and_reap(w, "done") == 0
    finally:
        kill_if_running(w)
    wait_sealed(g)
    assert manifest_files(mnt, g) == ["model.pt", "model.pt.tmp", "optimizer.pt", "trainer_state.json"]


def test_a_first_seal_lost_to_a_power_loss_is_rewritten_byte_identical_from_the_journal(tmp_path: Path) -> None:
    """G12 (issue 27): a first seal writes its manifest, COMMIT and anchor without a sync of its
    own; the journal's fdatasynced ``group_seal`` entry is the durable seal.  A power loss can take
    those files (here: the daemon is killed, then they are removed from the backing directory, what
    a power loss before the next compaction may leave); the remount rewrites them byte-identical from
    the journal, with the digest it journaled, and never hides or re-hashes the group (issue 25's
    rebuild from the files' own records is not used).  A clean unmount's compaction made them
    durable first: there, the journal keeps no seal entry to rebuild from."""
    d, b = tmp_path / "ckpts", tmp_path / "backing"
    d.mkdir()
    b.mkdir()
    groups = b / META_DIR / "groups"
    m = Mount(d, backing=b).start()
    try:
        save_hf_like(d, 1)
        assert status(d / "checkpoint-1") == "sealed"
        gid = json.loads(os.getxattr(d / "checkpoint-1", "user.ckptfs.group"))["id"]
        names = [f"{gid}{s}" for s in (".manifest", ".commit", ".anchor.manifest", ".anchor.commit")]
        before = {n: (groups / n).read_bytes() for n in names}
        seal = [e for e in journal_ops(b) if e["op"] == "group_seal"]
        assert len(seal) == 1 and seal[0]["lineage"]["step"] == 1 and seal[0]["anchor"] is True
        m.kill()
        for n in names:
            (groups / n).unlink()
        (groups / f"{gid}.anchor.commit").write_bytes(before[f"{gid}.anchor.commit"][:10])  # torn
        m.start()
        assert status(d / "checkpoint-1") == "sealed"
        assert {n: (groups / n).read_bytes() for n in names} == before
        log = (b / META_DIR / "daemon.log").read_text()
        assert "rewritten from the journal" in log and "seal records damaged" not in log
        assert torch.equal(torch.load(d / "checkpoint-1" / "model.pt")["w"], torch.full((64,), 1.0))
        save_hf_like(d, 2)
        assert status(d / "checkpoint-2") == "sealed"
    finally:
        m.stop()
    assert not [e for e in journal_ops(b) if e["op"] == "group_seal"]  # compacted: files synced first


def test_a_first_seal_costs_one_sync(tmp_path: Path) -> None:
    """G12, counted: between the marker's install (its directory fsync) and the end of the seal the
    daemon makes exactly one sync, the journal's fdatasync, where the seal used to make six
    (manifest, ``groups``, COMMIT, ``groups``, journal, anchors' ``groups``).  A reseal of the same
    group (a file added after the seal, G10) writes durably as before."""
    from ckptfs.backing import OsBackingStore
    from ckptfs.fs import CkptFS

    store = OsBackingStore(str(tmp_path))
    calls: list[str] = []
    for name in ("fsync", "fdatasync", "fsync_dir"):
        real = getattr(store, name)
        setattr(store, name, lambda x, real=real, name=name: (calls.append(name), real(x))[1])
    fs = CkptFS(store)

    def save(path: str, data: bytes) -> None:
        fh = fs.create(path, 0o644)
        fs.write(fh, data, 0)
        calls.append(f"close {path}")
        fs.flush(fh)
        fs.release(fh)

    try:
        for step in (2, 3):  # (the very first seal also makes .ckptfs/groups, once)
            fs.mkdir(f"checkpoint-{step}", 0o755)
            save(f"checkpoint-{step}/model.pt", b"m" * 100)
            save(f"checkpoint-{step}/trainer_state.json", b"{}")
            assert fs.groups[f"checkpoint-{step}"].state == "sealed"
        last = calls[calls.index("close checkpoint-3/trainer_state.json") + 1:]
        assert last == ["fsync", "fsync_dir", "fdatasync"], last  # data, its directory; the seal
        save("checkpoint-3/rng.json", b"{}")  # added after the seal: a reseal (G10), durable
        g = fs.groups["checkpoint-3"]
        assert g.state == "sealed" and g.files == 3
        last = calls[calls.index("close checkpoint-3/rng.json") + 1:]
        assert last.count("fsync") >= 3 and "fdatasync" in last, last  # data, manifest, COMMIT; journal
    finally:
        fs.shutdown()
        store.shutdown()
