"""Issue 26: whatever ckptfs reads may have been written by someone else.  A planted ``.ckptfs``
(a link, another user's directory) is refused before anything in it is used, and a journal entry
naming a path outside the directory is reported and skipped, never applied.  Real mounts and the
real CLI; nothing outside the directory under test is created, changed or deleted."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Mount, _env

from ckptfs import META_DIR
from ckptfs.log.journal import encode_frame


@contextlib.contextmanager
def _reachable_dir(prefix: str, name: str, mode: int) -> Iterator[Path]:
    """A directory ``name`` (mode ``mode``) that the test users can reach: under /tmp, not under
    pytest's tmp_path (root's 0700 home); removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        base.chmod(0o755)
        d = base / name
        d.mkdir()
        d.chmod(mode)
        yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


def ckptfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=120)


def _victim(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    v = tmp_path / "root-only"
    v.mkdir(mode=0o700)
    files = {"secret.txt": b"root's data", "keep.bin": os.urandom(100)}
    for n, b in files.items():
        (v / n).write_bytes(b)
    return v, files


def _untouched(v: Path, files: dict[str, bytes]) -> None:
    assert sorted(os.listdir(v)) == sorted(files)
    for n, b in files.items():
        assert (v / n).read_bytes() == b


@pytest.mark.parametrize("plant", ["link", "staging-link", "log-link", "other-owner", "group-writable"])
def test_a_planted_metadata_directory_is_refused(tmp_path: Path, plant: str) -> None:
    """The directory's owner plants ``.ckptfs`` (``staging -> /root-only/dir``: recovery deleted every
    file there; ``daemon.log`` -> a root-only file: the daemon appended to it).  ``mount``,
    ``recover`` and ``gc`` as root refuse with one line and exit 2; nothing outside is touched."""
    v, files = _victim(tmp_path)
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / "model.pt").write_bytes(b"user data")
    meta = d / META_DIR
    if plant == "link":
        meta.symlink_to(v)
    else:
        meta.mkdir(mode=0o700)
        if plant == "staging-link":
            (meta / "staging").symlink_to(v)
        elif plant == "log-link":
            (meta / "daemon.log").symlink_to(v / "secret.txt")
        elif plant == "other-owner":
            (meta / "staging").mkdir()
            os.chown(meta, 65534, 65534)
        else:
            meta.chmod(0o777)
    for args in (["mount", str(d)], ["recover", str(d)], ["gc", str(d)]):
        r = ckptfs(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and ".ckptfs" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    _untouched(v, files)
    assert (d / "model.pt").read_bytes() == b"user data"
    assert not subprocess.run(["mountpoint", "-q", str(d)]).returncode == 0


def _plant_entries(d: Path, entries: list[dict]) -> None:
    """Journal entries written into a trusted (root's own) ``.ckptfs`` while unmounted: what a bug,
    a restored backup or a user with the daemon's uid could leave."""
    with Mount(d).start():
        pass
    j = sorted(p for p in (d / META_DIR).iterdir() if p.name.startswith("journal."))
    snap = d / META_DIR / "snapshot"
    epoch = 0
    if snap.exists():
        from ckptfs.log.journal import decode_frames

        frames, _ = decode_frames(snap.read_bytes())
        epoch = int(frames[0]["epoch"])
    jp = d / META_DIR / f"journal.{epoch}"
    with open(jp, "ab") as f:
        for e in entries:
            f.write(encode_frame(e))
    assert j is not None


def test_journal_entries_naming_paths_outside_are_skipped(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / "a.txt").write_text("a")
    _plant_entries(d, [
        {"op": "rename", "src": "a.txt", "dst": "../moved_by_root.txt"},
        {"op": "unlink", "path": "../outside.txt"},
        {"op": "symlink", "path": "../evil", "target": "/etc/passwd"},
        {"op": "mkdir", "path": "/abs/dir"},
        {"op": "link", "src": "../outside.txt", "dst": "x/../../y"},
        {"op": "group_trash", "path": "a.txt", "to": "../../trash"},
    ])
    r = ckptfs("recover", str(d))
    assert r.returncode == 0, r.stderr
    assert outside.read_text() == "mine"
    assert not (tmp_path / "moved_by_root.txt").exists() and not (tmp_path / "evil").exists()
    assert not Path("/abs/dir").exists() and not (tmp_path / "y").exists()
    assert (d / "a.txt").read_text() == "a"
    with Mount(d).start():
        assert (d / "a.txt").read_text() == "a"
        stats = json.loads(os.getxattr(d, "user.ckptfs.stats"))
        assert stats is not None
    assert outside.read_text() == "mine"


def test_layout_safe_rel() -> None:
    from ckptfs.layout import safe_rel

    for ok in ("a", "a/b.pt", "step_1/.metadata", "x..y"):
        assert safe_rel(ok), ok
    for bad in ("", "/a", "../a", "a/../../b", "a//b", "./a", "a/.", "a\0b", ".ckptfs/x", ".ckptfs", 5, None,
                "a" * 20000):
        assert not safe_rel(bad), bad
    assert safe_rel(".ckptfs/staging/x", ".ckptfs/staging") and not safe_rel(".ckptfs/staging/../../x",
                                                                            ".ckptfs/staging")


def test_another_users_configuration_is_refused(tmp_path: Path) -> None:
    """Issue 26: a ``.ckptfs.toml`` another user wrote into a shared (1777) root set ``keep_last = 1``
    and the daemon deleted someone else's checkpoints.  Only the directory's owner or root configure
    ckptfs: anyone else's file (or a link, or one writable by others) refuses the mount, exit 2."""
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    cfg = d / ".ckptfs.toml"
    cfg.write_text("keep_last = 1\n")
    for how in ("other-owner", "group-writable", "link"):
        if how == "other-owner":
            os.chown(cfg, 65534, 65534)
        elif how == "group-writable":
            os.chown(cfg, 0, 0)
            cfg.chmod(0o666)
        else:
            cfg.unlink()
            (tmp_path / "real.toml").write_text("keep_last = 1\n")
            cfg.symlink_to(tmp_path / "real.toml")
        for fg in ([], ["-f"]):
            r = ckptfs("mount", *fg, str(d))
            assert r.returncode == 2 and ".ckptfs.toml" in r.stderr and "Traceback" not in r.stderr, (how, r.stderr)
            assert subprocess.run(["mountpoint", "-q", str(d)]).returncode != 0


@pytest.mark.parametrize("opt", ["--cache-timeout", "--idle-seal", "--scrub-rate", "--scrub-interval"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_option_values_must_be_finite(tmp_path: Path, opt: str, value: str) -> None:
    """``--cache-timeout nan`` hung the mount and answered EIO to everything; ``--idle-seal inf`` was
    accepted: a one-line usage error, exit 2."""
    r = ckptfs("mount", str(tmp_path), opt, value)
    assert r.returncode == 2 and "Traceback" not in r.stderr and opt in r.stderr, r.stderr


SAVE_AS = r"""
import io, json, os, sys, torch
uid, root, step = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.save({"warm": step}, io.BytesIO())  # every lazy import done while the checkout is readable
os.setgroups([]); os.setgid(uid); os.setuid(uid)
g = os.path.join(root, f"checkpoint-{step}")
os.mkdir(g, 0o700)
torch.save({"step": step}, os.path.join(g, "model.pt"))
with open(os.path.join(g, "trainer_state.json"), "w") as f:
    json.dump({"global_step": step}, f)
"""


def test_retention_and_sibling_rules_stay_within_one_owner(tmp_path: Path, users: list) -> None:
    """Issue 26: in a shared sticky directory with ``--keep-last 1``, user B's checkpoint-1000 retired
    user A's checkpoint-1 (natively the sticky bit forbids B to touch it).  Retention counts each
    owner's groups on their own; and the one sealed last is always kept (issue 25)."""
    with _reachable_dir("ckptfs-owners-", "shared", 0o1777) as d:
        with Mount(d, extra_args=["--allow-other", "--keep-last", "1"]).start():
            (_, a, _), (_, b, _) = users
            for uid, step in ((a, 1), (b, 1000), (a, 2), (b, 1001)):
                r = subprocess.run([sys.executable, "-c", SAVE_AS, str(uid), str(d), str(step)], env=_env(),
                                   capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, r.stderr
            time.sleep(2.5)
            names = sorted(os.listdir(d))
            # each owner keeps their newest one: A's checkpoint-2 and B's checkpoint-1001
            assert "checkpoint-2" in names and "checkpoint-1001" in names, names
            assert "checkpoint-1" not in names and "checkpoint-1000" not in names, names


def test_a_user_mounts_through_fusermount3_without_opening_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: as a user, ckptfs opened ``/dev/fuse`` itself before calling the setuid
    ``fusermount3``, so where the device is 0600 (as on this machine) no user could mount.  Not
    root, the device is never opened here: fusermount3 opens it and passes the fd back (its real
    protocol: ``test_native.py::test_fusermount3_passes_a_working_fuse_connection``)."""
    from ckptfs.fuse import session

    called = []
    monkeypatch.setattr(session.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(session, "fusermount_mount", lambda t, s, a: called.append((t, s, a)) or 42)
    assert session.kernel_mount("/mnt/x", "ckptfs:x", False, dev="/nonexistent/fuse") == 42
    assert called == [("/mnt/x", "ckptfs:x", False)]


def test_a_filesystem_mounted_inside_the_mount_stays_mounted(tmp_path: Path) -> None:
    """Issue 26: a tmpfs mounted inside a ckptfs mount was silently detached when a group sealed
    beside it (the kernel revalidates every dentry after an epoch bump, and invalidating a
    mountpoint detaches its mount); later writes landed in the directory underneath."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        (d / "sub").mkdir()
        # a group opened and sealed first: its epoch bumps read the mount table before the tmpfs
        # is there (the daemon keeps it until the kernel says the table changed: fuse/notify.py)
        (d / "checkpoint-0").mkdir()
        subprocess.run([sys.executable, "-c", "import sys, torch; torch.save({'a': 0}, sys.argv[1])",
                        str(d / "checkpoint-0" / "model.pt")], check=True, env=_env())
        (d / "checkpoint-0" / "trainer_state.json").write_text("{}")
        assert os.getxattr(d / "checkpoint-0", "user.ckptfs.status") == b"sealed"
        subprocess.run(["mount", "-t", "tmpfs", "none", str(d / "sub")], check=True)
        try:
            (d / "sub" / "x").write_text("on the tmpfs")
            (d / "checkpoint-1").mkdir()
            subprocess.run([sys.executable, "-c", "import sys, torch; torch.save({'a': 1}, sys.argv[1])",
                            str(d / "checkpoint-1" / "model.pt")], check=True, env=_env())
            (d / "checkpoint-1" / "trainer_state.json").write_text("{}")
            import time as _t

            _t.sleep(0.5)
            assert os.listdir(d / "sub") == ["x"]
            assert subprocess.run(["mountpoint", "-q", str(d / "sub")]).returncode == 0
            assert os.getxattr(d / "checkpoint-1", "user.ckptfs.status") == b"sealed"
        finally:
            subprocess.run(["umount", str(d / "sub")], capture_output=True)


def test_recover_and_forget_refuse_what_is_not_theirs(tmp_path: Path) -> None:
    """Issue 26: ``recover`` turned a plain directory into a ckptfs directory; ``forget`` of a path
    with no record exited 0."""
    plain = tmp_path / "plain"
    plain.mkdir()
    r = ckptfs("recover", str(plain))
    assert r.returncode == 2 and "not a ckptfs directory" in r.stderr, r.stderr
    assert not (plain / META_DIR).exists()
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        (d / "a.json").write_text("{}")
    r = ckptfs("forget", str(d), "unknown.pt")
    assert r.returncode == 1 and "no record" in r.stderr, r.stderr


AS_USER_VERIFY = r"""
import os, sys
import ckptfs.cli.parser, ckptfs.cli.integrity, ckptfs.cli.groups, ckptfs.integrity.verify  # before setuid
import ckptfs.cli.common, ckptfs.mounts, ckptfs.api, ckptfs.offline, ckptfs.log.metadata, ckptfs.xattrs
from ckptfs.cli import main
uid, gid = int(sys.argv[2]), int(sys.argv[3])
os.setgroups([]); os.setgid(gid); os.setuid(uid)
sys.exit(main(["verify", sys.argv[1]]))
"""


def test_verify_by_another_user_never_cries_corrupt(tmp_path: Path, users: list) -> None:
    """Issue 26: ``verify`` by a user who may read but not verify (a daemon-side check needs write
    access to the file's status) reported intact files as "CORRUPT ... Permission denied", exit 1.
    Now: "not verified: permission denied", exit 2, and no file called corrupt."""
    with _reachable_dir("ckptfs-verify-", "m", 0o755) as d:
        with Mount(d, extra_args=["--allow-other"]).start():
            (d / "model.pt").write_bytes(b"\0" * 100)
            os.chmod(d / "model.pt", 0o644)
            _, uid, gid = users[0]
            r = subprocess.run([sys.executable, "-c", AS_USER_VERIFY, str(d), str(uid), str(gid)],
                               capture_output=True, text=True, env=_env(), timeout=120)
            assert r.returncode == 2, (r.stdout, r.stderr)
            assert "corrupt" not in r.stderr.lower().replace("0 corrupt", ""), r.stderr
            assert "permission denied" in r.stderr and "Traceback" not in r.stderr, r.stderr
            r = ckptfs("verify", str(d))
            assert r.returncode == 0, r.stdout + r.stderr  # as root: verified


def test_a_real_committed_view_directory_is_never_shadowed(tmp_path: Path) -> None:
    """Issue 26: a user's own ``.ckptfs-committed`` directory at the root showed as ``d?????????``
    (the virtual committed view shadowed it and its files).  Then the view is off for that mount."""
    d = tmp_path / "ckpts"
    (d / ".ckptfs-committed").mkdir(parents=True)
    (d / ".ckptfs-committed" / "mine.txt").write_text("mine")
    with Mount(d).start():
        assert (d / ".ckptfs-committed" / "mine.txt").read_text() == "mine"
        assert os.listdir(d / ".ckptfs-committed") == ["mine.txt"]
        (d / ".ckptfs-committed" / "more.txt").write_text("writable as natively")
    assert (d / ".ckptfs-committed" / "more.txt").read_text() == "writable as natively"


def test_a_snapshot_that_is_a_directory_is_a_clear_error(tmp_path: Path) -> None:
    """Issue 26: ``.ckptfs/snapshot`` made a directory while unmounted gave an IsADirectoryError
    traceback from ``verify`` and from ``mount``.  Now one line naming the file and the way out
    (``recover --rebuild``), which then mounts with every file readable (records read back from the
    files' own); a symbolic link there is refused the same way by ``verify``."""
    d = tmp_path / "ckpts"
    d.mkdir()
    with Mount(d).start():
        (d / "model.pt").write_bytes(b"weights" * 100)
    snap = d / META_DIR / "snapshot"
    snap.unlink()
    snap.mkdir()
    for args, rc in ((("verify", str(d)), 2), (("mount", str(d)), 1)):
        r = ckptfs(*args)
        assert r.returncode == rc and "Traceback" not in r.stderr, (args, r.stderr)
        assert "snapshot is not a regular file" in r.stderr and "recover --rebuild" in r.stderr, r.stderr
        assert subprocess.run(["mountpoint", "-q", str(d)]).returncode != 0
    r = ckptfs("recover", "--rebuild", str(d))
    assert r.returncode == 0, r.stdout + r.stderr
    with Mount(d).start():
        assert (d / "model.pt").read_bytes() == b"weights" * 100
    assert ckptfs("verify", str(d)).returncode == 0
    snap.unlink()
    snap.symlink_to(tmp_path / "elsewhere")
    r = ckptfs("verify", str(d))
    assert r.returncode == 2 and "snapshot is a symbolic link" in r.stderr and "Traceback" not in r.stderr, r.stderr


AS_USER_SCRUB = AS_USER_VERIFY.replace('main(["verify", sys.argv[1]])', 'main(["scrub", "--wait", sys.argv[1]])')


def test_scrub_by_another_user_is_one_line_refusal(tmp_path: Path, users: list) -> None:
    """Issue 26: ``scrub`` by a user who is not the mount's owner ended in a traceback (ENODATA from
    the root's status attribute, or EACCES reading ``.ckptfs/`` unmounted).  Now one line, exit 2,
    mounted and unmounted; the owner's scrub still runs."""
    with _reachable_dir("ckptfs-scrub-", "m", 0o755) as d:
        with Mount(d, extra_args=["--allow-other"]).start():
            (d / "model.pt").write_bytes(b"\0" * 100)
            as_user = [str(users[1][1]), str(users[1][2])]
            r = subprocess.run([sys.executable, "-c", AS_USER_SCRUB, str(d), *as_user], capture_output=True,
                               text=True, env=_env(), timeout=120)
            assert r.returncode == 2 and "scrub refused: permission denied" in r.stderr, (r.stdout, r.stderr)
            assert "Traceback" not in r.stderr, r.stderr
            r = ckptfs("scrub", "--wait", str(d))
            assert r.returncode == 0 and json.loads(r.stdout)["files"] >= 1, r.stdout + r.stderr
        r = subprocess.run([sys.executable, "-c", AS_USER_SCRUB, str(d), *as_user], capture_output=True,
                           text=True, env=_env(), timeout=120)
        assert r.returncode == 2 and "permission denied" in r.stderr and "Traceback" not in r.stderr, r.stderr


MOUNT_AS_USER = r"""
import importlib, os, pkgutil, sys
import ckptfs
for m in pkgutil.walk_packages(ckptfs.__path__, "ckptfs."):  # every module, before the checkout may be unreadable
    if "darwin" not in m.name and not m.name.endswith("__main__"):
        importlib.import_module(m.name)
uid, gid, target = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.setgroups([]); os.setgid(gid); os.setuid(uid)
from ckptfs.cli import main
sys.exit(main(["mount", "-f", target]))
"""

AS_USER_RUN = r"""
import os, sys
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([]); os.setgid(gid); os.setuid(uid)
os.execvp(sys.argv[3], sys.argv[3:])
"""


def test_a_user_mounts_for_real_through_fusermount3(users: list) -> None:
    """Issue 26: a real account (``useradd``), not root, mounts its own directory.  Where
    ``/dev/fuse`` is 0600 (this machine's default) the setuid ``fusermount3`` cannot open it either
    (it opens the device as the user): one line naming the device and what to do, exit 2 (it was a
    traceback).  With the device 0666 (Debian's udev default; set for this test and restored),
    ``fusermount3`` opens it and passes the fd back: the user saves, reads and unmounts, and the
    file is plain and whole after."""
    from ckptfs.mounts import read_mountinfo

    name, uid, gid = users[0]

    def as_user(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", AS_USER_RUN, str(uid), str(gid), *argv], capture_output=True,
                              text=True, env=_env(), timeout=120)

    def mounted(d: Path) -> bool:
        return bool([m for m in read_mountinfo() if m.mountpoint == str(d) and m.fstype == "fuse.ckptfs"])

    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    with _reachable_dir("ckptfs-usermount-", "ckpts", 0o700) as d:
        os.chown(d, uid, gid)
        try:
            os.chmod("/dev/fuse", 0o600)
            r = subprocess.run([sys.executable, "-c", MOUNT_AS_USER, str(uid), str(gid), str(d)], env=_env(),
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 2 and "/dev/fuse" in r.stderr and "0666" in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
            assert not mounted(d)
            os.chmod("/dev/fuse", 0o666)
            p = subprocess.Popen([sys.executable, "-c", MOUNT_AS_USER, str(uid), str(gid), str(d)], env=_env(),
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                deadline = time.monotonic() + 30
                while not mounted(d):
                    assert p.poll() is None, p.stderr.read() if p.stderr else ""
                    assert time.monotonic() < deadline, "no mount"
                    time.sleep(0.05)
                m = [m for m in read_mountinfo() if m.mountpoint == str(d)][0]
                assert f"user_id={uid}" in m.super_options, m
                data = os.urandom(20000).hex()
                # (the user's own tools: this Python may live where the user cannot read)
                r = as_user("sh", "-c", 'printf %s "$2" > "$1"', "sh", str(d / "model.json"), f'"{data}"')
                assert r.returncode == 0, r.stderr
                r = as_user("getfattr", "--only-values", "-n", "user.ckptfs.pid", str(d))
                assert r.returncode == 0 and int(r.stdout) == p.pid, r.stdout + r.stderr
                r = as_user("cat", str(d / "model.json"))
                assert r.returncode == 0 and r.stdout == f'"{data}"', r.stderr
                r = as_user("fusermount3", "-u", str(d))
                assert r.returncode == 0, r.stderr
                assert p.wait(60) == 0, p.stderr.read() if p.stderr else ""
            finally:
                if p.poll() is None:
                    subprocess.run(["umount", "-l", str(d)], capture_output=True)
                    p.kill()
                    p.wait()
        finally:
            os.chmod("/dev/fuse", mode)
        assert not mounted(d)
        assert (d / "model.json").read_text() == f'"{data}"'
        st = (d / "model.json").stat()
        assert (st.st_uid, st.st_gid) == (uid, gid)
        assert (d / META_DIR).stat().st_uid == uid  # the daemon's own uid: the user's


def test_a_planted_group_commit_entry_names_no_path_outside(tmp_path: Path) -> None:
    """An ``install_batch`` entry (async group commit, engine/commit.py C5) is confined like every
    other entry: an item staging from outside the directory, or installing outside it, makes the
    whole entry untrusted; nothing is moved (its record even matches the file outside, so a
    recovery that finished it would have taken that file in)."""
    from ckptfs.hashing import IncrementalDigest

    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"mine, outside the mount")
    dig = IncrementalDigest()
    dig.update(outside.read_bytes(), 0)
    whole, chunks = dig.finish(outside.stat().st_size)
    rec = {"size": outside.stat().st_size, "blake3": whole, "chunks": chunks, "generation": 1,
           "committed_at": 0.0, "ino": outside.stat().st_ino}
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / "a.txt").write_text("a")
    _plant_entries(d, [{"op": "install_batch", "items": [
        {"op": "install", "path": "stolen.txt", "staging": "../outside.txt", "rec": rec},
        {"op": "install", "path": "../moved_by_root.txt", "staging": ".ckptfs/staging/x", "rec": rec}]}])
    r = ckptfs("recover", str(d))
    assert r.returncode == 0, r.stderr
    assert outside.read_bytes() == b"mine, outside the mount"
    assert not (d / "stolen.txt").exists() and not (tmp_path / "moved_by_root.txt").exists()
    assert (d / "a.txt").read_text() == "a"
