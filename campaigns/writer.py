"""Writer kill campaign: kill -9 the writer at uniformly random times inside its save.

Workloads (``tests/workloads/saver.py``): ``torch.save`` of an 8 MiB state over
an existing file, and a group save (3 shards + manifest + ``latest`` pointer,
rotation).  Conditions: through ckptfs (sync and async commit) and natively in
the seed paper's three modes (unsafe, atomic_nodirsync, atomic_dirsync), same
workload, same machine, same run.

Per condition: one uninterrupted save, then the save window W is measured
(median of the last 5 uninterrupted saves, fork to reap, re-measured every 10
trials so it follows the machine's load), then each trial forks a save of
the next generation/step, sleeps U(0, W), SIGKILLs it, reaps it and checks:

OK  <=>  the resume logic loads bit-exact data of the previous or the new
         generation/step (the new one if the writer finished before the kill),
         and no torn file is visible (group: no visible shard/manifest that does
         not load completely).

A failed trial is repaired by uninterrupted saves so every trial starts from a
complete previous version.  For ckptfs every failed trial is an invariant
violation; for the native modes failures are the measured result.  Note that a
process kill never drops page-cache data, so atomic_nodirsync and atomic_dirsync
are indistinguishable here (power loss is the model checker's job).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path

from .common import ROOT, ForkServer, Mount, dump, interruptible, killed_by, machine, no_fuse_mounts_under, workload

saver = workload("saver")

MODES = ("ckptfs-sync", "ckptfs-async", "unsafe", "atomic_nodirsync", "atomic_dirsync")
WORKLOADS = ("torch.save", "group")
FULL = {("ckptfs-sync", "torch.save"): 350, ("ckptfs-sync", "group"): 350,
        ("ckptfs-async", "torch.save"): 150, ("ckptfs-async", "group"): 150}
FULL_NATIVE = 200
RECALIBRATE = 10  # trials between two measurements of the save window


def full_counts() -> dict[tuple[str, str], int]:
    """Trials per (mode, workload) of the full campaign: 1000 through ckptfs."""
    return {(m, w): FULL.get((m, w), FULL_NATIVE) for m in MODES for w in WORKLOADS}


class Condition:
    """One (mode, workload) pair: its directory, optional mount and resume check."""

    def __init__(self, base: Path, mode: str, workload: str, fs: ForkServer) -> None:
        self.mode, self.workload, self.fs = mode, workload, fs
        self.dir = base / f"{mode}-{workload.replace('.', '_')}"
        self.dir.mkdir(parents=True)
        self.mount = Mount(self.dir, commit=mode.split("-")[1]).start() if mode.startswith("ckptfs") else None
        self.wmode = "ckptfs" if self.mount else mode
        self.path = str(self.dir / "latest.pt")

    def spawn(self, gen: int) -> int:
        if self.workload == "group":
            return self.fs.call("saver.save_group", str(self.dir), gen, self.wmode)
        return self.fs.call("saver.save_gens", self.path, gen - 1, 1, self.wmode)

    def save(self, gen: int) -> None:
        status = self.fs.reap(self.spawn(gen))
        if status != 0:
            raise RuntimeError(f"uninterrupted save {gen} failed ({status}) in {self.dir}")

    def visible(self) -> tuple[int | None, str | None]:
        """(generation/step the resume logic loads, why that is not acceptable)."""
        if self.workload == "group":
            res = saver.check_group(str(self.dir))
            if res["torn"]:
                return res["step"], "torn visible: " + ", ".join(res["torn"][:3])
            return res["step"], res["error"]
        try:
            got = saver.check(self.path)
        except Exception as e:  # noqa: BLE001 - a torn file fails to load in many ways
            return None, f"torn: {type(e).__name__}: {str(e)[:120]}"
        if self.mount and os.getxattr(self.path, "user.ckptfs.status") != b"committed":
            # async mode: a version closed before the kill may still be queued ("staging");
            # fsync of the directory waits for the queue, after which it must be committed
            fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if os.getxattr(self.path, "user.ckptfs.status") != b"committed":
                return got, "status xattr not committed"
        extra = [n for n in os.listdir(self.dir) if n not in ("latest.pt", "latest.pt.tmp")]
        return got, f"unexpected names {extra}" if extra else None

    def aborts(self) -> int:
        if not self.mount:
            return 0
        return json.loads(os.getxattr(str(self.dir), "user.ckptfs.stats")).get("aborts", 0)

    def close(self) -> list[str]:
        """Unmount; return violations found in the plain directory afterwards."""
        bad: list[str] = []
        if self.mount:
            self.mount.stop()
            staging = self.dir / ".ckptfs" / "staging"
            if os.listdir(staging):
                bad.append(f"{self.mode}/{self.workload}: staging not empty after unmount")
            if self.workload == "group":
                res = saver.check_group(str(self.dir))
                if res["torn"] or res["error"]:
                    bad.append(f"{self.mode}/{self.workload}: unmounted state bad: {res}")
            else:
                try:
                    saver.check(self.path)
                except Exception as e:  # noqa: BLE001
                    bad.append(f"{self.mode}/{self.workload}: unmounted file bad: {e}")
        return bad


def run_condition(base: Path, mode: str, workload: str, trials: int, rng: random.Random,
                  fs: ForkServer) -> tuple[dict, list[str]]:
    c = Condition(base, mode, workload, fs)
    violations: list[str] = []
    outcomes = {"new": 0, "prev": 0, "torn_or_unloadable": 0, "wrong_version": 0, "writer_error": 0}
    killed = 0
    try:
        gen = 1
        c.save(gen)
        windows = []
        for _ in range(3):
            gen += 1
            t0 = time.perf_counter()
            c.save(gen)
            windows.append(time.perf_counter() - t0)
        aborts0 = c.aborts()
        ok = 0
        t_start = time.perf_counter()
        used = []
        for t in range(trials):
            if t and t % RECALIBRATE == 0:  # follow the machine's load: re-measure the window
                gen += 1
                t0 = time.perf_counter()
                c.save(gen)
                windows = windows[-4:] + [time.perf_counter() - t0]
            window = statistics.median(windows)
            used.append(window)
            new = gen + 1
            pid = c.spawn(new)
            time.sleep(rng.uniform(0.0, window))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            status = c.fs.reap(pid)
            finished = killed_by(status) is None
            killed += not finished
            got, why = c.visible()
            if finished and status != 0:
                why = f"writer failed on its own (wait status {status}); see its traceback above"
            if why is None and got not in ((new,) if finished else (gen, new)):
                why = f"wrong version {got} (prev {gen}, new {new}, finished={finished})"
            if why is None:
                ok += 1
                outcomes["new" if got == new else "prev"] += 1
                gen = got  # the previous generation stays current if the save was cut
                continue
            kind = "writer_error" if why.startswith("writer failed") else "torn_or_unloadable"
            outcomes["wrong_version" if why.startswith("wrong") else kind] += 1
            if mode.startswith("ckptfs"):
                violations.append(f"{mode}/{workload} trial {t}: {why}")
            # repair: complete saves so the next trial starts from a committed version
            # (two for groups: rotation removes a torn step directory two steps later)
            gen = new
            for _ in range(2 if workload == "group" else 1):
                gen += 1
                c.save(gen)
        elapsed = time.perf_counter() - t_start
        aborted = c.aborts() - aborts0
    finally:
        violations += c.close()
    shutil.rmtree(c.dir, ignore_errors=True)
    res = {"mode": mode, "workload": workload, "trials": trials, "ok": ok, "killed_mid_run": killed,
           "outcomes": outcomes, "save_window_s": round(statistics.median(used), 4), "ckptfs_aborts": aborted,
           "wall_s": round(elapsed, 1)}
    return res, violations


def run(counts: dict[tuple[str, str], int], seed: int = 1, base: Path | None = None) -> dict:
    """Run every condition in ``counts``; returns the campaign result (JSON-able)."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    own = base is None
    base = Path(tempfile.mkdtemp(prefix="ckptfs-writer-")) if base is None else base
    conditions: list[dict] = []
    violations: list[str] = []
    try:
        with ForkServer("saver") as fs:
            for (mode, workload), n in counts.items():
                res, bad = run_condition(base, mode, workload, n, rng, fs)
                conditions.append(res)
                violations += bad
                print(f"  writer {mode:17s} {workload:10s} ok {res['ok']}/{n} window {res['save_window_s']}s "
                      f"killed {res['killed_mid_run']} aborts {res['ckptfs_aborts']} ({res['wall_s']}s)", flush=True)
    finally:
        if own:
            assert no_fuse_mounts_under(base), f"mount left under {base}"
            shutil.rmtree(base, ignore_errors=True)
    ck = sum(c["trials"] for c in conditions if c["mode"].startswith("ckptfs"))
    return {"campaign": "writer", "seed": seed, "trials": sum(c["trials"] for c in conditions),
            "ckptfs_trials": ck, "conditions": conditions, "violations": violations,
            "state_numel": saver.SIZE, "machine": machine(), "wall_s": round(time.perf_counter() - t0, 1),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/kill_writer_campaign", description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every trial count (e.g. 0.1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "raw" / "writer.json"))
    a = ap.parse_args(argv)
    interruptible()
    counts = {k: max(1, round(v * a.scale)) for k, v in full_counts().items()}
    res = run(counts, seed=a.seed)
    res["command"] = "scripts/kill_writer_campaign" + (f" --scale {a.scale}" if a.scale != 1.0 else "")
    dump(res, a.json)
    return 1 if res["violations"] else 0
