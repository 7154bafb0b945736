"""The per-operation ledger (issue 27, "count, then cut"): exact counts that do not drift with
the disk, for native and ckptfs, per operation.

    python -m bench.ledger [--dir D] [--json F]

For each operation (a child process runs it ``n`` times): natively, the durability and namespace
system calls the application itself makes (``strace -f -c`` of the child); through a ckptfs mount
(native transport, sync commit): the same calls of the application, the FUSE requests by opcode
(``user.ckptfs.stats`` before and after) and the daemon's own durability and namespace calls
(``strace -f -c -p`` of the daemon); and the profile behind them: microseconds in each opcode's
handler (``fuse_us_*``) and the daemon's CPU time, from a second run without strace.  Everything
is divided by ``n``.  Counts per operation are
what a cost change must cut; timings are left to ``python -m bench``.

Invariant: every mount is unmounted and its daemon stopped by PID; the scratch directory is
removed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import ROOT

SYSCALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs", "renameat2", "rename", "renameat", "linkat",
            "unlinkat", "unlink")

# once per mount, in the (untraced) setup of the writing operations: the mount's journal file is made
# by its first write (two syncs, once), which is no operation's own cost
WARM = "open(f'{d}/warm.txt', 'wb').write(b'w'); "
GROUP = ("g = f'{d}/step_{i + 1}'; os.mkdir(g); [open(f'{g}/{n}', 'wb').write(m) for n in "
         "('model.bin', 'optim.bin')]; open(f'{g}/rng.json', 'wb').write(b'{\"seed\": 1}'); "
         "open(f'{g}/COMMIT', 'wb').write(b'ok')")

ATOMIC_GROUP_SETUP = """
m = os.urandom(128 << 10)
def asave_group(g):
    os.mkdir(g)
    pfd = os.open(os.path.dirname(g), os.O_RDONLY)
    os.fsync(pfd)
    os.close(pfd)
    gfd = os.open(g, os.O_RDONLY)
    for n, b in (("model.bin", m), ("optim.bin", m[:65536]), ("rng.json", b'{"seed": 1}'),
                 ("MANIFEST.json", b'{"files": 3}'), ("COMMIT", b"ok")):
        fd = os.open(f"{g}/{n}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b)
        os.fsync(fd)
        os.close(fd)
        os.rename(f"{g}/{n}.tmp", f"{g}/{n}")
        os.fsync(gfd)
    os.close(gfd)
"""

# name -> (runs, setup code, code run ``n`` times with ``i`` the iteration and ``d`` the directory)
OPS: dict[str, tuple[int, str, str]] = {
    "small file: open, write 1 KiB, close": (
        100, WARM, "open(f'{d}/s{i}.txt', 'wb').write(b'x' * 1024)"),
    "torch.save 4 MiB, new file": (
        20, WARM + "import torch; t = torch.zeros(1 << 20)", "torch.save(t, f'{d}/m{i}.pt')"),
    "torch.save 4 MiB over the same file": (
        20, "import torch; t = torch.zeros(1 << 20); torch.save(t, f'{d}/model.pt')",
        "torch.save(t, f'{d}/model.pt')"),
    "atomic writer: 1 MiB tmp, fsync, rename, fsync(dir)": (
        20, WARM + "b = os.urandom(1 << 20); dfd = os.open(d, os.O_RDONLY)",
        "fd = os.open(f'{d}/w.bin.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.write(fd, b); "
        "os.fsync(fd); os.close(fd); os.rename(f'{d}/w.bin.tmp', f'{d}/w.bin'); os.fsync(dfd)"),
    # step_0 is saved in the untraced setup: the 20 measured are a run's later checkpoints (a sibling
    # exists, and so does .ckptfs/groups)
    "group: mkdir step_N, 3 files, COMMIT": (20, "m = os.urandom(128 << 10); i = -1; " + GROUP, GROUP),
    # W7's group (issue 27): the already-atomic writer's own syncs are the yardstick, 2 per file + 1
    "already-atomic group: mkdir step_N, fsync(.), 5 files tmp, fsync, rename, fsync(dir)": (
        10, WARM + ATOMIC_GROUP_SETUP, "asave_group(f'{d}/step_{i}')"),
    "unlink of a small file (rm)": (
        100, "[open(f'{d}/u{k}.txt', 'wb').write(b'x') for k in range(100)]", "os.unlink(f'{d}/u{i}.txt')"),
    "open + close (read-only)": (
        1000, "open(f'{d}/r.txt', 'wb').write(b'x')", "os.close(os.open(f'{d}/r.txt', os.O_RDONLY))"),
    "stat": (1000, "open(f'{d}/r.txt', 'wb').write(b'x')", "os.stat(f'{d}/r.txt')"),
    "ls -l of 100 files (listdir + lstat each)": (
        10, "[open(f'{d}/l{k}', 'wb').write(b'x') for k in range(100)]",
        "[os.lstat(f'{d}/{n}') for n in os.listdir(d)]"),
}

CHILD = r"""
import os, sys
d, n, setup, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
exec(setup)
print("ready", flush=True)
sys.stdin.readline()
for i in range(n):
    exec(body)
print("done", flush=True)
sys.stdin.readline()
"""


def _strace_calls(path: str) -> dict[str, int]:
    """``strace -c`` columns: % time, seconds, usecs/call, calls, [errors], syscall."""
    out: dict[str, int] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for ln in lines:
        p = ln.split()
        if len(p) >= 5 and p[-1] in SYSCALLS and p[3].isdigit():
            out[p[-1]] = int(p[3])
    return out


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, in ns (``/proc/PID/task/*/schedstat``: exact,
    unlike the 10 ms ticks of ``/proc/PID/stat``)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _run(d: Path, op: str, daemon_pid: int | None, work: Path, trace: bool = True) -> dict[str, Any]:
    n, setup, body = OPS[op]
    app_out = str(work / "app.strace")
    dmn_out = str(work / "daemon.strace")
    for f in (app_out, dmn_out):
        if os.path.exists(f):
            os.unlink(f)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(d), str(n), setup, body], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env, cwd=str(d))
    tracers = []
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        before = json.loads(os.getxattr(d, "user.ckptfs.stats")) if daemon_pid else {}
        cpu0 = _cpu_ns(daemon_pid) if daemon_pid else 0
        if trace:
            tracers.append(subprocess.Popen(["strace", "-f", "-c", "-o", app_out, "-p", str(child.pid)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if daemon_pid and trace:
            tracers.append(subprocess.Popen(["strace", "-f", "-c", "-o", dmn_out, "-p", str(daemon_pid)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5 if trace else 0.1)  # (strace attaches to every thread)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        time.sleep(0.3)  # the daemon's asynchronous work for the last operation (RELEASE, FORGET)
        cpu1 = _cpu_ns(daemon_pid) if daemon_pid else 0
        after = json.loads(os.getxattr(d, "user.ckptfs.stats")) if daemon_pid else {}
    finally:
        for t in tracers:
            t.terminate()
            t.wait()
        if child.poll() is None:
            try:
                assert child.stdin is not None
                child.stdin.write("end\n")
                child.stdin.flush()
            except OSError:
                pass
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    row: dict[str, Any] = {"n": n, "app": {k: v / n for k, v in _strace_calls(app_out).items()}}
    if daemon_pid:
        row["fuse"] = {k[5:]: (after.get(k, 0) - before.get(k, 0)) / n for k in after
                       if k.startswith("fuse_") and not k.startswith("fuse_us_")
                       and after.get(k, 0) != before.get(k, 0)}
        row["fuse_total"] = sum(row["fuse"].values())
        # microseconds in each opcode's handler (reply included) and the daemon's CPU, per operation:
        # the profile behind the counts (wall time here still moves with the disk)
        row["fuse_us"] = {k[8:]: (after.get(k, 0) - before.get(k, 0)) / n for k in after
                          if k.startswith("fuse_us_") and after.get(k, 0) != before.get(k, 0)}
        row["daemon_cpu_us"] = (cpu1 - cpu0) / 1000 / n
        row["daemon"] = {k: v / n for k, v in _strace_calls(dmn_out).items()}
    return row


def measure(base: Path) -> list[dict[str, Any]]:
    from ckptfs_testing.mount import Mount

    rows = []
    for op in OPS:
        nat = base / "native"
        shutil.rmtree(nat, ignore_errors=True)
        nat.mkdir()
        native = _run(nat, op, None, base)
        runs = []
        for trace in (True, False):  # counts under strace; the profile (us, CPU) without it
            mp = base / "mount"
            shutil.rmtree(mp, ignore_errors=True)
            mp.mkdir()
            with Mount(mp).start():
                pid = int(os.getxattr(mp, "user.ckptfs.pid"))
                runs.append(_run(mp, op, pid, base, trace=trace))
        mounted = runs[0]
        mounted["fuse_us"], mounted["daemon_cpu_us"] = runs[1]["fuse_us"], runs[1]["daemon_cpu_us"]
        rows.append({"op": op, "native": native, "ckptfs": mounted})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _fmt(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v >= 0.005) or "-"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| operation | native: the application's calls | ckptfs: the application's calls | FUSE requests "
             "(total, by opcode) | the daemon's calls |", "|---|---|---|---|---|"]
    for r in rows:
        m = r["ckptfs"]
        lines.append(f"| {r['op']} | {_fmt(r['native']['app'])} | {_fmt(m['app'])} | {m['fuse_total']:.1f}: "
                     f"{_fmt(m['fuse'])} | {_fmt(m['daemon'])} |")
    lines += ["", "| operation | daemon CPU us | us in handlers (total, by opcode) |", "|---|---|---|"]
    for r in rows:
        m = r["ckptfs"]
        us = {k: round(v) for k, v in m.get("fuse_us", {}).items()}
        lines.append(f"| {r['op']} | {m.get('daemon_cpu_us', 0):.0f} | {sum(us.values())}: {_fmt(us)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="scratch directory (default: a temporary one)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    if shutil.which("strace") is None:
        sys.exit("bench.ledger: strace is needed (apt-get install strace)")
    base = Path(tempfile.mkdtemp(prefix="ckptfs-ledger-", dir=a.dir))
    try:
        rows = measure(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
