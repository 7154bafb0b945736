"""xfstests' fsx and fsstress on a mount against the same runs natively (issue 24).

Shared by ``tests/test_fsx.py`` (bounded) and ``scripts/fsx_campaign`` (the long run, results in
``docs/results/posix.md``).  Every row is one program run twice with the same seed and options: in
a plain directory on the backing filesystem (the control) and on a mount.  A row passes only when
both runs pass and fsx disabled the same operations in both (the runs then did the same operations).

Option sets (``SETS``) are the issue's: default (mmap reads and writes included), no mmap, O_DIRECT,
close and reopen every 50 ops, fsync after every op, flush and invalidate after every op; with
fallocate, punch hole, zero range and keep size on in all of them.  ``COMMON`` turns off, in both
runs, what the FUSE kernel module refuses before any request reaches the daemon (docs/design.md,
"What the kernel refuses"), so the mount's fsx would disable it and the control's not: collapse and
insert range (``fuse_file_fallocate`` forwards three modes).  ``RWF_DONTCACHE`` (FUSE's file
operations do not declare ``FOP_DONTCACHE``) has no such option: ``KERNEL_REFUSED`` is left out
of the comparison of what each run disabled.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from ckptfs_testing import xfstests
from ckptfs_testing.mount import child_env

SETS: dict[str, list[str]] = {
    "default": [],
    "no-mmap": ["-W", "-R"],
    "odirect": ["-Z", "-R", "-W", "-r", "4096", "-w", "4096"],
    "reopen": ["-c", "50"],
    "fsync": ["-y"],
    "flush": ["-f"],
}
COMMON = ["-C", "-I"]
# refused by the FUSE kernel module and with no fsx option to turn it off in the control run: a
# flag on some reads and writes (RWF_DONTCACHE), not an operation of its own, so both runs still do
# the same operations
KERNEL_REFUSED = frozenset({"dontcache IO"})
NAMES = ["plain.dat", "model.pt", "step_1/shard.bin"]  # a plain name, a checkpoint name, a group's file


@dataclasses.dataclass
class Row:
    kind: str  # fsx, fsx-2, fsx+reader, fsstress
    name: str
    opts: str
    seed: int
    native: xfstests.Run
    mount: xfstests.Run
    note: str = ""

    @property
    def ok(self) -> bool:
        same = self.native.disabled - KERNEL_REFUSED == self.mount.disabled - KERNEL_REFUSED
        return self.native.ok and self.mount.ok and same and not self.note

    def line(self) -> str:
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.kind} {self.name} [{self.opts}] seed {self.seed}: native rc "
                f"{self.native.rc} {self.native.seconds}s, mount rc {self.mount.rc} {self.mount.seconds}s"
                + (f" ({self.note})" if self.note else ""))


def _file(root: Path, name: str) -> Path:
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def transport_args(name: str) -> list[str]:
    """Options both runs of ``name`` get on this transport: on the portable mfusepy transport (libfuse
    3.14 has no ``DIRECT_IO_ALLOW_MMAP``) a checkpoint file being written cannot be mmapped
    (ENODEV; docs/design.md, "Known limits"), so fsx's mapped reads and writes are off there."""
    if os.environ.get("CKPTFS_TRANSPORT") == "mfusepy" and not name.startswith("plain"):
        return ["-W", "-R"]
    return []


def applies(name: str, opts: str) -> bool:
    """Whether option set ``opts`` can run on ``name`` on this transport: ``-f`` invalidates through a
    mapping, which the portable transport's checkpoint writers refuse (``transport_args``)."""
    return not (opts == "flush" and transport_args(name))


def fsx_pair(bindir: Path, native: Path, mount: Path, name: str, opts: str, seed: int, ops: int) -> Row:
    args = [*COMMON, *SETS[opts], *transport_args(name)]
    a = xfstests.fsx(bindir, _file(native, name), args, ops, seed)
    b = xfstests.fsx(bindir, _file(mount, name), args, ops, seed)
    return Row("fsx", name, opts, seed, a, b)


def fsx_two_at_once(bindir: Path, native: Path, mount: Path, seed: int, ops: int) -> list[Row]:
    """Two fsx processes at once on two files of one directory (each checked against its own run)."""
    rows: list[Row] = []
    names = ["two_a.pt", "step_2/two_b.bin"]
    for root, side in ((native, 0), (mount, 1)):
        out: dict[str, xfstests.Run] = {}

        def go(n: str, root: Path = root, out: dict = out) -> None:
            out[n] = xfstests.fsx(bindir, _file(root, n), [*COMMON, *transport_args(n)], ops, seed + len(n))

        ts = [threading.Thread(target=go, args=(n,)) for n in names]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if side == 0:
            nat = out
        else:
            rows += [Row("fsx-2", n, "default", seed + len(n), nat[n], out[n]) for n in names]
    return rows


def fsx_with_reader(bindir: Path, native: Path, mount: Path, seed: int, ops: int) -> Row:
    """fsx closing and reopening its file every 50 ops while another process opens, fstats and reads
    it in a loop: fsx's verdict as natively, and the reader never fails (its errors are the note)."""
    runs = []
    notes = []
    for root in (native, mount):
        p = _file(root, "c5.pt")
        reader = xfstests.Reader(p, sys.executable)
        try:
            runs.append(xfstests.fsx(bindir, p, [*COMMON, "-c", "50", *transport_args("c5.pt")], ops, seed))
        finally:
            got = reader.stop()
        if got["errors"]:
            notes.append(f"reader errors {got['errors']} in {got['opens']} reads ({root.name})")
        if not got["opens"]:
            notes.append(f"the reader read nothing ({root.name})")
    return Row("fsx+reader", "c5.pt", "reopen", seed, runs[0], runs[1], "; ".join(notes))


def fsstress_pair(bindir: Path, native: Path, mount: Path, seed: int, procs: int, ops: int) -> Row:
    a = xfstests.fsstress(bindir, native / f"fss{seed}", procs, ops, seed)
    b = xfstests.fsstress(bindir, mount / f"fss{seed}", procs, ops, seed)
    return Row("fsstress", f"fss{seed}", f"-p {procs} -n {ops}", seed, a, b)


def verify(backing: Path) -> subprocess.CompletedProcess:
    """``ckptfs verify DIR`` (mounted or not)."""
    return subprocess.run([sys.executable, "-m", "ckptfs", "verify", str(backing)], capture_output=True,
                          text=True, env=child_env())


def unreadable(root: Path) -> list[str]:
    """Every regular file under ``root`` read completely; the ones that fail, with their error."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                if not os.path.isfile(p) or os.path.islink(p):
                    continue
                with open(p, "rb") as fh:
                    while fh.read(1 << 20):
                        pass
            except OSError as e:
                bad.append(f"{os.path.relpath(p, root)}: {e}")
    return bad


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
