"""The Python API (ckptfs.status / latest / wait_sealed) and ``ckptfs latest``, on a real mount and
on the same directory unmounted (issue 13)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import Mount
from test_groups import save_hf_like

import ckptfs


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True, text=True, timeout=120)


def test_latest_names_the_newest_sealed_group_mounted_and_unmounted(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    m = Mount(d).start()
    try:
        r = cli("latest", str(m.path))
        assert r.returncode == 1 and r.stdout == "" and "no sealed group or committed file" in r.stderr
        assert ckptfs.latest(m.path) is None
        save_hf_like(m.path, 2)
        save_hf_like(m.path, 10)  # step order, not name order: checkpoint-10 is newer than checkpoint-2
        assert ckptfs.wait_sealed(m.path / "checkpoint-10", timeout=30) == str(m.path / "checkpoint-10")
        (m.path / "checkpoint-11").mkdir()
        torch.save({"w": torch.ones(4)}, m.path / "checkpoint-11" / "model.pt")
        # checkpoint-11 has no trainer_state.json: open, never the latest
        assert ckptfs.status(m.path / "checkpoint-11")["status"] == "open"
        with pytest.raises(TimeoutError):
            ckptfs.wait_sealed(m.path / "checkpoint-11", timeout=0.5)
        assert ckptfs.latest(m.path) == str(m.path / "checkpoint-10")
        r = cli("latest", str(m.path))
        assert r.returncode == 0 and r.stdout.strip() == str(m.path / "checkpoint-10"), r
        js = json.loads(cli("latest", "--json", str(m.path)).stdout)
        assert js["latest"] == str(m.path / "checkpoint-10") and js["status"] == "sealed" and js["mounted"]
        f = ckptfs.status(m.path / "checkpoint-10" / "model.pt")
        assert f["status"] == "committed" and f["mounted"] is True and len(f["blake3"]) == 64
        mounted_digest = f["blake3"]
    finally:
        m.kill()  # a crash: checkpoint-11 stays open on disk
    # unmounted: the same answers from the metadata; the group the crash left open is torn
    assert ckptfs.latest(d) == str(d / "checkpoint-10")
    assert cli("latest", str(d)).stdout.strip() == str(d / "checkpoint-10")
    assert ckptfs.status(d / "checkpoint-11")["status"] == "torn"
    f = ckptfs.status(d / "checkpoint-10" / "model.pt")
    assert f["status"] == "committed" and f["mounted"] is False and f["blake3"] == mounted_digest
    with pytest.raises(RuntimeError, match="torn"):
        ckptfs.wait_sealed(d / "checkpoint-11", timeout=5)


def test_waiting_for_a_group_whose_writer_dies_says_torn(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    with Mount(d) as m:
        save_hf_like(m.path, 2)  # sealed by its marker: so a sibling without one is torn, not idle-sealed
        g = m.path / "checkpoint-3"
        w = subprocess.Popen([sys.executable, "-c", f"import os, sys, time, torch\nos.mkdir({str(g)!r})\n"
                              f"torch.save({{'a': 1}}, {str(g / 'model.pt')!r})\nprint('saved', flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
        try:
            assert w.stdout is not None and w.stdout.readline().strip() == "saved"
            killer = threading.Timer(0.5, lambda: (w.kill(), w.wait()))  # dead and reaped
            killer.start()
            with pytest.raises(RuntimeError, match="torn"):
                ckptfs.wait_sealed(g, timeout=30)
            killer.join()
        finally:
            w.kill()
            w.wait()


def test_latest_of_plain_files_and_wait_for_a_directory(tmp_path: Path) -> None:
    """A directory without groups: its newest committed file.  wait_sealed of a directory returns
    once none of its groups is open (a group sealed by another process meanwhile)."""
    d = tmp_path / "run"
    d.mkdir()
    with Mount(d) as m:
        (m.path / "logs").mkdir()
        for step in (100, 300, 200):  # commit order, not name order
            torch.save({"step": step}, m.path / "logs" / f"model_{step}.pt")
            time.sleep(0.01)
        # newer, committed, and never a checkpoint to resume from (issue 25: latest named train.log
        # and latest.txt, and the README's --resume_from_checkpoint "$(ckptfs latest DIR)" got a log)
        for name in ("notes.txt.partial", "train.log", "latest.txt", "latest", "metrics.json"):
            (m.path / "logs" / name).write_bytes(b"{}" if name.endswith(".json") else b"model_200.pt")
        assert ckptfs.latest(m.path / "logs") == str(m.path / "logs" / "model_200.pt")
        assert cli("latest", str(m.path / "logs")).stdout.strip() == str(m.path / "logs" / "model_200.pt")
        g = m.path / "checkpoint-5"
        g.mkdir()
        torch.save({"w": torch.zeros(2)}, g / "model.pt")
        t = threading.Timer(0.5, lambda: (g / "trainer_state.json").write_text(json.dumps({"global_step": 5})))
        t.start()
        try:
            assert ckptfs.wait_sealed(m.path, timeout=30) == str(g)
        finally:
            t.join()


def test_paths_ckptfs_does_not_manage_get_clear_errors(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ckptfs.NotCkptfs):
        ckptfs.latest(plain)
    r = cli("latest", str(plain))
    assert r.returncode == 2 and "not inside a ckptfs mount" in r.stderr and "Traceback" not in r.stderr
    r = cli("latest", str(tmp_path / "missing"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_verify_and_latest_json_agree_mounted_and_unmounted_at_any_depth(tmp_path: Path) -> None:
    """Issue 25: ``verify ROOT`` checked 0 groups two levels down; ``verify --json`` gave relative
    paths unmounted and absolute mounted; ``latest --json`` nested JSON inside strings."""
    d = tmp_path / "run"
    d.mkdir()

    def check(mounted: bool) -> None:
        r = cli("verify", str(d))
        assert r.returncode == 0 and "and 2 groups" in r.stdout, (mounted, r.stdout, r.stderr)
        r = cli("verify", "--json", str(d))
        paths = sorted(json.loads(line)["path"] for line in r.stdout.splitlines())
        assert paths and all(p.startswith(str(d) + "/") for p in paths), paths
        js = json.loads(cli("latest", "--json", str(d / "jobs" / "a")).stdout)
        assert isinstance(js["group"], dict) and js["group"]["path"] == "jobs/a/checkpoint-2", js

    with Mount(d):
        save_hf_like(d / "jobs" / "a", 1)
        save_hf_like(d / "jobs" / "a", 2)
        check(True)
    check(False)
