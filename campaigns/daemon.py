"""Daemon kill campaign: kill -9 the ckptfs daemon, remount, check.

Workload: ``tests/workloads/sequence.py`` (per step 3 shards, a ``latest`` pointer
by rename, rotation of step-2, fsync of the directory, then an ack outside the
mount), forked from a fork server so no trial pays the torch import.

Trial kinds, per commit mode (sync, async), in shuffled order on one directory
that keeps growing from trial to trial (each trial resumes at latest+1):

* ``point``: the daemon runs with ``CKPTFS_CRASH_AT=<point>:<n>`` for every named
  point of the commit protocol (``ckptfs.crashpoints.POINTS`` except the
  recovery one) and SIGKILLs itself there;
* ``recovery``: a crash at a random protocol point, then a second crash inside
  the mount-time recovery (``recovery_replayed``), then a clean recovery;
* ``random``: SIGKILL of the daemon at a uniformly random time within the
  measured duration of the workload.

In every trial a reader process walks the directory, opens committed files (passthrough on
the native transport), reads them and keeps the last 8 open, so the daemon is killed while
passthrough files are open, while hidden names exist (rotation unlinks open files) and while
invalidations are queued.  It is SIGKILLed after the daemon; one that does not exit within
30 s means a hung mount (a violation).

After each crash: lazy unmount of the dead mount, clean remount (recovery), and
``sequence.check_prefix_state``: the state is a prefix of the completed
operations and nothing acknowledged is lost; then a clean unmount must leave
``.ckptfs/staging`` empty.  Any failed check is an invariant violation; after one
the directory is reset so later trials stay independent.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptfs import META_DIR, crashpoints

from .common import ROOT, ForkServer, Mount, dump, interruptible, machine, no_fuse_mounts_under, workload

sequence = workload("sequence")

STEPS = 4
HOLDER = """
import os, sys, time
held = []
while True:
    for root, dirs, files in os.walk(sys.argv[1]):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
                os.read(fd, 65536)
            except OSError:
                continue
            held.append(fd)
            if len(held) > 8:
                os.close(held.pop(0))
    time.sleep(0.005)
"""
POINTS = tuple(p for p in crashpoints.POINTS if p != "recovery_replayed")
ENV = {"CKPTFS_COMPACT_EVERY": "5"}  # compaction (and its crash point) every few operations


def nth_range(point: str) -> tuple[int, int]:
    """Hit numbers of ``point`` that a STEPS-step workload run certainly reaches."""
    if point == "compact_snapshot":
        return 2, STEPS  # hit 1 is the compaction of the mount-time recovery; ~1 per step after
    if point.startswith("ns_"):
        return 1, 10
    return 1, 4 * STEPS


def plan(per_point: int, recovery: int, rand: int, rng: random.Random) -> list[tuple[str, str]]:
    kinds = [("point", p) for p in POINTS for _ in range(per_point)]
    kinds += [("recovery", rng.choice(POINTS)) for _ in range(recovery)] + [("random", "")] * rand
    rng.shuffle(kinds)
    return kinds


class Chain:
    """One growing checkpoint directory under one commit mode."""

    def __init__(self, base: Path, commit: str, fs: ForkServer) -> None:
        self.base, self.commit, self.fs = base, commit, fs
        self.n = 0
        self.reset()

    def reset(self) -> None:
        self.n += 1
        self.dir = self.base / f"{self.commit}-{self.n}"
        self.dir.mkdir(parents=True)
        # every replaced file keeps a generation (not only those in groups, the default): the
        # crash points of a kept generation's intent, link and rename are on every rotation here
        self.m = Mount(self.dir, commit=self.commit, env=ENV, extra_args=["--keep-generations", "1"])
        self.acked: list[int] = []
        self.latest = -1

    def window(self) -> float:
        """Duration of one uninterrupted STEPS-step run (the random-kill window)."""
        self.m.start()
        try:
            ack = self.base / f"ack-{self.commit}-calib"
            t = self.fs.run("sequence.run", str(self.dir), str(ack), STEPS, self.latest + 1)
            self.acked += sequence.read_acks(ack)
            self.latest = sequence.check_prefix_state(self.dir, self.acked)
        finally:
            self.m.stop()
        return t

    def trial(self, t: int, kind: str, point: str, window: float, rng: random.Random) -> tuple[bool, str | None]:
        """Run one crash trial; return (crash happened as planned, violation or None)."""
        ack = self.base / f"ack-{self.commit}-{t}"
        env = dict(ENV)
        if kind != "random":
            lo, hi = nth_range(point)
            env["CKPTFS_CRASH_AT"] = f"{point}:{rng.randint(lo, hi)}"
            env.update(crashpoints.POINT_ENV.get(point, {}))
        self.m.env = env
        self.m.start()
        reader = subprocess.Popen([sys.executable, "-c", HOLDER, str(self.dir)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        pid = self.fs.call("sequence.run", str(self.dir), str(ack), STEPS, self.latest + 1)
        if kind == "random":
            time.sleep(rng.uniform(0.0, window))
            crashed = self.m.proc is not None and self.m.proc.poll() is None
        else:
            crashed = self.m.wait_dead(60) == -signal.SIGKILL
        self.m.kill(detach=False)
        reader.kill()
        try:
            reader.wait(30)
        except subprocess.TimeoutExpired:
            return crashed, f"{self.commit}/{kind}@{point} trial {t}: reader hung after the daemon was killed"
        self.fs.reap(pid)  # the writer fails with ENOTCONN and exits; detached earlier, it could
        self.m.detach()    # write to the backing directory underneath, past ckptfs
        if kind == "recovery":
            self.m.env = {"CKPTFS_CRASH_AT": "recovery_replayed"}
            try:
                self.m.start()
                crashed = False  # recovery did not crash: the double crash did not happen
                self.m.stop()
            except RuntimeError:
                self.m.kill()
        self.m.env = ENV
        self.m.start()
        self.acked += sequence.read_acks(ack)
        try:
            try:
                self.latest = sequence.check_prefix_state(self.dir, self.acked)
            finally:
                self.m.stop()
        except AssertionError as e:
            return crashed, f"{self.commit}/{kind}@{point} trial {t}: prefix/ack check failed: {e!r}"[:400]
        left = os.listdir(self.dir / META_DIR / "staging")
        if left:
            return crashed, f"{self.commit}/{kind}@{point} trial {t}: staging not empty: {left[:3]}"
        return crashed, None


def run(per_point: int, recovery: int, rand: int, seed: int = 2, commits: tuple[str, ...] = ("sync", "async"),
        base: Path | None = None) -> dict:
    """Run the campaign; ``per_point`` trials per crash point and commit mode, etc."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    own = base is None
    base = Path(tempfile.mkdtemp(prefix="ckptfs-daemon-")) if base is None else base
    conditions: dict[str, dict] = {}
    violations: list[str] = []
    windows = {}
    try:
        with ForkServer("sequence") as fs:
            for commit in commits:
                chain = Chain(base, commit, fs)
                windows[commit] = round(chain.window(), 3)
                for t, (kind, point) in enumerate(plan(per_point, recovery, rand, rng)):
                    key = f"{commit}@{point}" if kind == "point" else f"{commit}@{kind}"
                    c = conditions.setdefault(key, {"condition": key, "trials": 0, "ok": 0, "crashed": 0})
                    crashed, bad = chain.trial(t, kind, point, windows[commit], rng)
                    c["trials"] += 1
                    c["crashed"] += crashed
                    if bad:
                        violations.append(bad)
                        chain.reset()
                    else:
                        c["ok"] += 1
                print(f"  daemon {commit}: {sum(c['trials'] for k, c in conditions.items() if k.startswith(commit))}"
                      f" trials, latest step {chain.latest}, window {windows[commit]}s", flush=True)
    finally:
        if own:
            assert no_fuse_mounts_under(base), f"mount left under {base}"
            shutil.rmtree(base, ignore_errors=True)
    conds = list(conditions.values())
    return {"campaign": "daemon", "seed": seed, "trials": sum(c["trials"] for c in conds),
            "crashed": sum(c["crashed"] for c in conds), "conditions": sorted(conds, key=lambda c: c["condition"]),
            "violations": violations, "steps_per_trial": STEPS, "windows_s": windows, "machine": machine(),
            "wall_s": round(time.perf_counter() - t0, 1), "date": time.strftime("%Y-%m-%d %H:%M")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/kill_daemon_campaign", description=__doc__.split("\n")[0])
    ap.add_argument("--per-point", type=int, default=16, help="trials per crash point and commit mode")
    ap.add_argument("--recovery", type=int, default=8, help="double crashes (in recovery) per commit mode")
    ap.add_argument("--random", type=int, default=30, help="random-time kills per commit mode")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "raw" / "daemon.json"))
    a = ap.parse_args(argv)
    interruptible()
    res = run(a.per_point, a.recovery, a.random, seed=a.seed)
    res["command"] = (f"scripts/kill_daemon_campaign --per-point {a.per_point} --recovery {a.recovery} "
                      f"--random {a.random} --seed {a.seed}")
    dump(res, a.json)
    return 1 if res["violations"] else 0
