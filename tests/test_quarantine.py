"""Quarantine that a user can find (issue 15, part 3).

Everything ckptfs moves out of sight (a torn or corrupt group, the files of a torn re-save that was
rolled back) is a row of its own table, keyed by where it is kept, not by the path it came from
(engine/quarantine.py), so a later save of the same ``checkpoint-N`` never hides it:

* ``ckptfs ls --all DIR`` lists it (why, when, kept where) mounted, unmounted and after a remount,
  and ``user.ckptfs.quarantine`` on DIR says the same;
* ``ckptfs gc --dry-run`` lists what gc would delete and deletes nothing; ``ckptfs gc`` prints each
  item it deleted and the bytes freed;
* the table survives journal replay, compaction, recovery and ``ckptfs forget``, and a snapshot of
  the previous version (a quarantined group kept in the group table under its path) still loads.

The mount tests use real FUSE mounts and real processes killed with SIGKILL (HF-style saves).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import Mount, _env, run_py
from test_groups import RESAVE, cli, save_hf_like, status, wait_sealed, writer_mid_file

from ckptfs.backing import OsBackingStore
from ckptfs.engine.replay import replay
from ckptfs.engine.seals import GroupState
from ckptfs.fs import CkptFS
from ckptfs.layout import QUARANTINE
from ckptfs.log.journal import Journal
from ckptfs.log.metadata import load_trusted
from ckptfs_testing.direct import torch_bytes, write_file

X_QUARANTINE = "user.ckptfs.quarantine"

# an HF-style save killed between its files: weights and optimizer written, never trainer_state.json
KILLED_SAVE = r"""
import os, sys, time, torch
g = sys.argv[1]
os.makedirs(g)
torch.save({"w": torch.full((4096,), -1.0)}, os.path.join(g, "model.pt"))
torch.save({"opt": torch.zeros(1024)}, os.path.join(g, "optimizer.pt"))
print("ready", flush=True)
time.sleep(60)  # SIGKILLed here, before trainer_state.json
"""


def killed_save(g: Path) -> None:
    """Run KILLED_SAVE into ``g`` and SIGKILL it once its two files are written."""
    p = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(g)], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert status(g) == "open"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()


def wait_gone(g: Path, timeout: float = 15.0) -> None:
    """Until the torn group at ``g`` is moved out of sight (listing its parent sweeps it)."""
    deadline = time.monotonic() + timeout
    while g.name in os.listdir(g.parent):
        assert time.monotonic() < deadline, f"{g} still visible"
        time.sleep(0.05)


def ls_all(d: Path) -> list[dict]:
    return json.loads(cli("ls", str(d), "--all", "--json").stdout)


def rows_named(rows: list[dict], name: str) -> list[tuple[str, str]]:
    """(state, kept_at or "") of the rows for ``name``, in listing order."""
    return [(r["state"], r.get("kept_at", "")) for r in rows if os.path.basename(r["path"]) == name]


def quarantine_attr(d: Path) -> list[dict]:
    return json.loads(os.getxattr(d, X_QUARANTINE))


def tree_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def test_torn_checkpoint_saved_again_is_listed_until_gc(tmp_path: Path) -> None:
    """The user's report: a torn ``checkpoint-5`` moved to quarantine, then the resumed run saved
    ``checkpoint-5`` again.  Both are listed (mounted, unmounted, remounted), the xattr names the
    torn one, gc --dry-run deletes nothing, gc says what it deleted and how many bytes."""
    d = tmp_path / "ckpts"
    d.mkdir()
    g5 = d / "checkpoint-5"
    t0 = time.time()
    m = Mount(d).start()
    try:
        save_hf_like(d, 4)
        killed_save(g5)
        wait_gone(g5)
        save_hf_like(d, 5)  # the resumed run saves the same name again, completely
        assert status(g5) == "sealed"
        rows = ls_all(d)
        assert [(r["step"], r["state"]) for r in rows] == [(4, "sealed"), (5, "torn"), (5, "sealed")], rows
        torn = rows[1]
        kept = torn["kept_at"]
        assert kept.startswith(".ckptfs/quarantine/") and torn["moved_to"] == kept
        assert "exited before" in torn["reason"] or "killed" in torn["reason"], torn
        assert t0 <= torn["time"] <= time.time() and torn["files"] == 2 and torn["bytes"] > 16384
        # the xattr on the parent says the same: what, why, when, where
        (q,) = quarantine_attr(d)
        assert (q["name"], q["path"], q["state"], q["kept_at"]) == ("checkpoint-5", "checkpoint-5", "torn", kept)
        assert q["reason"] == torn["reason"] and q["when"] == torn["time"] and q["when_iso"]
        assert (q["files"], q["bytes"]) == (2, torn["bytes"])
        # status names are read by name, never listed (like every user.ckptfs.* attribute)
        assert not [n for n in os.listxattr(d) if n.startswith("user.ckptfs.")]
        # the quarantined copy shadows nothing: the new group is sealed and in the committed view
        assert "checkpoint-5" in os.listdir(d / ".ckptfs-committed")
        text = cli("ls", str(d), "--all").stdout
        assert f"kept at {kept} until 'ckptfs gc'" in text and "torn" in text
        assert "torn" not in cli("ls", str(d)).stdout  # without --all: only what is in sight
    finally:
        m.stop()
    # unmounted: the same rows, from the snapshot and .ckptfs
    assert rows_named(ls_all(d), "checkpoint-5") == [("torn", kept), ("sealed", "")]
    assert (d / kept / "model.pt").is_file() and (d / kept / "optimizer.pt").is_file()
    torn_bytes = tree_bytes(d / kept)
    r = cli("gc", str(d), "--dry-run")
    assert f"would remove {kept}  checkpoint-5  torn  2 files  {torn_bytes} bytes" in r.stdout, r.stdout
    assert f"ckptfs: gc would remove 1 group ({torn_bytes / 1e6:.1f} MB) from {d}" in r.stdout
    assert tree_bytes(d / kept) == torn_bytes  # nothing deleted
    m.start()
    try:  # remounted (recovery + compaction ran): still both
        assert rows_named(ls_all(d), "checkpoint-5") == [("torn", kept), ("sealed", "")]
        assert [q["kept_at"] for q in quarantine_attr(d)] == [kept]
        r = cli("gc", str(d), "--dry-run")
        assert f"would remove {kept}  checkpoint-5  torn" in r.stdout and "gc would remove 1 group" in r.stdout
        assert [q["kept_at"] for q in quarantine_attr(d)] == [kept]  # the dry run deleted nothing
        r = cli("gc", str(d))
        assert r.returncode == 0
        assert f"removed {kept}  checkpoint-5  torn  2 files  {torn_bytes} bytes" in r.stdout, r.stdout
        assert f"ckptfs: gc removed 1 group ({torn_bytes / 1e6:.1f} MB) from {d}" in r.stdout
        assert quarantine_attr(d) == []
        assert rows_named(ls_all(d), "checkpoint-5") == [("sealed", "")]
        assert status(g5) == "sealed"
        assert "and 1 group (3 files against their manifests): OK" in cli("verify", str(g5)).stdout
    finally:
        m.stop()
    assert not (d / kept).exists() and not os.listdir(d / QUARANTINE)
    assert rows_named(ls_all(d), "checkpoint-5") == [("sealed", "")]
    assert torch.equal(torch.load(g5 / "model.pt")["w"], torch.full((64,), 5.0))  # the re-save, untouched


def test_torn_resave_files_are_listed_and_gc_reports_them(mnt: Mount) -> None:
    """G11 rollback: the files of a torn re-save of a sealed group are moved to
    ``.ckptfs/quarantine/<id>.resave``; that is listed too (state resave), and gc deletes it."""
    d = mnt.path
    save_hf_like(d, 1)
    g = d / "checkpoint-1"
    with writer_mid_file(RESAVE, g):
        assert status(g) == "open"
    wait_sealed(g)
    assert torch.equal(torch.load(g / "model.pt")["w"], torch.full((64,), 1.0))  # rolled back
    (q,) = quarantine_attr(d)
    assert (q["name"], q["state"]) == ("checkpoint-1", "resave") and q["kept_at"].endswith(".resave")
    assert q["files"] == 2 and q["bytes"] > 0 and q["resaves"] == 1  # the rewritten model.pt, the added extra.pt
    assert q["reason"].startswith("re-save torn") and q["when"] > 0
    rows = ls_all(d)
    assert [(r["state"], r.get("kept_at", "")) for r in rows] == [("sealed", ""), ("resave", q["kept_at"])]
    mnt.remount()
    assert [r["kept_at"] for r in quarantine_attr(d)] == [q["kept_at"]]
    rep = json.loads(cli("gc", str(d), "--json").stdout)
    assert not rep["dry_run"] and [(i["kept_at"], i["state"], i["files"]) for i in rep["items"]] == [
        (q["kept_at"], "resave", 2)]
    assert rep["bytes_freed"] == rep["items"][0]["bytes"] > 0 and rep["groups_removed"] == 1
    assert quarantine_attr(d) == [] and status(g) == "sealed"
    assert json.loads(os.getxattr(d, "user.ckptfs.stats"))["gc_bytes_freed"] == rep["bytes_freed"]


def test_gc_report_attribute_and_dry_run_value(mnt: Mount) -> None:
    """The control: ``setfattr -n user.ckptfs.gc -v dry-run`` deletes nothing; ``user.ckptfs.gc_report``
    then says what gc would delete (and, after ``-v 1``, what it deleted)."""
    d = mnt.path
    killed_save(d / "checkpoint-9")
    wait_gone(d / "checkpoint-9")
    (q,) = quarantine_attr(d)
    os.setxattr(d, "user.ckptfs.gc", b"dry-run")
    rep = json.loads(os.getxattr(d, "user.ckptfs.gc_report"))
    assert rep["dry_run"] and [i["kept_at"] for i in rep["items"]] == [q["kept_at"]]
    assert rep["pid"] == os.getpid() and rep["bytes_freed"] == q["bytes"]
    assert quarantine_attr(d) == [q]
    os.setxattr(d, "user.ckptfs.gc", b"1")
    rep = json.loads(os.getxattr(d, "user.ckptfs.gc_report"))
    assert not rep["dry_run"] and [i["kept_at"] for i in rep["items"]] == [q["kept_at"]]
    assert quarantine_attr(d) == []


# ------------------------------------------------------------------ no mount: persistence
def _torn_then_saved_again(fs: CkptFS) -> None:
    """checkpoint-5 torn (its only writer gone, no trainer_state.json), then saved again, sealed."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    fs.mkdir("run", 0o755)
    fs.mkdir("run/checkpoint-5", 0o755)
    write_file(fs, "run/checkpoint-5/optimizer.pt", torch_bytes(1.0), pid=dead.pid)
    fs.readdir("run")  # the sweep: every writer exited before the marker -> torn, quarantined
    assert "run/checkpoint-5" not in fs.groups
    fs.mkdir("run/checkpoint-5", 0o755)
    write_file(fs, "run/checkpoint-5/optimizer.pt", torch_bytes(2.0))
    write_file(fs, "run/checkpoint-5/trainer_state.json", b"{}")
    assert fs.groups["run/checkpoint-5"].state == "sealed"


def _offline(root: Path) -> tuple[dict, dict]:
    store = OsBackingStore(str(root))
    try:
        r = replay(load_trusted(Journal(store)), last="apply")
    finally:
        store.shutdown()
    return ({p: g.state for p, g in r.groups.items()},
            {k: (q.path, q.state, q.files) for k, q in r.quarantine.items()})


def test_table_survives_replay_compaction_recovery_and_forget(tmp_path: Path) -> None:
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    try:
        _torn_then_saved_again(fs)
        (kept,) = fs.grp.quarantine
        want = ({"run/checkpoint-5": "sealed"}, {kept: ("run/checkpoint-5", "torn", 1)})
        assert _offline(tmp_path) == want  # journal replay (snapshot + tail)
        fs.commit.compact()
        assert _offline(tmp_path) == want  # from the snapshot alone
    finally:
        fs.shutdown()
    assert _offline(tmp_path) == want
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)  # recovery + its compaction
    try:
        assert set(fs.grp.quarantine) == {kept} and fs.groups["run/checkpoint-5"].state == "sealed"
        rows = json.loads(fs.getxattr("run", X_QUARANTINE))
        assert [(r["name"], r["state"], r["kept_at"]) for r in rows] == [("checkpoint-5", "torn", kept)]
        assert fs.getxattr("run/checkpoint-5", "user.ckptfs.status") == b"sealed"
    finally:
        fs.shutdown()
    r = subprocess.run([sys.executable, "-m", "ckptfs", "forget", str(tmp_path), "nothing.pt"], env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "nothing.pt: no record" in r.stderr, r.stderr  # (issue 26: it said 0)
    assert _offline(tmp_path) == want


def test_gc_forgets_only_what_it_deleted_and_recovery_drops_rows_whose_directory_is_gone(tmp_path: Path) -> None:
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    try:
        _torn_then_saved_again(fs)
        (kept,) = fs.grp.quarantine
        rep = fs.gc(dry_run=True)
        assert [i["kept_at"] for i in rep["items"]] == [kept] and (tmp_path / kept).is_dir()
        assert set(fs.grp.quarantine) == {kept}
    finally:
        fs.shutdown()
    # a gc cut short after deleting the directory, before its entry: the row goes at recovery
    subprocess.run(["rm", "-rf", str(tmp_path / kept)], check=True)
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    try:
        assert fs.grp.quarantine == {} and fs.groups["run/checkpoint-5"].state == "sealed"
    finally:
        fs.shutdown()


def test_snapshot_of_the_previous_version_still_loads(tmp_path: Path) -> None:
    """Before the quarantine table, a quarantined group was a group record (state torn, moved_to)
    under its path in the snapshot.  It is read into the table: listed, not shadowing the path, and
    a new save at that name is a new group beside it."""
    store = OsBackingStore(str(tmp_path))
    kept = f"{QUARANTINE}/0123abcd"
    os.makedirs(tmp_path / kept)
    (tmp_path / kept / "model.pt").write_bytes(b"x" * 1000)
    old = GroupState(path="checkpoint-5", rule="hf-trainer", id="0123abcd", state="torn", created_at=1.0,
                     reason="writer killed: signal 9", moved_to=kept, step=5)
    j = Journal(store)
    j.ensure_layout()
    j.compact({}, [], {"checkpoint-5": old.to_json()})  # what the previous version wrote
    store.shutdown()
    rows = json.loads(cli("ls", str(tmp_path), "--all", "--json").stdout)
    assert [(r["state"], r["kept_at"], r["reason"], r["files"], r["bytes"]) for r in rows] == [
        ("torn", kept, "writer killed: signal 9", 1, 1000)]  # (the old record had no sizes: from disk)
    assert rows[0]["time"] > 0  # unknown to the old record: its directory's ctime
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    try:
        assert fs.groups == {} and set(fs.grp.quarantine) == {kept}
        fs.mkdir("checkpoint-5", 0o755)
        write_file(fs, "checkpoint-5/optimizer.pt", torch_bytes(5.0))
        write_file(fs, "checkpoint-5/trainer_state.json", b"{}")
        assert fs.groups["checkpoint-5"].state == "sealed"
        rows = json.loads(fs.getxattr("", X_QUARANTINE))
        assert [(r["name"], r["state"], r["kept_at"]) for r in rows] == [("checkpoint-5", "torn", kept)]
        rep = fs.gc()
        assert [(i["kept_at"], i["bytes"]) for i in rep["items"]] == [(kept, 1000)]
        assert not (tmp_path / kept).exists() and fs.groups["checkpoint-5"].state == "sealed"
    finally:
        fs.shutdown()


def test_unrecorded_quarantine_is_listed_and_collected(tmp_path: Path) -> None:
    """What an older version left in .ckptfs/quarantine after losing its record (the same name saved
    again, then a compaction): listed at the root as unrecorded, with a note when listing a
    subdirectory, and deleted by gc, which says so."""
    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    fs.shutdown()
    lost = tmp_path / QUARANTINE / "feedbeef"
    lost.mkdir(parents=True)
    (lost / "model.safetensors").write_bytes(b"y" * 4096)
    (tmp_path / "run").mkdir()
    rows = json.loads(cli("ls", str(tmp_path), "--all", "--json").stdout)
    assert [(r["state"], r["kept_at"], r["files"], r["bytes"]) for r in rows] == [
        ("unrecorded", f"{QUARANTINE}/feedbeef", 1, 4096)]
    r = cli("ls", str(tmp_path / "run"), "--all")
    assert "1 more in .ckptfs/quarantine of unknown origin" in r.stderr
    r = cli("gc", str(tmp_path))
    assert f"removed {QUARANTINE}/feedbeef  ?  unrecorded  1 file  4096 bytes" in r.stdout, r.stdout
    assert not lost.exists()


def test_old_journal_entries_without_time_replay(tmp_path: Path) -> None:
    """A journal written by the previous version (group_quarantine without a time, then the same name
    opened again) replays into both tables."""
    store = OsBackingStore(str(tmp_path))
    j = Journal(store)
    j.ensure_layout()
    kept = f"{QUARANTINE}/aa11"
    os.makedirs(tmp_path / kept)
    for e in ({"op": "group_open", "path": "checkpoint-5", "rule": "hf-trainer", "id": "aa11", "time": 1.0, "step": 5},
              {"op": "group_quarantine", "path": "checkpoint-5", "to": kept, "state": "torn",
               "reason": "every writer exited before the group was sealed"},
              {"op": "group_open", "path": "checkpoint-5", "rule": "hf-trainer", "id": "bb22", "time": 2.0, "step": 5},
              {"op": "group_seal", "path": "checkpoint-5", "manifest": "m", "time": 3.0}):
        j.append(e)
    j.close()
    store.shutdown()
    assert _offline(tmp_path) == ({"checkpoint-5": "sealed"}, {kept: ("checkpoint-5", "torn", 0)})


def test_group_state_is_never_torn_in_the_group_table(tmp_path: Path) -> None:
    """One source of truth: once moved, a quarantined group is a row of the quarantine table only
    (not in ``user.ckptfs.groups``, not in the snapshot's group table)."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d) as m:
        g = str(m.path / "checkpoint-2")
        run_py(f"import os, torch; os.makedirs({g!r}); torch.save({{'o': 1}}, os.path.join({g!r}, 'optimizer.pt'))")
        wait_gone(m.path / "checkpoint-2")  # its writer exited without trainer_state.json: torn
        assert json.loads(os.getxattr(m.path, "user.ckptfs.groups")) == []
        assert [q["state"] for q in quarantine_attr(m.path)] == ["torn"]
    store = OsBackingStore(str(d))
    try:
        snap = load_trusted(Journal(store))
    finally:
        store.shutdown()
    assert snap.state.groups == {} and len(snap.quarantine) == 1
