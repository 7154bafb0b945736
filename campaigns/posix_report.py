"""``scripts/pjdfstest_report``: pjdfstest natively and on ckptfs -> docs/results/posix.md.

    scripts/pjdfstest_report                 # both full runs (~4 min each on 2 cores); writes
                                             # docs/results/posix.md and docs/results/raw/posix.json
    scripts/pjdfstest_report open rename     # only these test directories
    scripts/pjdfstest_report --render        # re-render the markdown from the raw JSON
    scripts/pjdfstest_report --update-known  # also rewrite tests/pjdfstest/known_failures.txt with the
                                             # ckptfs failures of this run (reasons of listed tests kept;
                                             # new ones get "TODO: <pjdfstest message>")

Both runs use a fresh 0755 directory under /tmp (the same disk): natively a plain directory, for
ckptfs a mount with --allow-other over it.  Needs root.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from . import pjdfstest as pjd
from .common import ROOT, fstype, interruptible, machine

FSX_MARK = "<!-- fsx campaign (scripts/fsx_campaign) -->"

RESULTS = ROOT / "docs" / "results"


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _summary(run: pjd.Run) -> dict:
    fails = run.failures()
    return {"wall_s": round(run.wall_s, 1), "files": len(run.files), "tests": run.tests,
            "failed": len(fails), "passed": run.tests - len(fails), "prove_exit": run.returncode,
            "per_dir": run.per_dir(), "failures": fails,
            "per_file": {f.name: f.tests for f in sorted(run.files.values(), key=lambda f: f.name)}}


def run_both(testdirs: list[str]) -> dict:
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "kernel": platform.release(),
                 "commit": _commit(), "machine": machine(), "backing": fstype(),
                 "testdirs": testdirs or "all", "build": str(pjd.build())}
    with pjd.public_tmpdir("pjd-native-") as d:
        print("native: running pjdfstest in", d, flush=True)
        res["native"] = _summary(pjd.run_suite(d, testdirs))
        res["native_fs"] = pjd.fs_type(d)
        print(f"native: {res['native']['failed']} of {res['native']['tests']} failed, {res['native']['wall_s']} s",
              flush=True)
    with pjd.public_tmpdir("pjd-ckptfs-") as base, pjd.ckptfs_mount(base) as m:
        print("ckptfs: running pjdfstest in", m.path, flush=True)
        res["ckptfs"] = _summary(pjd.run_suite(m.path, testdirs))
        print(f"ckptfs: {res['ckptfs']['failed']} of {res['ckptfs']['tests']} failed, {res['ckptfs']['wall_s']} s",
              flush=True)
        # files whose test plan depends on the filesystem type pjdfstest sees (FUSE.CKPTFS vs EXT4):
        # run them again on the mount as they run on the backing filesystem
        res["ckptfs_fs"] = pjd.fs_type(m.path)
        differ = sorted(f for f, n in res["native"]["per_file"].items() if res["ckptfs"]["per_file"].get(f) != n)
        if differ:
            print(f"ckptfs: {' '.join(differ)} again with fs={res['native_fs']}", flush=True)
            res["ckptfs_as_native_fs"] = _summary(pjd.run_forced_fs(m.path, differ, res["native_fs"]))
    return res


def _ranges(nums: list[int]) -> str:
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out)


def render(res: dict) -> str:
    n, c = res["native"], res["ckptfs"]
    known = pjd.load_known()
    L = ["# POSIX conformance (pjdfstest)", "",
         f"Written by `scripts/pjdfstest_report` from `docs/results/raw/posix.json`. Run {res['date']}, "
         f"commit {res['commit']}, Linux {res['kernel']}, {res['machine']}; backing directory: "
         f"{res['backing']}.", "",
         "Suite: pjdfstest upstream commit 85a8aea (vendored in `tests/pjdfstest/`), test directories: "
         f"{res['testdirs'] if isinstance(res['testdirs'], str) else ' '.join(res['testdirs'])}; "
         "`prove -r -v` as root in a fresh 0755 directory under /tmp, natively and on a ckptfs mount "
         "(`--allow-other`, sync commits) over such a directory.  `tests/test_pjdfstest.py` runs the same "
         "suite on every CI run (pass ratio >= 99% and every failure listed in "
         "`tests/pjdfstest/known_failures.txt`).", "",
         "| | files | tests | passed | failed | pass % | wall s |", "|---|---|---|---|---|---|---|"]
    for name, r in (("native", n), ("ckptfs", c)):
        pct = 100 * r["passed"] / r["tests"] if r["tests"] else 0
        L.append(f"| {name} | {r['files']} | {r['tests']} | {r['passed']} | {r['failed']} | {pct:.2f} | "
                 f"{r['wall_s']} |")
    L += ["", "## Per directory", "",
          "| directory | files | tests native | failed native | tests ckptfs | passed ckptfs | failed ckptfs |",
          "|---|---|---|---|---|---|---|"]
    for d in sorted(set(n["per_dir"]) | set(c["per_dir"])):
        a, b = n["per_dir"].get(d, {}), c["per_dir"].get(d, {})
        L.append(f"| {d} | {b.get('files', a.get('files', 0))} | {a.get('tests', 0)} | {a.get('failed', 0)} | "
                 f"{b.get('tests', 0)} | {b.get('passed', 0)} | {b.get('failed', 0)} |")
    differ = sorted(f for f, k in n.get("per_file", {}).items() if c.get("per_file", {}).get(f) != k)
    if differ:
        forced = res.get("ckptfs_as_native_fs")
        L += ["", "## Files whose tests depend on the filesystem type", "",
              f"pjdfstest selects some tests by the type `df -PT` reports ({res.get('ckptfs_fs', '?')} on the mount, "
              f"{res.get('native_fs', '?')} natively), hence the different test counts; e.g. rename/22.t (rename "
              "updates ctime, optional in POSIX) runs only on EXT4, UFS and ZFS.  These files were run again on "
              f"the mount with pjdfstest told the type is {res.get('native_fs', '?')}:", "",
              "| file | tests native | tests ckptfs | tests ckptfs as native type | failed |", "|---|---|---|---|---|"]
        for f in differ:
            ft = forced["per_file"].get(f, "?") if forced else "not run"
            ff = sum(1 for k in forced["failures"] if k.startswith(f + ":")) if forced else "-"
            L.append(f"| {f} | {n['per_file'].get(f, 0)} | {c['per_file'].get(f, 0)} | {ft} | {ff} |")
    by_file: dict[str, list[int]] = {}
    for k in c["failures"]:
        f, _, num = k.rpartition(":")
        by_file.setdefault(f, []).append(int(num))
    L += ["", "## Failing tests on ckptfs", ""]
    if not by_file:
        L += ["None."]
    else:
        L += ["Test numbers per file (`tests/<dir>/<NN>.t` in the tarball); the reason is the one given in "
              "`known_failures.txt` for the file's first failing test, else pjdfstest's message.", "",
              "| file | failed | tests | reason |", "|---|---|---|---|"]
    for f, nums in sorted(by_file.items()):
        first = f"{f}:{nums[0]}"
        why = known.get(first) or c["failures"][first]
        L.append(f"| {f} | {len(nums)} | {_ranges(sorted(nums))} | {why.replace('|', '/')} |")
    if n["failures"]:
        L += ["", "## Failing natively", ""] + [f"* {k}: {v}" for k, v in list(n["failures"].items())[:100]]
    L += ["", "How the mount got here from 3,669 failures at 1db6474 (what each fix removed): "
          "`docs/results/posix-history.md`."]
    return "\n".join(L) + "\n"


def update_known(failures: dict[str, str]) -> None:
    old = pjd.load_known()
    header = [ln for ln in (pjd.KNOWN.read_text().splitlines() if pjd.KNOWN.exists() else [])
              if ln.startswith("#")]
    lines = header + [f"{k}  # {old.get(k) or 'TODO: ' + v}" for k, v in failures.items()]
    pjd.KNOWN.write_text("\n".join(lines) + "\n")
    print(f"wrote {pjd.KNOWN}: {len(failures)} entries ({len(set(failures) - set(old))} new, "
          f"{len(set(old) - set(failures))} dropped)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/pjdfstest_report", description=__doc__.split("\n")[0])
    ap.add_argument("testdirs", nargs="*", help="pjdfstest test directories (default: all)")
    ap.add_argument("--render", action="store_true", help="only re-render the markdown from the raw JSON")
    ap.add_argument("--update-known", action="store_true", help="rewrite tests/pjdfstest/known_failures.txt")
    ap.add_argument("--out", default=str(RESULTS / "posix.md"))
    ap.add_argument("--raw", default=str(RESULTS / "raw" / "posix.json"))
    a = ap.parse_args(argv)
    interruptible()
    raw, out = Path(a.raw), Path(a.out)
    if a.render:
        res = json.loads(raw.read_text())
    else:
        why = pjd.can_run()
        if why:
            print(f"cannot run: {why}", file=sys.stderr)
            return 2
        res = run_both(a.testdirs)
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(res, indent=1) + "\n")
    if a.update_known:
        update_known(res["ckptfs"]["failures"])
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = ""
    if out.exists() and FSX_MARK in out.read_text():  # the fsx campaign's section (xfstests_report)
        kept = out.read_text()[out.read_text().index(FSX_MARK):]
    out.write_text(render(res) + ("\n" + kept if kept else ""))
    print(f"wrote {out}")
    return 0
