"""Groups only on evidence (issue 10): a directory's name alone never makes a group, and torn needs
evidence of an interrupted save.  Real mounts, real processes; the daemon's housekeeper judges
groups every second, so the tests wait past it before looking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import Mount, _env, kill_if_running, release_and_reap, run_py

from ckptfs import META_DIR

JUDGED = 2.5  # seconds: past two housekeeping sweeps


def _exit_events() -> bool:
    """Whether this machine gives the kernel's process exit events (netlink connector: root, the
    initial network namespace); the daemon falls back to weaker evidence without them."""
    from ckptfs.exits import ExitWatcher

    return ExitWatcher().available


needs_exit_events = pytest.mark.skipif(not _exit_events(), reason="no process exit events here (netlink "
                                       "proc connector needs root in the initial network namespace)")


def status(p: Path) -> str | None:
    try:
        return os.getxattr(p, "user.ckptfs.status").decode()
    except OSError:
        return None


def groups(root: Path, d: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "ckptfs", "ls", str(d), "--all", "--json"], capture_output=True,
                       text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_names_alone_make_no_group(mnt: Mount) -> None:
    """Ordinary files in directories named like checkpoints: no group is opened, nothing is judged."""
    names = ["7", "2024", "step_5", "checkpoint-100", "global_step3", "iter_0000010", "foo-step=5"]
    for n in names:
        subprocess.run(["sh", "-c", f"mkdir -p a/{n} && echo x > a/{n}/app.log && echo '{{}}' > a/{n}/meta.json"],
                       cwd=mnt.path, check=True)
    time.sleep(JUDGED)
    for n in names:
        assert status(mnt.path / "a" / n) is None, f"{n} became a group"
        assert (mnt.path / "a" / n / "app.log").read_text() == "x\n"
    assert groups(mnt.path, mnt.path / "a") == []
    assert not (mnt.path / META_DIR).exists()  # unreachable through the mount, as always
    quarantine = mnt.backing / META_DIR / "quarantine"
    mnt.stop()
    assert not quarantine.exists() or os.listdir(quarantine) == []
    mnt.start()


def test_mv_of_an_ordinary_dir_to_a_step_name_is_no_seal(mnt: Mount) -> None:
    (mnt.path / "logs_tmp").mkdir()
    (mnt.path / "logs_tmp" / "a.log").write_text("a")
    os.rename(mnt.path / "logs_tmp", mnt.path / "2024")
    assert status(mnt.path / "2024") is None
    # ... while a directory holding checkpoint files renamed to a step name is one (evidence)
    (mnt.path / "tmp_save").mkdir()
    torch.save({"w": torch.ones(3)}, mnt.path / "tmp_save" / "model.pt")
    os.rename(mnt.path / "tmp_save", mnt.path / "step_9")
    assert status(mnt.path / "step_9") == "sealed"


WRITE_GROUP = r"""
import os, sys, torch
d, marker = sys.argv[1], sys.argv[2]
os.makedirs(d)
torch.save({"w": torch.ones(4)}, os.path.join(d, "model.pth"))
torch.save({"o": torch.ones(4)}, os.path.join(d, "optimizer.pth"))
open(os.path.join(d, "MANIFEST.json"), "w").write("{}")
if marker == "1":
    open(os.path.join(d, "COMMIT.json"), "w").write("{}")
"""


def test_learned_marker_tears_a_save_that_never_wrote_it(tmp_path: Path) -> None:
    """The seed paper's group writer seals each step with COMMIT.json.  Once a sibling was sealed by
    it, a step directory whose writer exited without it is torn, not idle-sealed."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--idle-seal", "1"]) as m:
        for step in (1, 2):
            subprocess.run([sys.executable, "-c", WRITE_GROUP, str(m.path / f"step_{step}"), "1"], check=True,
                           env=_env())
            assert status(m.path / f"step_{step}") == "sealed"
        subprocess.run([sys.executable, "-c", WRITE_GROUP, str(m.path / "step_3"), "0"], check=True, env=_env())
        time.sleep(JUDGED + 1)  # past the 1 s idle seal
        assert sorted(os.listdir(m.path)) == ["step_1", "step_2"]
        rows = {r["path"]: r for r in groups(m.path, m.path)}
        assert rows["step_3"]["state"] == "torn" and "COMMIT.json" in rows["step_3"]["reason"]
        # without a sibling sealed by a marker the same layout idle-seals (a finished save)
        sub = m.path / "other"
        sub.mkdir()
        subprocess.run([sys.executable, "-c", WRITE_GROUP, str(sub / "step_1"), "0"], check=True, env=_env())
        deadline = time.monotonic() + 10
        while status(sub / "step_1") != "sealed":
            assert time.monotonic() < deadline, "idle seal never happened"
            time.sleep(0.2)


def test_refused_incomplete_file_tears_the_group_and_fails_once(mnt: Mount) -> None:
    """An incomplete torch file refused at close is evidence the save was cut: its step directory
    (an idle-seal layout) is torn, not sealed without it.  fsync of that incomplete file before the
    close is not an error: one error (at close), one abort logged."""
    g = mnt.path / "step_4"
    code = f"""
import io, os, torch
buf = io.BytesIO(); torch.save({{"w": torch.ones(1000)}}, buf)
data = buf.getvalue()
os.makedirs({str(g)!r})
torch.save({{"o": torch.ones(3)}}, {str(g / 'optimizer.pt')!r})
fd = os.open({str(g / 'model.pt')!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, data[: len(data) // 2])
os.fsync(fd)                      # half a file: not refused here
try:
    os.close(fd)
    print("close ok")
except OSError as e:
    print("close", e.errno)
"""
    r = run_py(code)
    assert r.stdout.split() == ["close", "5"]
    time.sleep(JUDGED)
    assert "step_4" not in os.listdir(mnt.path)
    rows = {x["path"]: x for x in groups(mnt.path, mnt.path)}
    assert rows["step_4"]["state"] == "torn" and "incomplete file refused" in rows["step_4"]["reason"]
    aborts = [a for a in json.loads(os.getxattr(mnt.path, "user.ckptfs.aborts")) if a["path"] == "step_4/model.pt"]
    assert len(aborts) == 1, aborts


def test_fsync_of_a_complete_open_file_commits_it(mnt: Mount) -> None:
    p = mnt.path / "w.pt"
    code = f"""
import os, torch
f = open({str(p)!r}, "wb")
torch.save({{"w": torch.ones(10)}}, f)
f.flush(); os.fsync(f.fileno())
print(os.getxattr({str(p)!r}, "user.ckptfs.status").decode(), flush=True)
f.close()
"""
    assert run_py(code).stdout.strip() == "committed"


MAKER = r"""
import os, sys, torch
root = sys.argv[1]
os.makedirs(os.path.join(root, "checkpoint-1"))
for n in ("config.json", "trainer_state.json"):
    open(os.path.join(root, "checkpoint-1", n), "w").write("{}")
os.makedirs(os.path.join(root, "checkpoint-2"))   # the next save starts ... and the process ends
"""


@pytest.mark.parametrize("exit_events", [pytest.param(True, marks=needs_exit_events), False])
def test_empty_dir_made_by_a_checkpoint_writer(tmp_path: Path, exit_events: bool) -> None:
    """A trainer that sealed checkpoint-1 makes checkpoint-2 and ends without writing into it.  With
    the kernel's exit events ckptfs knows it exited normally: the directory stays (a normal exit is
    no evidence).  Without them (not root: CKPTFS_EXIT_EVENTS=0 here) the fallback evidence is that
    a writer of a sibling group of the same layout made it: torn, so HF's resume does not pick an
    empty checkpoint-2.  ``mkdir checkpoint-3`` by anyone else stays either way."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, env=None if exit_events else {"CKPTFS_EXIT_EVENTS": "0"}) as m:
        subprocess.run([sys.executable, "-c", MAKER, str(m.path)], check=True, env=_env())
        subprocess.run(["mkdir", str(m.path / "checkpoint-3")], check=True)
        time.sleep(JUDGED)
        want = ["checkpoint-1", "checkpoint-2", "checkpoint-3"] if exit_events else ["checkpoint-1", "checkpoint-3"]
        assert sorted(os.listdir(m.path)) == want
        rows = {r["path"]: r for r in groups(m.path, m.path)}
        assert ("checkpoint-2" in rows) == (not exit_events)
        if not exit_events:
            assert rows["checkpoint-2"]["state"] == "torn" and "sibling" in rows["checkpoint-2"]["reason"]
        assert "checkpoint-3" not in rows
        m.remount(env=None if exit_events else {"CKPTFS_EXIT_EVENTS": "0"})
        assert sorted(os.listdir(m.path)) == want


def test_note_rewritten_in_a_sealed_group_reseals_it(mnt: Mount) -> None:
    """A README rewritten in a sealed HF group is an addition (G10), not a re-save: the group is
    resealed with it once quiet, never torn or rolled back."""
    g = mnt.path / "checkpoint-5"
    g.mkdir()
    torch.save({"o": torch.ones(3)}, g / "optimizer.pt")
    (g / "README.md").write_text("v1")
    (g / "trainer_state.json").write_text("{}")
    assert status(g) == "sealed"
    subprocess.run(["sh", "-c", f"echo v2 >> {g / 'README.md'}"], check=True)
    time.sleep(JUDGED)
    assert status(g) == "sealed"
    assert (g / "README.md").read_text() == "v1v2\n"
    mnt.remount()
    assert status(g) == "sealed" and (g / "README.md").read_text() == "v1v2\n"


KILLED_MAKER = r"""
import os, sys, time
os.makedirs(sys.argv[1])
print("made", flush=True)
time.sleep(60)   # killed here, before its first file (a save killed after mkdir)
"""


@needs_exit_events
def test_empty_dir_whose_maker_was_killed_is_torn(mnt: Mount) -> None:
    """A checkpoint-named directory whose maker was killed before writing anything into it is torn
    (the process exit events say how it ended); one whose maker exited normally stays."""
    p = subprocess.Popen([sys.executable, "-c", KILLED_MAKER, str(mnt.path / "step-6")], stdout=subprocess.PIPE,
                         text=True, env=_env())
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "made"
        subprocess.run(["mkdir", str(mnt.path / "step-7")], check=True)
        run_py(f"import os; os.mkdir({str(mnt.path / 'step-8')!r})")
        time.sleep(1.5)
        assert sorted(os.listdir(mnt.path)) == ["step-6", "step-7", "step-8"]  # maker of step-6 alive
    finally:
        p.kill()
        p.wait()
    assert sorted(os.listdir(mnt.path)) == ["step-7", "step-8"]
    rows = {r["path"]: r for r in groups(mnt.path, mnt.path)}
    assert rows["step-6"]["state"] == "torn" and "signal 9" in rows["step-6"]["reason"]
    time.sleep(JUDGED)
    mnt.remount()
    assert sorted(os.listdir(mnt.path)) == ["step-7", "step-8"]


KILLED_BETWEEN_FILES = r"""
import os, sys, torch
root, n_good, kill_after = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for step in range(1, n_good + 2):
    d = os.path.join(root, f"ckpt_{step}")
    os.makedirs(d)
    for name in ("model.pt", "optim.pt", "meta.pt"):
        torch.save({"step": step, "name": name, "w": torch.ones(100) * step}, os.path.join(d, name))
        if step == n_good + 1 and name == kill_after:
            os.kill(os.getpid(), 9)  # between two files of the save: model.pt closed, optim.pt not begun
"""


@needs_exit_events
@pytest.mark.parametrize("n_good", [0, 2], ids=["first-group", "later-group"])
def test_a_writer_killed_between_two_files_leaves_its_group_torn(tmp_path: Path, n_good: int) -> None:
    """Issue 25: ``mkdir ckpt_N; torch.save x3`` killed after model.pt closed and before optim.pt was
    opened.  No file was open at the kill, and the layout seals on idle: it was sealed 30 s later as
    good and every resume crashed (FileNotFoundError: optim.pt), the run's first group included.
    The exit events say the writer died of SIGKILL: torn, hidden, never named by ``ckptfs latest``;
    the complete groups before it seal on idle as before and stay (no good group hidden)."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--idle-seal", "1"]).start():
        r = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_FILES, str(d), str(n_good), "model.pt"],
                           env=_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == -9, r.stderr
        time.sleep(JUDGED + 1.5)  # past the idle seal of the good ones and the judgement of the torn one
        rows = {x["path"]: x for x in groups(d, d)}
        torn = f"ckpt_{n_good + 1}"
        assert rows[torn]["state"] == "torn" and "killed" in rows[torn]["reason"], rows
        assert not (d / torn).exists()
        for step in range(1, n_good + 1):
            assert rows[f"ckpt_{step}"]["state"] == "sealed", rows
            assert torch.load(d / f"ckpt_{step}" / "optim.pt")["step"] == step
        latest = subprocess.run([sys.executable, "-m", "ckptfs", "latest", str(d)], env=_env(),
                                capture_output=True, text=True)
        if n_good:
            assert latest.returncode == 0 and latest.stdout.strip().endswith(f"ckpt_{n_good}"), latest
        else:
            assert latest.returncode == 1 and latest.stdout.strip() == "", latest


@pytest.mark.portable
@pytest.mark.parametrize("marker", ["echo done > {d}/COMMIT", "printf ok > {d}/DONE", "touch {d}/DONE"],
                         ids=["echo", "printf", "touch"])
def test_a_marker_written_by_a_shell_seals_an_intact_group(tmp_path: Path, marker: str) -> None:
    """Issue 25: bash opens COMMIT, dup2s it to stdout and closes the original fd before writing:
    that close's FLUSH committed an empty COMMIT and sealed the group, ``done`` came after, and the
    next mount quarantined the intact group (unmounted verify: "COMMIT: size 5, manifest says 0").
    The FLUSH of an empty new file its process still holds open commits nothing; the last close does."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--idle-seal", "1"]).start():
        subprocess.run(["bash", "-c", "mkdir step_1 && head -c 5000 /dev/urandom > step_1/data.bin && "
                        + marker.format(d="step_1")], cwd=d, check=True)
        want = (d / "step_1" / "data.bin").read_bytes()
        time.sleep(JUDGED)
        rows = {x["path"]: x for x in groups(d, d)}
        assert rows["step_1"]["state"] == "sealed", rows
        r = subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(d)], env=_env(), capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(d)], env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr  # unmounted: the same verdict
    with Mount(d).start():
        rows = {x["path"]: x for x in groups(d, d)}
        assert rows["step_1"]["state"] == "sealed", rows
        assert (d / "step_1" / "data.bin").read_bytes() == want
        name = "COMMIT" if "COMMIT" in marker else "DONE"
        assert (d / "step_1" / name).read_bytes() == {"echo": b"done\n", "printf": b"ok", "touch": b""}[
            marker.split()[0]]


ATOMIC_WRITER = r"""
import json, os, sys
root = sys.argv[1]
def atomic(p, data):
    t = p + ".tmp"
    with open(t, "wb") as f:
        f.write(data); f.flush(); os.fsync(f.fileno())
    os.rename(t, p)
for n in (1, 2, 3):
    e = os.path.join(root, f"epoch_{n}")
    os.makedirs(e)
    atomic(os.path.join(e, "model.bin"), os.urandom(5000))
    if n == 3:
        os.kill(os.getpid(), 9)  # between two renamed files of the third save
    atomic(os.path.join(e, "optim.bin"), os.urandom(3000))
    atomic(os.path.join(e, "MANIFEST"), b"model.bin\noptim.bin\n")
    atomic(os.path.join(e, "COMMIT.json"), json.dumps({"epoch": n}).encode())
"""


@needs_exit_events
def test_files_renamed_into_a_directory_form_a_group(tmp_path: Path) -> None:
    """Issue 25: the seed paper's atomic writer (tmp + fsync + rename into ``epoch_N/model.bin``)
    never formed a group: a killed save stayed visible and ``ckptfs latest`` found nothing.  A
    rename that lands a checkpoint file in a directory is evidence as a create is."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        r = subprocess.run([sys.executable, "-c", ATOMIC_WRITER, str(d)], env=_env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == -9, r.stderr
        time.sleep(JUDGED)
        rows = {x["path"]: x for x in groups(d, d)}
        assert rows["epoch_1"]["state"] == rows["epoch_2"]["state"] == "sealed", rows
        assert rows["epoch_3"]["state"] == "torn", rows
        assert not (d / "epoch_3").exists()
        latest = subprocess.run([sys.executable, "-m", "ckptfs", "latest", str(d)], env=_env(),
                                capture_output=True, text=True)
        assert latest.stdout.strip() == str(d / "epoch_2"), latest


LISTER = "import os, sys; print(' '.join(sorted(os.listdir(sys.argv[1]))))"


def _list(d: Path, own_session: bool) -> list[str]:
    argv = [sys.executable, "-c", LISTER, str(d)]
    if own_session:
        argv = ["setsid", "-w", *argv]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.portable
def test_an_open_group_is_listed_only_to_its_writers_job(tmp_path: Path) -> None:
    """Issue 25: an evaluation job picking the newest ``checkpoint-N`` while the trainer saves loaded
    half-written directories (27 of 82 loads failed).  While a group is open, a process of another
    process session does not list it; the trainer's own session (its ranks, its shell) does; once
    sealed everyone does.  A lookup by its exact name still works (``ckptfs.wait_sealed``)."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        save = subprocess.Popen([sys.executable, "-c", (
            "import os, sys, json, torch\n"
            "g = sys.argv[1] + '/checkpoint-1'\nos.mkdir(g)\n"
            "torch.save({'w': torch.ones(4)}, g + '/model.pt')\n"
            "print('saved', flush=True)\nsys.stdin.readline()\n"
            "open(g + '/trainer_state.json', 'w').write(json.dumps({'global_step': 1}))\n"), str(d)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env())
        try:
            assert save.stdout is not None and save.stdin is not None
            assert save.stdout.readline().strip() == "saved"
            assert _list(d, own_session=True) == []  # another job: not listed while open
            assert _list(d, own_session=False) == ["checkpoint-1"]  # this session (the trainer's job)
            assert os.path.isdir(d / "checkpoint-1")  # by name: still there
            save.stdin.write("go\n")
            save.stdin.flush()
            assert save.wait(60) == 0
        finally:
            if save.poll() is None:
                save.kill()
                save.wait()
        assert _list(d, own_session=True) == ["checkpoint-1"]  # sealed: listed for everyone


RESAVE = r"""
import json, os, sys, torch
g = sys.argv[1] + "/checkpoint-1"
os.makedirs(g, exist_ok=True)
step, how = int(sys.argv[2]), sys.argv[3]
if how == "rename" and step == 2:  # an already-atomic writer: tmp + fsync + rename
    torch.save({"w": torch.full((1000,), float(step))}, g + "/model.pt.tmp")
    os.rename(g + "/model.pt.tmp", g + "/model.pt")
else:
    torch.save({"w": torch.full((1000,), float(step))}, g + "/model.pt")
if step == 2:
    torch.save({"added": True}, g + "/optimizer.pt")
    if how == "unlink":
        os.unlink(g + "/scheduler.pt")
    print("saved", flush=True)
    sys.stdin.readline()
else:
    torch.save({"s": 1}, g + "/scheduler.pt")
open(g + "/trainer_state.json", "w").write(json.dumps({"global_step": step}))
"""

SEER = r"""
import json, os, sys, torch
g = sys.argv[1] + "/checkpoint-1"
out = {"root": sorted(os.listdir(sys.argv[1]))}
if out["root"]:
    out.update({"dir": sorted(os.listdir(g)), "model": float(torch.load(g + "/model.pt")["w"][0]),
                "size": os.stat(g + "/model.pt").st_size,
                "step": json.load(open(g + "/trainer_state.json"))["global_step"],
                "optimizer": os.path.exists(g + "/optimizer.pt"), "scheduler": os.path.exists(g + "/scheduler.pt")})
    if out["scheduler"]:
        out["scheduler_loads"] = torch.load(g + "/scheduler.pt") == {"s": 1}
print(json.dumps(out))
"""


def _seen(d: Path, own_session: bool) -> dict:
    argv = [sys.executable, "-c", SEER, str(d)]
    if own_session:
        argv = ["setsid", "-w", *argv]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.portable
@pytest.mark.parametrize("how", ["inplace", "rename", "unlink"])
def test_a_resave_shows_other_jobs_the_last_seal(tmp_path: Path, how: str) -> None:
    """Issue 25 (RS1): while a sealed ``checkpoint-1/`` is saved again (``model.pt`` rewritten in
    place or by tmp + rename, ``optimizer.pt`` added, the marker not yet rewritten), a process of
    another job still lists it and sees exactly its last seal: the old ``model.pt`` (bytes and
    size), no ``optimizer.pt`` nor tmp file, as if the re-save were being written in a temporary
    directory.  A re-save that also removes a sealed file (``scheduler.pt``: no copy is kept of
    an unlinked file) cannot be shown as sealed: the group is then unlisted to other jobs until
    it seals, never shown mixed.  The writers' own session sees the new files.  Once the marker
    seals the re-save, everyone sees the new save."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        r = subprocess.run([sys.executable, "-c", RESAVE, str(d), "1", how], env=_env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert status(d / "checkpoint-1") == "sealed"
        sealed = _seen(d, own_session=True)
        assert sealed["model"] == 1.0 and sealed["scheduler"] and not sealed["optimizer"], sealed
        w = subprocess.Popen([sys.executable, "-c", RESAVE, str(d), "2", how], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=_env())
        try:
            assert w.stdout is not None and w.stdin is not None
            assert w.stdout.readline().strip() == "saved"
            assert status(d / "checkpoint-1") == "open"
            other = _seen(d, own_session=True)
            if how == "unlink":
                assert other == {"root": []}, other  # no view: unlisted to another job
            else:
                assert other == sealed, (other, sealed)  # another job: the last seal, whole
            mine = _seen(d, own_session=False)  # the writer's session
            assert mine["model"] == 2.0 and mine["optimizer"] and mine["scheduler"] == (how != "unlink"), mine
            assert release_and_reap(w) == 0
        finally:
            kill_if_running(w)
        assert status(d / "checkpoint-1") == "sealed"
        after = _seen(d, own_session=True)
        assert after["model"] == 2.0 and after["step"] == 2 and after["optimizer"], after
        assert "model.pt.tmp" not in after["dir"], after


def test_a_sealed_view_open_racing_the_install_of_the_resaved_file_serves_the_sealed_file(tmp_path: Path) -> None:
    """RS1 under the race the re-save race campaign met once in ~7,000 passes (a reader of another
    job read ``model.bin`` of the save being written beside the sealed ``optim.bin``): the view
    picks the sealed file at its path and opens it; the writer's close installs the new file and
    its record right then; the open was checked against the path's record *now*, found another
    inode and reopened the path: the new file, served as sealed.  Now it is checked against the
    sealed record and the reader gets the sealed bytes.  Driven on the filesystem object, the
    install placed exactly in that window."""
    from ckptfs.backing import OsBackingStore
    from ckptfs.fs import Caller, CkptFS
    from ckptfs_testing.direct import write_file

    fs = CkptFS(OsBackingStore(str(tmp_path)), housekeeping_interval=0)
    reader = subprocess.Popen(["setsid", "sleep", "60"])  # a process of another job (session)
    try:
        me = Caller(pid=os.getpid())
        fs.mkdir("checkpoint-1", 0o755)
        for name, data in (("model.bin", b"A" * 5000), ("optim.bin", b"B" * 3000),
                           ("trainer_state.json", b'{"global_step": 1}')):
            write_file(fs, f"checkpoint-1/{name}", data, pid=me.pid)
        g = fs.grp.group_of("checkpoint-1/model.bin")
        assert g is not None and g.state == "sealed"
        fh = fs.open("checkpoint-1/model.bin", os.O_WRONLY | os.O_TRUNC, me)  # the re-save
        fs.write(fh, b"N" * 7000, 0, me)
        assert g.state == "open"
        real = fs._sealed_file
        installed = []

        def install_meanwhile(path, caller, get):  # type: ignore[no-untyped-def]
            got = real(path, caller, get)
            if path == "checkpoint-1/model.bin" and get is not fs.store.lstat and not installed:
                fs.flush(fh, me)  # the writer's close: its file and record installed now
                fs.release(fh, me)
                installed.append(True)
            return got

        fs._sealed_file = install_meanwhile  # type: ignore[method-assign]
        other = Caller(pid=reader.pid)
        rh = fs.open("checkpoint-1/model.bin", os.O_RDONLY, other)
        assert installed and fs.stats["sealed_view_opens"] == 1
        assert fs.read(rh, 10000, 0) == b"A" * 5000  # the sealed file, not the re-save's
        fs.release(rh, other)
        assert (tmp_path / "checkpoint-1" / "model.bin").read_bytes() == b"N" * 7000
    finally:
        reader.kill()
        reader.wait()
        fs.shutdown()


@pytest.mark.portable
def test_the_resave_race_harness_catches_a_mount_without_the_sealed_view(tmp_path: Path) -> None:
    """RS1 under a race (``scripts/resave_race_campaign``, ``ckptfs_testing/resave_race.py``): a
    trainer saves ``checkpoint-1/`` again and again while two evaluation jobs (``setsid``) read all
    its files; a pass during which the group's seal did not change must show one save whole.  The
    harness must catch the known-bad variant ``no-sealed-view`` (RS1 off: 78 of 227 passes mixed two
    saves); ckptfs as is is measured by the campaign (docs/results/readers.md: a rare race remains,
    so the suite does not require zero here; the deterministic cases are
    ``test_a_resave_shows_other_jobs_the_last_seal``)."""
    from ckptfs_testing.resave_race import run

    bad = run(tmp_path / "bad", seconds=4, variant="no-sealed-view")
    assert bad["saves"] >= 10 and bad["mixed"] > 0, bad
    good = run(tmp_path / "good", seconds=4)
    print(f"ckptfs: {good}; no-sealed-view: {bad}")
    assert good["saves"] >= 10 and good["passes_within_one_seal"] >= 50, good


NEXT_SAVE = r"""
import os, sys, torch
root = sys.argv[1]
for step in (1, 2):
    d = os.path.join(root, f"ckpt_{step}")
    os.makedirs(d)
    if step == 2:
        print("began 2", flush=True)
        sys.stdin.readline()
    for name in ("model.pt", "optim.pt", "meta.pt"):
        torch.save({"step": step, "name": name}, os.path.join(d, name))
    if step == 2:
        print("wrote 2", flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), 9)
"""


@pytest.mark.portable
def test_a_loop_beginning_its_next_save_seals_the_one_before(tmp_path: Path) -> None:
    """Issue 25: a hand-written loop (``ckpt_N/{model,optim,meta}.pt``, no marker) sealed each step
    only 30 s after its last write; saving more often than that, no step was ever sealed, so an
    evaluation job in another session never listed any (0 loads in 464 tries, eval race campaign)
    and ``ckptfs latest`` found nothing.  The writer's ``mkdir`` of its next step of the same layout
    is the completion event of the one before: sealed at once (idle seal 60 s here), listed to
    another job, named by ``ckptfs latest``.  The step being written stays unlisted to that job,
    and its writer killed after all three files leaves it torn: a group is sealed by evidence only."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d, extra_args=["--idle-seal", "60"]).start():
        w = subprocess.Popen([sys.executable, "-c", NEXT_SAVE, str(d)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=_env())
        try:
            assert w.stdout is not None and w.stdin is not None
            assert w.stdout.readline().strip() == "began 2"
            assert os.getxattr(d / "ckpt_1", "user.ckptfs.status") == b"sealed"
            assert _list(d, own_session=True) == ["ckpt_1"]
            latest = subprocess.run([sys.executable, "-m", "ckptfs", "latest", str(d)], env=_env(),
                                    capture_output=True, text=True)
            assert latest.returncode == 0 and latest.stdout.strip().endswith("ckpt_1"), latest
            w.stdin.write("go\n")
            w.stdin.flush()
            assert w.stdout.readline().strip() == "wrote 2"
            assert os.getxattr(d / "ckpt_2", "user.ckptfs.status") == b"open"  # no next save: not finished
            assert _list(d, own_session=True) == ["ckpt_1"]
            w.stdin.write("go\n")
            w.stdin.flush()
            assert w.wait(60) == -9
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
        if _exit_events():  # the kill is evidence: torn, hidden
            deadline = time.monotonic() + 10
            while (d / "ckpt_2").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not (d / "ckpt_2").exists()
        assert torch.load(d / "ckpt_1" / "optim.pt")["step"] == 1
        assert _list(d, own_session=True)[:1] == ["ckpt_1"]
