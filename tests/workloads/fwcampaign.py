"""Kill campaigns of the framework workloads on a real ckptfs mount (shared by the tests and
``scripts/framework_campaign``).

One trial (``Campaign.trial``):

1. (except the first) the job of the previous trial was killed; check the **live** mount: the
   framework's own resume logic (a forked ``resume`` job) finds a checkpoint and it is bit-exact
   (``check_loaded``), and every visible group is sealed (``check_tree``);
2. remount: clean stop + start, or daemon ``kill -9`` + start (recovery), then ``check_tree``;
3. start a ``train`` job: it resumes by the framework's own logic (its ledger ``resumed`` record
   is checked like 1 - the post-remount check) and keeps training and saving;
4. wait until the job has begun its N-th save (N random in 1..3), then ``killpg(SIGKILL)`` the job
   (every rank): in half of the trials after a random time in ``[0, 1.5 x the longest save window
   seen so far]``, in the other half *aimed between two files*: at the first moment, after a file
   under the job's directory was open, that none is (between two files of the save, or after the
   last one before its marker: with ckptfs most of a save's time is inside ``close()``, so random
   kills rarely land there, issue 25).

Bit-exact (``check_loaded``): the ledger (outside the mount, fsynced) holds, for every save the
workload began, the digest of the state it passed to the framework.  A loaded step ``s`` must
equal the *newest* ``begin`` digest for ``s`` (an older attempt at ``s`` was superseded), and
``s`` must be at least the newest step whose save returned (``end``) - nothing acknowledged lost.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WL = Path(__file__).resolve().parent
sys.path.insert(0, str(WL))
sys.path.insert(0, str(WL.parent.parent))

import fwlib  # noqa: E402

from ckptfs_testing.lineserver import LineServer  # noqa: E402
from ckptfs_testing.mount import Mount  # noqa: E402
from ckptfs_testing.mount import child_env as _env  # noqa: E402

STATUS = "user.ckptfs.status"


@dataclass(frozen=True)
class Framework:
    """How to run one workload and what its checkpoints look like on disk."""

    name: str
    script: str
    save_every: int
    group_re: str = ""  # base names of group directories
    file_re: str = ""  # base names of single-file checkpoints
    extra: dict[str, Any] = field(default_factory=dict)
    # hand-written loops: each job its own session (a restart is another job: it sees a group only
    # once it is sealed), a short idle seal, and the checks after the idle seal judged the group
    own_session: bool = False
    mount_args: tuple[str, ...] = ()
    settle: float = 0.0
    # idle-seal layouts (no completion record): a group whose writer was killed after its last
    # file, before the idle seal, is torn (docs/design.md: the cost of the exit evidence); its
    # loss is allowed and counted as a good group hidden.  Every other layout: nothing acknowledged lost
    may_hide: bool = False


LOOP: dict[str, Any] = {"own_session": True, "mount_args": ("--idle-seal", "2"), "settle": 4.0, "may_hide": True}

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("hf", "fw_hf.py", 2, group_re=r"checkpoint-\d+"),
    Framework("lightning", "fw_lightning.py", 2, file_re=r"(step=\d+|last)\.ckpt"),
    Framework("dcp1", "fw_dcp.py", 1, group_re=r"step-\d+", extra={"ws": 1}),
    Framework("dcp4", "fw_dcp.py", 1, group_re=r"step-\d+", extra={"ws": 4}),
    Framework("deepspeed", "fw_deepspeed.py", 2, group_re=r"global_step\d+", file_re="latest"),
    Framework("safetensors", "fw_safetensors.py", 1, file_re=r"model\.safetensors"),
    Framework("nemo", "fw_nemo.py", 1, group_re=r"model--step=\d+", extra={"ws": 2}),
    Framework("ckptn", "fw_loops.py", 1, group_re=r"ckpt_\d+", extra={"kind": "ckptn"}, **LOOP),
    Framework("inplace", "fw_loops.py", 1, file_re=r"model\.pt", extra={"kind": "inplace"}, **LOOP),
    Framework("seed-unsafe", "fw_loops.py", 1, group_re=r"epoch_\d+", extra={"kind": "seed-unsafe"}, **LOOP),
    Framework("seed-atomic", "fw_loops.py", 1, group_re=r"epoch_\d+", extra={"kind": "seed-atomic"}, **LOOP),
)}


class Server(LineServer):
    """Client of a ``fwlib.serve`` fork server running one workload script (imports paid once)."""

    def __init__(self, fw: Framework, errlog: Path) -> None:
        self.err = open(errlog, "ab")
        self.p = subprocess.Popen([sys.executable, str(WL / fw.script)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, text=True, env=_env())
        self.errlog = errlog
        assert self.ask("ping") == "pong", "fork server did not start"

    def died(self, line: str) -> str:
        return f"fork server died on {line!r}; stderr tail:\n{self.tail()}"

    def start(self, job: str, args: dict) -> int:
        return int(self.ask(f"run {job} {json.dumps(args)}").split()[1])

    def run(self, job: str, args: dict) -> None:
        """Run a job to completion; raise with the server's stderr tail if it failed."""
        st = self.reap(self.start(job, args))
        if st != 0:
            raise AssertionError(f"{job} job failed (wait status {st}):\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        self.err.flush()
        return self.errlog.read_bytes()[-n:].decode(errors="replace")

    def close(self) -> None:
        super().close()
        self.err.close()


def running(pid: int) -> bool:
    """``pid`` (a child of the fork server, not of ours) exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in "ZX":
                stat_pid = int(e)
                out.append(stat_pid)
    return out


def _has_open_under(pids: list[int], prefix: str) -> bool:
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{p}/fd/{fd}").startswith(prefix):
                    return True
            except OSError:
                continue
    return False


def wait_between_files(pgid: int, prefix: str, until: float) -> bool:
    """Poll the job's open files until, after one under ``prefix`` was open, none is; True if that
    moment came before ``until`` (monotonic), False if not (the caller kills it then anyway)."""
    seen = False
    while time.monotonic() < until:
        if _has_open_under(group_members(pgid), prefix):
            seen = True
        elif seen:
            return True
        time.sleep(0.0003)
    return False


def wait_group_dead(pgid: int, timeout: float = 30.0) -> None:
    """Wait until every process of the killed job (all ranks) has exited, as a scheduler would
    before restarting it; ckptfs can only call a group torn once its writers are gone."""
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        assert time.monotonic() < deadline, f"processes of job {pgid} survived SIGKILL"
        time.sleep(0.002)


def check_loaded(step: int | None, digest: dict, recs: list[dict], what: str,
                 hidden: frozenset[int] = frozenset()) -> None:
    """The resumed state is bit-exact what the workload saved at ``step``; nothing acknowledged is
    lost, except the steps in ``hidden``: groups ckptfs made torn although their save had returned
    (a writer killed after its last file, before the idle seal: the documented cost of the exit
    evidence, docs/design.md), each counted and reported as a *good group hidden*."""
    ended = [r["step"] for r in recs if r["ev"] == "end" and r["step"] not in hidden]
    if step is None:
        assert not ended, f"{what}: no checkpoint found although step {max(ended)} was saved"
        return
    begun = [r for r in recs if r["ev"] == "begin" and r["step"] == step]
    assert begun, f"{what}: loaded step {step}, which the workload never saved"
    want = begun[-1]["digest"]
    bad = sorted(k for k in set(want) | set(digest) if want.get(k) != digest.get(k))
    assert not bad, f"{what}: step {step} not bit-exact: {len(bad)} leaves differ, e.g. {bad[:3]}"
    assert not ended or step >= max(ended), f"{what}: loaded step {step} < acknowledged step {max(ended)}"


def check_tree(root: Path, fw: Framework) -> dict[str, int]:
    """Every group directory visible under ``root`` is sealed; every single-file checkpoint committed."""
    groups = files = 0
    gre, fre = re.compile(fw.group_re or r"(?!)"), re.compile(fw.file_re or r"(?!)")
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            if gre.fullmatch(d):
                st = os.getxattr(os.path.join(dirpath, d), STATUS).decode()
                assert st == "sealed", f"visible group {dirpath}/{d} is {st}"
                groups += 1
        for f in filenames:
            if fre.fullmatch(f):
                st = os.getxattr(os.path.join(dirpath, f), STATUS).decode()
                assert st == "committed", f"visible checkpoint file {dirpath}/{f} is {st}"
                files += 1
    return {"groups": groups, "files": files}


def visible_checkpoints(root: Path, fw: Framework) -> list[Path]:
    """Every visible group directory / single-file checkpoint (except pointers) under ``root``."""
    out = []
    for p in sorted(root.iterdir()):
        if (fw.group_re and p.is_dir() and re.fullmatch(fw.group_re, p.name)) or \
                (fw.file_re and p.is_file() and re.fullmatch(fw.file_re, p.name) and p.name != "latest"):
            out.append(p)
    return out


class Campaign:
    """Kill trials of one framework on one mount; ``work`` (outside the mount) holds ledger and logs."""

    def __init__(self, fw: Framework, mount: Mount | None, work: Path, seed: int, server: Server | None = None,
                 native: Path | None = None) -> None:
        """``mount`` None: the native control, in the plain directory ``native`` (no remounts, no
        status checks; a violation is recorded, the torn checkpoint removed as a user would, and
        the campaign goes on)."""
        self.fw, self.mount, self.work = fw, mount, work
        self.own_server = server is None
        self.rng = random.Random(seed)
        self.root = mount.path if mount is not None else native
        assert self.root is not None
        self.dir = self.root / fw.name
        self.violations: list[dict] = []  # native control only
        self.forgiven: set[int] = set()  # native: steps acknowledged before a violation's repair
        self.ledger = work / f"{fw.name}.ledger"
        self.server = server or Server(fw, work / f"{fw.name}.server.log")
        self.window = 0.05  # longest save window seen (s), refined from the ledger
        self.results: list[dict] = []

    def args(self, **kw: Any) -> dict:
        return {"dir": str(self.dir), "ledger": str(self.ledger), "save_every": self.fw.save_every,
                "store": str(self.work / f"{self.fw.name}.store"), "own_session": self.fw.own_session,
                **self.fw.extra, **kw}

    def hidden_steps(self) -> frozenset[int]:
        """Steps of the good groups ckptfs hid (``torn_good``); natively those a repair gave up."""
        if self.mount is None:
            return frozenset(self.forgiven)
        if not self.fw.may_hide:
            return frozenset()
        return frozenset(g["step"] for g in self.torn_good())

    def recs(self) -> list[dict]:
        return fwlib.Ledger.read(str(self.ledger))

    def resume_live(self, ckpt: Path | None = None) -> tuple[int | None, dict]:
        out = self.work / f"{self.fw.name}.out"
        if out.exists():
            out.unlink()
        self.server.run("resume", self.args(out=str(out), **({"ckpt": str(ckpt)} if ckpt else {})))
        res = json.loads(out.read_text())
        return res["step"], res["digest"]

    def check_all_visible(self) -> int:
        """Load every visible checkpoint explicitly: each is bit-exact one of the saves begun at its step.

        (Not necessarily the newest: a single file such as Lightning's ``step=4.ckpt`` whose
        re-save after a resume from an older ``last.ckpt`` was killed keeps its previous complete
        version, which is correct.)"""
        recs = self.recs()
        n = 0
        for p in visible_checkpoints(self.dir, self.fw) if self.dir.exists() else []:
            step, dg = self.resume_live(p)
            assert step is not None, f"{p} loads nothing"
            begun = [r for r in recs if r["ev"] == "begin" and r["step"] == step]
            assert any(r["digest"] == dg for r in begun), f"visible {p} (step {step}) is not what was saved"
            n += 1
        return n

    def remount(self, how: str) -> None:
        if how == "daemon-kill":
            self.mount.kill()
            self.mount.start()
        elif how == "clean":
            self.mount.remount()

    def wait_begins(self, pid: int, n0: int, n: int, deadline: float) -> dict | None:
        """Wait until the ledger has ``n`` more ``begin`` records than ``n0``; return the last one."""
        while time.monotonic() < deadline:
            begins = [r for r in self.recs() if r["ev"] == "begin"]
            if len(begins) >= n0 + n:
                return begins[n0 + n - 1]
            if not running(pid):
                raise AssertionError(f"train job exited early:\n{self.server.tail()}")
            time.sleep(0.002)
        raise AssertionError(f"train job made no progress:\n{self.server.tail()}")

    def update_window(self) -> None:
        recs = self.recs()
        begin_t = {}
        for r in recs:
            if r["ev"] == "begin":
                begin_t[r["step"]] = r["t"]
            elif r["ev"] == "end" and r["step"] in begin_t:
                self.window = max(self.window, r["t"] - begin_t[r["step"]])

    def native_trial(self, i: int) -> dict:
        """The native control's trial: as :meth:`trial`; a violation (the loop's own resume crashed,
        loaded something not saved, or lost an acknowledged save) is recorded, and the newest
        checkpoint removed, as a user would before restarting the job."""
        try:
            return self.trial(i, "none")
        except AssertionError as e:
            self.violations.append({"trial": i, "error": str(e).splitlines()[0][:300]})
            self._remove_newest()
            # the user restarts from what is left: what was acknowledged before is not counted again
            self.forgiven |= {r["step"] for r in self.recs() if r["ev"] == "end"}
            return {"trial": i, "violation": True}

    def _remove_newest(self) -> None:
        import shutil

        cands = visible_checkpoints(self.dir, self.fw) if self.dir.exists() else []
        if cands:
            p = max(cands, key=lambda q: q.stat().st_mtime)
            shutil.rmtree(p) if p.is_dir() else p.unlink()

    def torn_good(self) -> list[dict]:
        """Groups (their ``ckptfs ls`` rows) ckptfs made torn although the save they held had
        returned (ledger ``end``): a good group hidden.  The attempt a torn group held is the newest
        ``begin`` of its step before it was torn (its quarantine time, wall clock): a torn re-save
        of a step whose earlier save had returned holds the re-save, which never returned (the
        creation time, used before, named the earlier save: an upper bound, dcp1 4, deepspeed 3)."""
        if self.mount is None or not self.dir.exists():
            return []
        r = subprocess.run([sys.executable, "-m", "ckptfs", "ls", str(self.dir), "--all", "--json"],
                           capture_output=True, text=True, env=_env(), timeout=120)
        if r.returncode != 0:
            return []
        recs = self.recs()
        out = []
        for g in json.loads(r.stdout):
            if g.get("state") != "torn" or g.get("step") is None:
                continue
            torn_at = g.get("time") or g.get("when") or g.get("created_at", 0)
            begins = [k for k, x in enumerate(recs) if x["ev"] == "begin" and x["step"] == g["step"]
                      and x.get("wall", 0) <= torn_at]
            if not begins:
                continue
            k = begins[-1]
            nxt = next((x for x in recs[k + 1:] if x.get("step") == g["step"] and x["ev"] in ("begin", "end")), None)
            if nxt is not None and nxt["ev"] == "end":
                out.append(g)
        return out

    def trial(self, i: int, remount: str, verify_all: bool = False) -> dict:
        """One kill trial (see module docstring); returns its record.  Raises AssertionError on a violation."""
        res: dict[str, Any] = {"trial": i, "remount": remount}
        recs = self.recs()
        if i > 0 and self.mount is None:
            step, dg = self.resume_live()
            check_loaded(step, dg, recs, f"trial {i} resume", self.hidden_steps())
            res["live_step"] = step
        elif i > 0:
            step, dg = self.resume_live()
            check_loaded(step, dg, recs, f"trial {i} live resume", self.hidden_steps())
            res["live_step"] = step
            res["live_tree"] = check_tree(self.mount.path, self.fw)
            self.remount(remount)
            res["remount_tree"] = check_tree(self.mount.path, self.fw)
            if verify_all:
                res["verified"] = self.check_all_visible()
        n0 = sum(r["ev"] == "begin" for r in recs)
        nres0 = sum(r["ev"] == "resumed" for r in recs)
        pid = self.server.start("train", self.args(seed=0))
        target = self.rng.randint(1, 3)
        aimed = self.rng.random() < 0.5
        delay, between = 0.0, False
        try:
            b = self.wait_begins(pid, n0, target, time.monotonic() + 120)
            if aimed:
                between = wait_between_files(pid, str(self.dir) + "/", b["t"] + 3 * self.window + 2.0)
                delay = time.monotonic() - b["t"]
            else:
                delay = self.rng.uniform(0.0, 1.5 * self.window)
                time.sleep(max(0.0, b["t"] + delay - time.monotonic()))
        finally:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            status = self.server.reap(pid)
            wait_group_dead(pid)
        assert os.WIFSIGNALED(status), f"train job was not killed (status {status}):\n{self.server.tail()}"
        if self.fw.settle and self.mount is not None:
            time.sleep(self.fw.settle)  # the idle seal (or the torn judgement) of what the kill left
        recs = self.recs()
        resumed = [r for r in recs if r["ev"] == "resumed"][nres0:]
        if i > 0 and self.mount is not None:
            assert resumed or res["live_step"] is None, "train job did not resume"
            if resumed:
                prior = recs[:recs.index(resumed[0])]
                check_loaded(resumed[0]["step"], resumed[0]["digest"], prior, f"trial {i} resume after remount",
                             self.hidden_steps())
                res["remount_step"] = resumed[0]["step"]
        last_begin = [r for r in recs if r["ev"] == "begin"][-1]
        res["killed_in_save"] = not any(r["ev"] == "end" and r["step"] == last_begin["step"]
                                        for r in recs[recs.index(last_begin):])
        res["kill_delay"] = round(delay, 4)
        res["aimed"], res["between_files"] = aimed, between
        self.update_window()
        res["window"] = round(self.window, 4)
        self.results.append(res)
        return res

    def final_check(self, verify_all: bool = True) -> dict:
        """After the last kill: live check, daemon kill -9 + remount, checks again."""
        recs = self.recs()
        out: dict[str, Any] = {}
        step, dg = self.resume_live()
        check_loaded(step, dg, recs, "final live resume", self.hidden_steps())
        check_tree(self.mount.path, self.fw)
        self.remount("daemon-kill")
        out["tree"] = check_tree(self.mount.path, self.fw)
        step, dg = self.resume_live()
        check_loaded(step, dg, recs, "final resume after daemon kill", self.hidden_steps())
        out["step"], out["digest"] = step, dg
        if verify_all:
            out["verified"] = self.check_all_visible()
        return out

    def uninterrupted(self, final_step: int | None, final_digest: dict) -> dict:
        """Compare with an uninterrupted run (issue 25: "final weights bit-equal to an uninterrupted
        run"): the same job, same seed, trained in a fresh plain directory (outside any mount) to
        the highest step this campaign began, never killed.  Every ``begin`` digest of the
        campaign's (killed and resumed) runs must equal the reference's at that step: each resume
        restored the exact state (weights, optimizer, RNG, data position) and training went on
        as if never interrupted; ``final_equal``: the state the last resume loaded equals the
        reference's at its step.  Reported for every workload; the hand-written loops are
        deterministic by construction, so a mismatch there is a defect (tests/test_frameworks.py)."""
        import shutil

        begins = [r for r in self.recs() if r["ev"] == "begin"]
        if not begins:
            return {"steps_compared": 0, "mismatched_steps": [], "final_equal": final_step is None}
        top = max(r["step"] for r in begins)
        ref_dir, ref_ledger = self.work / f"{self.fw.name}.reference", self.work / f"{self.fw.name}.reference.ledger"
        shutil.rmtree(ref_dir, ignore_errors=True)
        ref_ledger.unlink(missing_ok=True)
        t0 = time.monotonic()
        # the same arguments as the campaign's jobs (a step limit would change e.g. HF's learning-rate
        # schedule), stopped once its save of the highest step has returned
        pid = self.server.start("train", self.args(seed=0, dir=str(ref_dir), ledger=str(ref_ledger),
                                                   store=str(self.work / f"{self.fw.name}.reference.store")))
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and running(pid):
                recs = fwlib.Ledger.read(str(ref_ledger)) if ref_ledger.exists() else []
                if any(r["ev"] == "end" and r["step"] >= top for r in recs):
                    break
                time.sleep(0.05)
        finally:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.server.reap(pid)
            wait_group_dead(pid)
        ref = {r["step"]: r["digest"] for r in fwlib.Ledger.read(str(ref_ledger)) if r["ev"] == "begin"}
        shutil.rmtree(ref_dir, ignore_errors=True)
        mism = sorted({r["step"] for r in begins if r["step"] in ref and r["digest"] != ref[r["step"]]})
        return {"steps_compared": len({r["step"] for r in begins} & set(ref)), "mismatched_steps": mism,
                "final_step": final_step,
                "final_equal": final_step is None or ref.get(final_step) == final_digest,
                "reference_s": round(time.monotonic() - t0, 1)}

    def close(self) -> None:
        if self.own_server:
            self.server.close()


def remount_plan(i: int) -> str:
    """Trial i's remount: every second trial a daemon kill -9, the others a clean stop + start."""
    return "daemon-kill" if i % 2 else "clean"


def run_native(fw: Framework, native: Path, work: Path, trials: int, seed: int) -> dict:
    """The native control: the same kill trials in a plain directory; violations counted."""
    c = Campaign(fw, None, work, seed, native=native)
    t0 = time.monotonic()
    try:
        for i in range(trials):
            c.native_trial(i)
        step, dg = None, {}
        try:
            step, dg = c.resume_live()
            check_loaded(step, dg, c.recs(), "final resume", c.hidden_steps())
        except AssertionError as e:
            c.violations.append({"trial": trials, "error": str(e).splitlines()[0][:300]})
        ref = c.uninterrupted(step, dg)
    finally:
        c.close()
    res = [r for r in c.results if "killed_in_save" in r]
    return {"framework": fw.name, "native": True, "trials": trials, "seconds": round(time.monotonic() - t0, 1),
            "killed_in_save": sum(r["killed_in_save"] for r in res),
            "between_files": sum(r["between_files"] and r["killed_in_save"] for r in res),
            "resume_failures": len(c.violations), "violations": c.violations, "uninterrupted": ref}


def run_campaign(fw: Framework, mount: Mount, work: Path, trials: int, seed: int,
                 verify_all: bool = False, server: Server | None = None, min_in_save: int = 0) -> dict:
    """``trials`` kill trials of ``fw``; returns a summary (raises AssertionError on the first violation).
    ``min_in_save``: go on with more trials (at most ``trials`` more) until that many kills landed
    inside a save: whether a random kill does depends on how long a save takes, which a faster
    mount shortens (the bounded tests need their share of cut saves, not a lucky draw)."""
    c = Campaign(fw, mount, work, seed, server)
    t0 = time.monotonic()
    try:
        i = 0
        while i < trials or (sum(r["killed_in_save"] for r in c.results) < min_in_save and i < 2 * trials):
            c.trial(i, remount_plan(i), verify_all)
            i += 1
        trials = i
        final = c.final_check()
        hidden = c.torn_good()
        ref = c.uninterrupted(final["step"], final.pop("digest"))
    finally:
        c.close()
    res = c.results
    return {"framework": fw.name, "trials": trials, "seconds": round(time.monotonic() - t0, 1),
            "killed_in_save": sum(r["killed_in_save"] for r in res),
            "aimed": sum(r["aimed"] for r in res),
            "between_files": sum(r["between_files"] and r["killed_in_save"] for r in res),
            "daemon_kills": sum(r["remount"] == "daemon-kill" for r in res[1:]) + 1,
            "max_window_s": c.window, "final": final, "good_hidden": len(hidden),
            "good_hidden_groups": [g["path"] for g in hidden], "uninterrupted": ref,
            "results": res}
