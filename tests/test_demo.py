"""scripts/demo (the README's first command) runs, shows what ckptfs prevents, and cleans up after
itself, also when interrupted with Ctrl-C (issue 13)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from conftest import ROOT

from ckptfs.mounts import read_mountinfo


def _ckptfs_mounts(under: str) -> set[str]:
    """ckptfs mounts at or below ``under`` (the demo's own temporary directory: other mounts on the
    machine, another test's or a developer's, are none of this test's business)."""
    top = under.rstrip("/")
    return {m.mountpoint for m in read_mountinfo()
            if m.fstype == "fuse.ckptfs" and (m.mountpoint == top or m.mountpoint.startswith(top + "/")
                                              or m.mountpoint.startswith(top + "\\040(deleted)"))}


def test_the_demo_shows_a_torn_plain_file_and_an_intact_ckptfs_one() -> None:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "demo")], capture_output=True, text=True, timeout=600)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert re.search(r"plain directory +model\.pt \(\d+ MiB\) is torn: torch\.load fails", out), out
    assert re.search(r"ckptfs mount +model\.pt \(\d+ MiB\) loads: step 1", out), out
    assert "killed by signal 9" in out and "-> committed" in out
    assert re.search(r"sealed +100 .* checkpoint-100", out) and re.search(r"torn +200 .* checkpoint-200", out), out
    assert "ckptfs latest ckpts -> checkpoint-100" in out and "demo: OK" in out
    top = re.search(r"a temporary directory: (\S+);", out)
    assert top and not os.path.exists(top.group(1))
    assert _ckptfs_mounts(top.group(1)) == set()


def test_ctrl_c_leaves_no_mount_and_no_files() -> None:
    # (SIGINT as a terminal gives it: a test run started in the background, ``cmd &``, inherits
    # SIGINT ignored, and the demo would then never see the Ctrl-C)
    p = subprocess.Popen(["bash", str(ROOT / "scripts" / "demo")], stdout=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert p.stdout is not None
        first = p.stdout.readline()
        top = re.search(r"a temporary directory: (\S+);", first)
        assert top, first
        time.sleep(1.0)  # inside part 1: a save is running
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        rest = p.stdout.read()
        assert p.wait(120) == 130, rest
        assert "interrupted; cleaning up" in rest
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert not os.path.exists(top.group(1))
    assert _ckptfs_mounts(top.group(1)) == set()
