"""Bad input to `ckptfs mount/umount` gets one clear line and a non-zero exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import Mount, _env

from ckptfs.backing import OsBackingStore
from ckptfs.cli import is_ckptfs_mount
from ckptfs.log.journal import Journal
from ckptfs.procinfo import is_alive as pid_alive


def ckptfs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True,
                          env=_env(env), timeout=60)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: error: "), r.stderr
    return lines[0]


def test_missing_mountpoint(tmp_path) -> None:
    assert "no such directory" in one_error_line(ckptfs("mount", str(tmp_path / "nope")))


def test_mountpoint_is_a_file(tmp_path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    assert "not a directory" in one_error_line(ckptfs("mount", str(f)))


def test_already_mounted(mnt: Mount) -> None:
    msg = one_error_line(ckptfs("mount", str(mnt.path)))
    assert "already a ckptfs mount" in msg
    assert os.listdir(mnt.path) == []  # the running mount is untouched and still serves
    (mnt.path / "x").write_text("still serving")
    assert (mnt.path / "x").read_text() == "still serving"


def test_no_dev_fuse(tmp_path) -> None:
    msg = one_error_line(ckptfs("mount", str(tmp_path), env={"CKPTFS_DEV_FUSE": str(tmp_path / "nofuse")}))
    assert "fuse" in msg and "missing" in msg


def test_no_libfuse3(tmp_path) -> None:
    msg = one_error_line(ckptfs("mount", str(tmp_path), env={"CKPTFS_LIBFUSE3_NAME": "fuse3-not-installed"}))
    assert "libfuse3 not found" in msg and "apt-get install fuse3 libfuse3-3" in msg


def test_no_dev_fuse_in_a_container_says_what_to_pass(tmp_path) -> None:
    msg = one_error_line(ckptfs("mount", str(tmp_path), env={"CKPTFS_DEV_FUSE": str(tmp_path / "nofuse")}))
    assert "--device /dev/fuse --cap-add SYS_ADMIN" in msg


def test_not_root_without_fusermount3_is_a_clear_error() -> None:
    from ckptfs.cli.common import CliError
    from ckptfs.cli.mount import check_unprivileged

    with pytest.raises(CliError, match="not root and fusermount3 is missing: install fuse3"):
        check_unprivileged(1000, which=lambda name: None)
    check_unprivileged(1000, which=lambda name: "/usr/bin/fusermount3")  # fine
    check_unprivileged(0, which=lambda name: None)  # root mounts with mount(2)


def test_allow_other_as_a_user_without_user_allow_other_is_a_usage_error(tmp_path) -> None:
    """Issue 26: fusermount3 refused it and ckptfs said exit 1; the README promises 2 for this."""
    from ckptfs.cli.common import CliError
    from ckptfs.cli.mount import check_unprivileged

    conf = tmp_path / "fuse.conf"
    conf.write_text("# user_allow_other\nmount_max = 1000\n")
    fm = lambda name: "/usr/bin/fusermount3"  # noqa: E731
    with pytest.raises(CliError, match="user_allow_other") as e:
        check_unprivileged(1000, which=fm, allow_other=True, fuse_conf=str(conf))
    assert e.value.code == 2
    conf.write_text("user_allow_other\n")
    check_unprivileged(1000, which=fm, allow_other=True, fuse_conf=str(conf))  # fine


def test_mounting_over_a_directory_being_written_is_refused(tmp_path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    w = subprocess.Popen([sys.executable, "-c", f"import time\nf = open({str(d / 'log.txt')!r}, 'w')\n"
                          "print('open', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout is not None and w.stdout.readline().strip() == "open"
        msg = one_error_line(ckptfs("mount", str(d)))
        assert f"process {w.pid} (python" in msg and "log.txt open for writing" in msg and "--force" in msg
        assert not is_ckptfs_mount(str(d))
    finally:
        w.kill()
        w.wait()
    r = ckptfs("mount", str(d))  # the writer is gone: mounts
    try:
        assert r.returncode == 0, r.stderr
    finally:
        ckptfs("umount", str(d))


def test_a_backing_directory_on_tmpfs_mounts_with_a_durability_warning(tmp_path) -> None:
    t = tmp_path / "t"
    t.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(t)], check=True)
    try:
        r = ckptfs("mount", str(t))
        try:
            assert r.returncode == 0, r.stderr
            assert "warning" in r.stderr and "tmpfs keeps nothing across a power loss" in r.stderr
        finally:
            ckptfs("umount", str(t))
        r = ckptfs("mount", str(tmp_path))  # ext4 (or whatever /tmp is here): no warning unless it is tmpfs
        try:
            assert r.returncode == 0 and ("tmpfs" in r.stderr) == (_fstype(tmp_path) == "tmpfs"), r.stderr
        finally:
            ckptfs("umount", str(tmp_path))
    finally:
        subprocess.run(["umount", str(t)], check=False)


def _fstype(p) -> str:
    from ckptfs.mounts import containing

    e = containing(str(p))
    return e.fstype if e else ""


@pytest.mark.parametrize("opt", [["--keep-last", "0"], ["--keep-last", "x"], ["--keep-every", "-2"],
                                 ["--keep-generations", "-1"], ["--scrub-rate", "-5"], ["--idle-seal", "soon"],
                                 ["--cache-timeout", "-1"], ["--commit", "later"]])
def test_bad_option_values_are_clear_errors(tmp_path, opt: list[str]) -> None:
    r = ckptfs("mount", str(tmp_path), *opt)
    assert r.returncode == 2 and opt[0] in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not is_ckptfs_mount(str(tmp_path))


def test_progress_bars_with_rate_and_eta_only_when_asked_or_on_a_terminal(tmp_path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    with Mount(d) as m:
        for i in range(3):
            (m.path / f"f{i}.bin").write_bytes(os.urandom(3 << 20))
        r = ckptfs("scrub", str(m.path), "--wait", "--progress")
        assert r.returncode == 0 and "100.0%" in r.stderr and "MiB/s ETA" in r.stderr, r.stderr
        assert json.loads(r.stdout)["state"] == "idle"
        r = ckptfs("scrub", str(m.path), "--wait")  # not a terminal: no bar
        assert r.returncode == 0 and "ETA" not in r.stderr
        assert json.loads(ckptfs("show", "--json", str(m.path / "f0.bin")).stdout)["status"] == "committed"
    r = ckptfs("verify", str(d), "--progress")
    assert r.returncode == 0 and "100.0%" in r.stderr and "MiB/s ETA" in r.stderr, r.stderr
    r = ckptfs("verify", str(d))
    assert r.returncode == 0 and "ETA" not in r.stderr and r.stdout.strip().endswith("OK")


def test_umount_not_mounted(tmp_path) -> None:
    assert "not a ckptfs mount" in one_error_line(ckptfs("umount", str(tmp_path)))


def test_background_mount_and_umount(tmp_path) -> None:
    d = tmp_path / "bg"
    d.mkdir()
    r = ckptfs("mount", str(d))
    assert r.returncode == 0, r.stderr
    try:
        pid = int(os.getxattr(str(d), "user.ckptfs.pid"))
        (d / "a.json").write_text('{"ok": true}')
        assert os.getxattr(str(d / "a.json"), "user.ckptfs.status") == b"committed"
    finally:
        r = ckptfs("umount", str(d))
    assert r.returncode == 0, r.stderr
    assert not pid_alive(pid)  # umount waited for the daemon to exit (a zombie counts as exited)
    assert (d / "a.json").read_text() == '{"ok": true}'


def test_stale_mount_is_replaced(tmp_path) -> None:
    """A SIGKILLed daemon's mount is replaced by the next ``ckptfs mount``, every time, also with the
    root's attributes in the kernel's cache (stat just before the kill: ``stat`` then answers from
    the cache, not ENOTCONN; issue 24 found 11 of 26 such trials refused as a live mount)."""
    d = tmp_path / "stale"
    d.mkdir()
    (d / "keep.txt").write_text("kept")
    for trial in range(8):
        m = Mount(d).start()
        try:
            os.stat(d)
            os.stat(d / "keep.txt")
            os.kill(m.pid, 9)
            m.proc.wait()
            os.stat(d)  # cached: no ENOTCONN here
            r = ckptfs("mount", str(d))  # detects the dead mount, detaches it, mounts again
            try:
                assert r.returncode == 0, (trial, r.stderr)
                assert "stale ckptfs mount" in r.stderr, (trial, r.stderr)
                assert (d / "keep.txt").read_text() == "kept"
            finally:
                assert ckptfs("umount", str(d)).returncode == 0
        finally:
            m.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_foreground_daemon_cleanly(tmp_path, sig: int) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    m = Mount(d, commit="async").start()
    for i in range(10):
        (d / f"f{i}.json").write_text(json.dumps({"i": i}))
    os.kill(m.pid, sig)
    assert m.proc.wait(60) == 0
    assert not is_ckptfs_mount(str(d))
    for i in range(10):
        assert json.loads((d / f"f{i}.json").read_text()) == {"i": i}
    st = Journal(OsBackingStore(str(d))).load()
    assert st.entries == [] and len(st.files) == 10  # shut down cleanly: nothing left to replay
    m.stop()


def test_output_cut_short_by_the_reader_is_no_traceback(tmp_path) -> None:
    """`ckptfs ls DIR | head -1`: the reader goes away after one line; ckptfs stops quietly with
    the shell's SIGPIPE status (141), without the BrokenPipeError traceback it printed before."""
    import torch

    d = tmp_path / "ck"
    d.mkdir()
    with Mount(d):
        for i in range(60):
            g = d / f"checkpoint-{i}"
            g.mkdir()
            torch.save({"w": torch.zeros(2)}, g / "model.pt")
            (g / "trainer_state.json").write_text("{}")
    for entry in ([sys.executable, "-m", "ckptfs"], [sys.executable, "-m", "ckptfs.cli"]):
        cmd = " ".join(entry) + f" ls {d} | head -1"
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=_env(), timeout=60)
        assert r.stdout.startswith("STATE") and r.stdout.count("\n") == 1, r.stdout
        assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
        # a reader that is gone before the first write (``true`` exits at once; ckptfs takes a while
        # to start): every write fails with EPIPE
        cmd = " ".join(entry) + f" ls {d} | true; echo rc=${{PIPESTATUS[0]}} >&2"
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=_env(), timeout=60)
        assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
        assert r.stderr.strip().endswith("rc=141"), r.stderr


@pytest.mark.parametrize("after", [0.15, 0.4, 0.8])
def test_ctrl_c_while_mount_starts_leaves_no_mount(tmp_path, after: float) -> None:  # noqa: ANN001
    """``ckptfs mount DIR`` interrupted while its daemon (its own session) starts: the daemon went
    on and mounted after the command had gone (the demo's Ctrl-C test left a mount behind under
    load).  Now the command stops its daemon by PID: no mount, no daemon, whenever the Ctrl-C lands."""
    import time

    from ckptfs.mounts import read_mountinfo

    d = tmp_path / "ckpts"
    d.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "ckptfs", "mount", str(d)], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,  # (SIGINT not ignored, as in a terminal)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    time.sleep(2.0)  # a daemon that went on would have mounted by now
    mounted = [m for m in read_mountinfo() if m.mountpoint == str(d)]
    if mounted and "mounted" in out:  # the Ctrl-C came after the mount was ready: the command had succeeded
        assert after >= 0.4, (after, out)  # (at 0.15 s the daemon cannot have started yet)
        subprocess.run([sys.executable, "-m", "ckptfs", "umount", str(d)], env=_env(), check=True)
        return
    assert not mounted, (out, err)
    daemons = [q for q in os.listdir("/proc") if q.isdigit() and pid_alive(int(q))
               and str(d).encode() in _cmdline(int(q)) and b"-f" in _cmdline(int(q)).split(b"\0")]
    assert not daemons, daemons


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
