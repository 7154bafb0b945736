"""pjdfstest (POSIX conformance suite) on a ckptfs mount: run, parse, compare with the allowlist.

Shared by ``tests/test_pjdfstest.py`` and ``scripts/pjdfstest_report``.  The suite is vendored in
``tests/pjdfstest/`` (source tarball, upstream commit 85a8aea, BSD licence) and built by
``tests/pjdfstest/run`` into a cache directory.  Its tests switch to uid 65534, so the mount needs
``--allow-other`` and the mount directory and all its parents must be searchable by others:
:func:`public_tmpdir` makes a 0755 directory directly under /tmp for that.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .common import ROOT, Mount

PJD_DIR = ROOT / "tests" / "pjdfstest"
RUNNER = PJD_DIR / "run"
KNOWN = PJD_DIR / "known_failures.txt"
# files whose tests pjdfstest selects by the filesystem type df reports (FUSE.CKPTFS on a mount): run
# again as on the backing filesystem (run_forced_fs).  scripts/pjdfstest_report lists every file whose
# test count differs between native and ckptfs; rename/22.t is the only one on ext4.
FS_GATED = ["rename/22.t"]

_FILE = re.compile(r"^(?P<path>/\S*/tests/(?P<name>[\w.-]+/\d+\.t)) \.+ ?(?P<rest>.*)$")
_PLAN = re.compile(r"^1\.\.(\d+)")
_TEST = re.compile(r"^(?P<not>not )?ok (?P<num>\d+)\b(?P<rest>.*)$")


@dataclass
class FileResult:
    """One ``dir/NN.t`` of the suite: its plan and the failing test numbers with their messages."""

    name: str
    planned: int = 0
    seen: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)

    @property
    def tests(self) -> int:
        return max(self.planned, max(self.seen, default=0))

    def failures(self) -> dict[int, str]:
        """Failed tests, counting planned tests that never ran (the script died) as failed."""
        out = dict(self.failed)
        for n in range(1, self.tests + 1):
            if n not in self.seen:
                out[n] = "not run (planned, no result)"
        return out


def parse_prove(text: str) -> dict[str, FileResult]:
    """Per-file results from ``prove -v`` stdout (the test scripts' stderr is not in it).

    ``not ok N # TODO`` / ``# SKIP`` count as passed, as prove counts them."""
    files: dict[str, FileResult] = {}
    cur: FileResult | None = None
    for line in text.splitlines():
        m = _FILE.match(line)
        if m:
            cur = files.setdefault(m["name"], FileResult(m["name"]))
            line = m["rest"]
        if cur is None:
            continue
        p = _PLAN.match(line)
        if p:
            cur.planned = int(p.group(1))
            continue
        t = _TEST.match(line)
        if t:
            n = int(t["num"])
            cur.seen.add(n)
            rest = t["rest"].strip()
            if t["not"] and not re.search(r"#\s*(TODO|SKIP)", rest, re.I):
                cur.failed[n] = rest.lstrip("- ").strip() or "not ok"
    return files


@dataclass
class Run:
    files: dict[str, FileResult]
    wall_s: float
    returncode: int
    stdout: str
    stderr: str

    @property
    def tests(self) -> int:
        return sum(f.tests for f in self.files.values())

    def failures(self) -> dict[str, str]:
        """``dir/NN.t:N`` -> pjdfstest's message, for every failed test."""
        return {f"{f.name}:{n}": msg for f in sorted(self.files.values(), key=lambda f: f.name)
                for n, msg in sorted(f.failures().items())}

    def per_dir(self) -> dict[str, dict[str, int]]:
        """dir -> files, tests, passed, failed."""
        out: dict[str, dict[str, int]] = {}
        for f in self.files.values():
            d = out.setdefault(f.name.split("/")[0], {"files": 0, "tests": 0, "passed": 0, "failed": 0})
            nf = len(f.failures())
            d["files"] += 1
            d["tests"] += f.tests
            d["failed"] += nf
            d["passed"] += f.tests - nf
        return dict(sorted(out.items()))


def build(env: dict[str, str] | None = None) -> Path:
    """Build the suite (once; cached) and return its directory."""
    r = subprocess.run([str(RUNNER), "--build"], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"pjdfstest build failed:\n{r.stderr}")
    return Path(r.stdout.strip().splitlines()[-1])


def run_suite(directory: Path, testdirs: list[str] | None = None, timeout: float = 900) -> Run:
    """Run ``prove -r -v`` on the suite (or on ``testdirs``) inside ``directory``."""
    build()
    t0 = time.monotonic()
    r = subprocess.run([str(RUNNER), "-v", str(directory), *(testdirs or [])], capture_output=True,
                       text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
    return Run(parse_prove(r.stdout), time.monotonic() - t0, r.returncode, r.stdout, r.stderr)


def run_forced_fs(directory: Path, files: list[str], fs: str, timeout: float = 900) -> Run:
    """Run test ``files`` (``dir/NN.t``) inside ``directory`` with pjdfstest told the filesystem is ``fs``.

    pjdfstest picks some tests by the type ``df -PT`` reports (``FUSE.CKPTFS`` on a mount): e.g.
    rename/22.t (rename updates ctime, optional in POSIX) runs only on EXT4, UFS and ZFS.  This runs
    such files as they run on the backing filesystem, from a copy of the suite whose ``conf`` sets ``fs``."""
    b = build()
    with tempfile.TemporaryDirectory(prefix="pjdfstest-fs-") as tmp:
        t = Path(tmp)
        shutil.copytree(b / "tests", t / "tests")
        shutil.copy2(b / "pjdfstest", t / "pjdfstest")
        conf = t / "tests" / "conf"
        check = '\nif [ -z "${fs}" ]; then'  # right after conf has set fs from df
        conf.write_text(conf.read_text().replace(check, f'\nfs="{fs}"' + check, 1))
        t0 = time.monotonic()
        r = subprocess.run(["prove", "-v", *(str(t / "tests" / f) for f in files)], cwd=directory,
                           capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
        return Run(parse_prove(r.stdout), time.monotonic() - t0, r.returncode, r.stdout, r.stderr)


def run_with_backing_fs(mnt: Path, backing: Path, testdirs: list[str] | None = None) -> Run:
    """:func:`run_suite` on the mount, then the ``FS_GATED`` files as pjdfstest runs them on the backing
    filesystem's type; their results replace the mount run's where they ran more tests."""
    run = run_suite(mnt, testdirs)
    gated = [f for f in FS_GATED if f in run.files]
    if gated:
        forced = run_forced_fs(mnt, gated, fs_type(backing))
        run.files.update({k: v for k, v in forced.files.items() if v.tests > run.files[k].tests})
        run.wall_s += forced.wall_s
        run.stdout += "\n--- FS_GATED files run with fs=" + fs_type(backing) + " ---\n" + forced.stdout
        run.stderr += forced.stderr
    return run


def fs_type(directory: Path) -> str:
    """The filesystem type as pjdfstest's conf computes it on Linux (``df -PT``, upper case)."""
    out = subprocess.run(["df", "-PT", str(directory)], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1].split()[1].upper()


def load_known(path: Path = KNOWN) -> dict[str, str]:
    """The allowlist: ``dir/NN.t:N  # reason`` per line -> {key: reason}."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        key, _, reason = line.partition("#")
        key = key.strip()
        if key:
            if not re.fullmatch(r"[\w.-]+/\d+\.t:\d+", key):
                raise ValueError(f"{path}: bad line {line!r} (want dir/NN.t:N  # reason)")
            out[key] = reason.strip()
    return out


@contextlib.contextmanager
def public_tmpdir(prefix: str = "ckptfs-pjd-") -> Iterator[Path]:
    """A fresh 0755 directory directly under /tmp (uid 65534 must reach what is below it)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        d.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def ckptfs_mount(base: Path) -> Iterator[Mount]:
    """ckptfs with --allow-other at ``base/mnt`` (in place), stopped and unmounted afterwards."""
    d = base / "mnt"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    m = Mount(d, extra_args=["--allow-other"]).start()
    try:
        yield m
    finally:
        m.stop()


def can_run() -> str | None:
    """Why the suite cannot run here, or None."""
    if os.geteuid() != 0:
        return "pjdfstest needs root (its tests chown and switch to uid 65534)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing"
    return None
