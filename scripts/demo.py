"""What ckptfs is for, in about a minute (run by ``scripts/demo``; tests/test_demo.py runs it in CI).

1. The same unmodified training script saves step 1, then is killed with SIGKILL in the middle of
   saving step 2 over it: once in a plain directory, once in a ckptfs mount.  The plain file is
   torn (torch.load fails); through ckptfs the file still loads step 1.
2. Hugging Face-style checkpoint directories: checkpoint-100 is saved whole and sealed; the save of
   checkpoint-200 is killed half-way, and ckptfs hides it, so resume finds checkpoint-100.

Everything lives in one temporary directory, unmounted and removed at the end, whatever happens
(Ctrl-C included).  Exit status 0 when every step showed what it should.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# The "training script": unmodified, it knows nothing of ckptfs.  A big model on a slow disk is
# played by a file object that writes 4 MiB at a time with a short pause, so the kill lands
# mid-save on any machine.
SAVER = textwrap.dedent('''
    import sys, time, torch
    path, step = sys.argv[1], int(sys.argv[2])

    class SlowDisk:
        def __init__(self, f): self.f = f
        def write(self, b):
            mv = memoryview(b)
            for i in range(0, len(mv), 4 << 20):
                self.f.write(mv[i:i + (4 << 20)]); time.sleep(0.02)
            return len(mv)
        def __getattr__(self, name): return getattr(self.f, name)

    state = {"step": step, "weights": [torch.full((1 << 20,), float(step)) for _ in range(48)]}
    with open(path, "wb") as f:
        print(f"saving step {step}", flush=True)
        torch.save(state, SlowDisk(f))
    print(f"saved step {step}", flush=True)
''')

GROUP_SAVER = textwrap.dedent('''
    import json, os, sys, time, torch
    d, step, kill_me = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    g = os.path.join(d, f"checkpoint-{step}")
    os.makedirs(g)
    torch.save({"w": torch.full((1 << 18,), float(step))}, os.path.join(g, "model.pt"))
    torch.save({"m": torch.zeros(1 << 18)}, os.path.join(g, "optimizer.pt"))
    if kill_me:
        print("half-way", flush=True)
        time.sleep(60)  # killed here: trainer_state.json never written
    with open(os.path.join(g, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)
''')

LOADER = "import sys, torch; print(torch.load(sys.argv[1], weights_only=True)['step'])"


def say(text: str = "") -> None:
    print(text, flush=True)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise SystemExit(f"demo: {' '.join(argv)} failed: {r.stderr.strip()}")
    return r


def ckptfs(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "ckptfs", *args, check=check)


def kill_mid_save(path: Path, step: int, after: float | None = None) -> float:
    """Run SAVER for ``step`` and SIGKILL it half-way through its torch.save: once the file holds
    64 MiB (a plain directory shows the bytes as they are written), or ``after`` seconds (a ckptfs
    mount shows other processes the committed version until the new one is complete).  Returns
    the seconds from "saving" to the kill."""
    p = subprocess.Popen([sys.executable, "-c", SAVER, str(path), str(step)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == f"saving step {step}"
        t0 = time.monotonic()
        while after is None and path.stat().st_size < (64 << 20) and time.monotonic() - t0 < 30:
            time.sleep(0.005)
        if after is not None:
            time.sleep(after)
        took = time.monotonic() - t0
        p.send_signal(signal.SIGKILL)
        p.wait()
        return took
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def load(path: Path) -> tuple[bool, str]:
    r = run(sys.executable, "-c", LOADER, str(path), check=False)
    if r.returncode == 0:
        return True, r.stdout.strip()
    last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    msg = last[-1] if last else f"exit status {r.returncode}"
    return False, msg.split(". ")[0] + ("." if ". " in msg else "")  # its first sentence


def part1(top: Path, mnt: Path) -> bool:
    say("== 1. torch.save killed with SIGKILL while overwriting the previous checkpoint")
    ok = True
    when = None
    for label, d in (("plain directory", top / "plain"), ("ckptfs mount", mnt)):
        d.mkdir(exist_ok=True)
        path = d / "model.pt"
        run(sys.executable, "-c", SAVER, str(path), "1")
        when = kill_mid_save(path, 2, when)  # the ckptfs run is killed as far into its save
        loaded, what = load(path)
        size = path.stat().st_size
        if loaded:
            say(f"  {label:16} model.pt ({size / 2**20:.0f} MiB) loads: step {what}")
        else:
            say(f"  {label:16} model.pt ({size / 2**20:.0f} MiB) is torn: torch.load fails:")
            say(f"  {'':16}   {what}")
        ok &= (not loaded) if d.name == "plain" else (loaded and what == "1")
    status = run("getfattr", "-n", "user.ckptfs.status", "--only-values", str(mnt / "model.pt")).stdout
    say(f"  getfattr -n user.ckptfs.status {mnt.name}/model.pt -> {status}")
    aborts = json.loads(ckptfs("status", str(mnt)).stdout).get("aborts") or []
    if aborts:
        a = aborts[-1]
        say(f"  ckptfs status: the killed save of {a.get('path')} was never committed: {a.get('reason')}")
    return ok and status == "committed"


def part2(mnt: Path) -> bool:
    say("")
    say("== 2. checkpoint directories (Hugging Face Trainer layout)")
    run(sys.executable, "-c", GROUP_SAVER, str(mnt), "100", "0")
    p = subprocess.Popen([sys.executable, "-c", GROUP_SAVER, str(mnt), "200", "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "half-way"
        p.send_signal(signal.SIGKILL)  # model.pt and optimizer.pt written; trainer_state.json never
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    say("  checkpoint-100 saved whole; the save of checkpoint-200 killed half-way")
    say(f"  ls {mnt.name}: {' '.join(sorted(os.listdir(mnt)))}")
    say(f"  ckptfs ls --all {mnt.name}:")
    for line in ckptfs("ls", "--all", str(mnt)).stdout.rstrip().splitlines():
        say(f"    {line}")
    status = run("getfattr", "-n", "user.ckptfs.status", "--only-values", str(mnt / "checkpoint-100")).stdout
    say(f"  getfattr -n user.ckptfs.status {mnt.name}/checkpoint-100 -> {status}")
    latest = ckptfs("latest", str(mnt)).stdout.strip()
    say(f"  ckptfs latest {mnt.name} -> {os.path.basename(latest)}   (what a resume script loads)")
    return status == "sealed" and latest == str(mnt / "checkpoint-100") and not (mnt / "checkpoint-200").exists()


def main() -> int:
    top = Path(tempfile.mkdtemp(prefix="ckptfs-demo."))
    mnt = top / "ckpts"
    mnt.mkdir()
    mounted = started = False
    try:
        started = True
        ckptfs("mount", str(mnt))
        mounted = True
        say(f"(a temporary directory: {top}; ckptfs mounted over {mnt.name}/)")
        say("")
        ok = part1(top, mnt)
        ok &= part2(mnt)
        say("")
        say("demo: OK: ckptfs kept the last complete checkpoint both times" if ok else
            "demo: FAILED: something above did not show what it should")
        return 0 if ok else 1
    except KeyboardInterrupt:
        say("\ndemo: interrupted; cleaning up")
        return 130
    finally:
        if started and not mounted:
            # interrupted while ``ckptfs mount`` was starting its daemon (its own session): the
            # launcher stops it, unless it was killed first; then the daemon may still mount
            for _ in range(50):
                if os.path.ismount(mnt):
                    mounted = True
                    break
                time.sleep(0.1)
        if mounted:
            r = ckptfs("umount", str(mnt), check=False)
            if r.returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        subprocess.run(["rm", "-rf", str(top)], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
