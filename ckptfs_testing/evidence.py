"""The evidence checker: every way one writer can end a step directory's save, against the rule
that decides torn or sealed (issue 25), on a real mount with real processes.

A *scenario* is one writer process saving ``step_1/`` in a directory of its own: some files, maybe a
completion marker written one of three ways (``plain``: open, write, close; ``shell``: as bash's
``echo done > COMMIT``: open, dup2 to another fd, close the original, write, close the dup;
``touch``: an empty ``DONE``), and an end: ``exit 0``, ``exit 1`` or SIGKILL, either between two
operations or while a file is open.  :func:`scenarios` enumerates them all (bounded).

The expected outcome is computed from the scenario alone (:func:`expected`), never from ckptfs:

* a marker whose last close came before the end completes the save: **sealed**, whatever the end;
* otherwise an ``exit 0`` completes it (the idle rule): **sealed**;
* otherwise (SIGKILL, ``exit 1``) the save was interrupted: **torn**, hidden.

Sealed also means: every file reads back as written, mounted and after a remount, and the offline
``ckptfs verify`` agrees (a seal at a FLUSH that was not the last close listed an empty COMMIT;
the next mount quarantined the intact group).  Each miss is counted as *torn shown as good* or
*good hidden*.  Run against ckptfs as is, there must be none; run against each known-bad variant
(``ckptfs_testing/variant.py``), at least one, or the checker cannot see what it is for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptfs_testing.mount import Mount, child_env

IDLE_SEAL = 2.0  # --idle-seal of the mount: the writers end well within it
SETTLE = IDLE_SEAL + 4.0  # past the idle seal and two housekeeping sweeps

WRITER = r"""
import json, os, sys, time
root, ops = sys.argv[1], json.loads(sys.argv[2])
def data(name, n):
    return (name.encode() * (n // len(name) + 1))[:n]
def stop_here():
    print("K", flush=True)
    time.sleep(60)
for op in ops:
    kind = op[0]
    if kind == "mkdir":
        os.mkdir(os.path.join(root, op[1]))
    elif kind == "file":
        fd = os.open(os.path.join(root, op[1]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data(op[1], op[2]))
        os.close(fd)
    elif kind == "open":  # a file being written when the end comes
        fd = os.open(os.path.join(root, op[1]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data(op[1], op[2]))
    elif kind == "plain":
        fd = os.open(os.path.join(root, op[1]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, op[2].encode())
        os.close(fd)
    elif kind == "touch":
        os.close(os.open(os.path.join(root, op[1]), os.O_WRONLY | os.O_CREAT, 0o644))
    elif kind == "shell_open":  # bash: open, dup2 to stdout's place, close the original
        fd = os.open(os.path.join(root, op[1]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 9)
        os.close(fd)
    elif kind == "shell_write":  # ... write through the dup, and restore (the last close)
        os.write(9, op[2].encode())
        os.close(9)
    elif kind == "kill":
        stop_here()
    elif kind == "exit":
        os._exit(op[1])
os._exit(0)
"""

FILES = ("step_1/a.bin", "step_1/b.bin", "step_1/c.bin")
SIZE = 3000
MARKER_TEXT = "done\n"


@dataclass
class Scenario:
    name: str
    ops: list[list[Any]]

    def files(self) -> dict[str, bytes]:
        """What each file closed before the end holds (the marker included): the bytes a sealed
        group must show."""
        out: dict[str, bytes] = {}
        for op in self.ops:
            if op[0] == "file":
                out[op[1]] = (op[1].encode() * (op[2] // len(op[1]) + 1))[:op[2]]
            elif op[0] == "plain" or op[0] == "shell_write":
                out[op[1]] = op[2].encode()
            elif op[0] == "touch":
                out[op[1]] = b""
        return out


def _marker_ops(style: str, write: bool) -> list[list[Any]]:
    """The marker written in ``style``; ``write`` False: only begun (shell: open, dup2, close;
    plain: open and one write, held open), so the end comes while the marker is open."""
    if style == "plain":
        return [["plain", "step_1/COMMIT", MARKER_TEXT]] if write else [["open", "step_1/COMMIT", 3]]
    if style == "shell":
        ops = [["shell_open", "step_1/COMMIT"]]
        return ops + [["shell_write", "step_1/COMMIT", MARKER_TEXT]] if write else ops
    return [["touch", "step_1/DONE"]]


def scenarios() -> list[Scenario]:
    """Every end after every operation of a three-file save, and of a two-file save with a marker
    in each style (begun and finished), plus a kill while each file is open."""
    ends: list[tuple[str, list[list[Any]]]] = [("exit0", [["exit", 0]]), ("exit1", [["exit", 1]]),
                                               ("kill", [["kill"]])]
    out: list[Scenario] = []
    for k in range(len(FILES) + 1):  # idle-seal layout: files only
        body = [["mkdir", "step_1"]] + [["file", f, SIZE] for f in FILES[:k]]
        for end, tail in ends:
            out.append(Scenario(f"files{k}-{end}", body + tail))
        if k < len(FILES):
            out.append(Scenario(f"files{k}-kill-open", body + [["open", FILES[k], SIZE // 2], ["kill"]]))
    for style in ("plain", "shell", "touch"):
        body = [["mkdir", "step_1"]] + [["file", f, SIZE] for f in FILES[:2]]
        for end, tail in ends:
            out.append(Scenario(f"{style}-done-{end}", body + _marker_ops(style, True) + tail))
        if style != "touch":
            out.append(Scenario(f"{style}-begun-kill", body + _marker_ops(style, False) + [["kill"]]))
            out.append(Scenario(f"{style}-begun-exit1", body + _marker_ops(style, False) + [["exit", 1]]))
    return out


def expected(s: Scenario) -> str:
    """"sealed", "torn" or "none" (no group: an empty directory whose writer exited 0), from the
    scenario alone (see the module docstring)."""
    ops = s.ops
    end = ops[-1]
    last_close_of_marker = any(op[0] in ("plain", "shell_write", "touch") for op in ops)
    if last_close_of_marker:
        return "sealed"
    if end[0] == "exit" and end[1] == 0:
        # a save that wrote nothing is no checkpoint: an ordinary empty directory, shown
        return "sealed" if any(op[0] in ("file", "open") for op in ops) else "none"
    return "torn"


@dataclass
class Outcome:
    scenario: str
    expected: str
    got: str = ""
    after_remount: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """"" (as expected), "torn shown as good" or "good hidden"."""
        if not self.problems:
            return ""
        return "torn shown as good" if self.expected == "torn" else "good hidden"


def _run_writer(d: Path, s: Scenario, env: dict[str, str]) -> int:
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(d), json.dumps(s.ops)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        if s.ops[-1][0] == "kill":
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "K":
                p.kill()
                raise RuntimeError(f"{s.name}: writer failed: {line!r} {p.communicate()[1]}")
            os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode


def _states(root: Path, names: list[str], env: dict[str, str]) -> dict[str, str]:
    """Scenario -> the state of its ``step_1`` group, from ``ckptfs ls --all --json`` of its directory."""
    def one(name: str) -> str:
        r = subprocess.run([sys.executable, "-m", "ckptfs", "ls", str(root / name), "--all", "--json"],
                           capture_output=True, text=True, env=env, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"ckptfs ls {name} failed: {r.stderr}")
        rows = {x["path"]: x["state"] for x in json.loads(r.stdout)}
        return str(rows.get(f"{name}/step_1", ""))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def _look(root: Path, s: Scenario, state: str, when: str) -> list[str]:
    """What is wrong with scenario ``s``'s directory given its group ``state``."""
    d = root / s.name / "step_1"
    want = expected(s)
    if want == "none":
        return [] if d.is_dir() and state in ("", "open") else [f"{when}: {state}, an empty directory"]
    if want == "torn":
        if state == "sealed" or (d.exists() and state != "torn"):
            return [f"{when}: {state or 'no group'}, directory {'shown' if d.exists() else 'hidden'}; "
                    f"the writer was interrupted"]
        return [f"{when}: torn but still listed"] if d.exists() else []
    problems = []
    if state != "sealed":
        problems.append(f"{when}: {state or 'no group'}, wanted sealed")
    for rel, data in s.files().items():
        p = root / s.name / rel
        try:
            got = p.read_bytes()
        except OSError as e:
            problems.append(f"{when}: {rel}: {e.strerror}")
            continue
        if got != data:
            problems.append(f"{when}: {rel}: {len(got)} bytes, wrote {len(data)}")
    return problems


def check(base: Path, variant: str = "good", transport_env: dict[str, str] | None = None,
          only: list[str] | None = None) -> list[Outcome]:
    """Run every scenario (``only``: those named) on one mount at ``base/ckpts`` served by
    ``variant``; judge them mounted, then unmounted (``ckptfs verify``) and after a remount."""
    root = base / "ckpts"
    root.mkdir(parents=True, exist_ok=True)
    todo = [s for s in scenarios() if only is None or s.name in only]
    env = child_env(transport_env)
    outs = {s.name: Outcome(s.name, expected(s)) for s in todo}
    m = Mount(root, env=transport_env, variant=None if variant == "good" else variant,
              extra_args=["--idle-seal", str(IDLE_SEAL)])
    with m.start():
        for s in todo:
            (root / s.name).mkdir()
        errors: list[str] = []

        def one(s: Scenario) -> None:
            try:
                _run_writer(root / s.name, s, env)
            except Exception as e:  # reported, never a hang
                errors.append(str(e))

        threads = [threading.Thread(target=one, args=(s,)) for s in todo]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("; ".join(errors))
        time.sleep(SETTLE)
        states = _states(root, [s.name for s in todo], env)
        for s in todo:
            o = outs[s.name]
            o.got = states[s.name]
            o.problems += _look(root, s, o.got, "mounted")
    r = subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(root), "--json"], capture_output=True,
                       text=True, env=env, timeout=300)
    bad: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():  # one object per file
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and not row.get("ok", True):
            rel = os.path.relpath(str(row.get("path", "")), root)
            bad.setdefault(rel.split("/", 1)[0], []).append(f"{rel}: {row.get('kind')} {row.get('detail')}")
    for line in r.stderr.splitlines():  # a group against its manifest: "FAIL <rel>: <why>"
        if line.startswith("FAIL "):
            bad.setdefault(line[5:].split("/", 1)[0], []).append(line[5:])
    if r.returncode not in (0, 1) or (r.returncode == 1 and not bad):
        raise RuntimeError(f"ckptfs verify exited {r.returncode}: {r.stderr.strip()[-300:]}")
    for s in todo:
        for what in bad.get(s.name, []):
            outs[s.name].problems.append(f"unmounted verify: {what}")
    with m.start():
        time.sleep(1.0)
        states = _states(root, [s.name for s in todo], env)
        for s in todo:
            o = outs[s.name]
            o.after_remount = states[s.name]
            o.problems += _look(root, s, o.after_remount, "after remount")
    m.stop()
    return list(outs.values())


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    bad = [o for o in outcomes if o.problems]
    return {"scenarios": len(outcomes),
            "torn": sum(o.expected == "torn" for o in outcomes),
            "sealed": sum(o.expected == "sealed" for o in outcomes),
            "torn_shown_as_good": sum(o.kind == "torn shown as good" for o in bad),
            "good_hidden": sum(o.kind == "good hidden" for o in bad),
            "violations": [{"scenario": o.scenario, "expected": o.expected, "got": o.got,
                            "after_remount": o.after_remount, "problems": o.problems} for o in bad]}
