"""``scripts/fsx_campaign``: the long run of fsx, fsstress and the rename race (issue 24), on both
transports, each against the same run natively; writes ``docs/results/raw/fsx_campaign.json`` and
prints the Markdown table that ``docs/results/posix.md`` quotes.  The bounded version is
``tests/test_fsx.py`` and ``tests/test_datapath.py``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from campaigns import xfstests as xc
from ckptfs_testing import xfstests
from ckptfs_testing.mount import ROOT, Mount
from ckptfs_testing.renamerace import race


def run(transport: str, ops: int, seeds: list[int], race_s: float, out: dict) -> list[str]:
    os.environ["CKPTFS_TRANSPORT"] = transport
    bindir = xfstests.build()
    lines: list[str] = []
    base = Path(tempfile.mkdtemp(prefix=f"fsxc-{transport}-"))
    try:
        native, mp = xc.fresh(base / "native"), xc.fresh(base / "ckpts")
        rows: list[xc.Row] = []
        t0 = time.monotonic()
        with Mount(mp).start():
            for opts in xc.SETS:
                for name in xc.NAMES:
                    if not xc.applies(name, opts):
                        continue
                    for seed in seeds:
                        rows.append(xc.fsx_pair(bindir, native, mp, name, opts, seed, ops))
                        print(rows[-1].line(), flush=True)
            for seed in seeds:
                rows += xc.fsx_two_at_once(bindir, native, mp, seed, ops)
                rows.append(xc.fsx_with_reader(bindir, native, mp, seed + 100, ops))
                rows.append(xc.fsstress_pair(bindir, native, mp, seed, 4, 3000))
                for r in rows[-4:]:
                    print(r.line(), flush=True)
        verify_rc = xc.verify(mp).returncode
        with Mount(mp).start():
            unreadable = xc.unreadable(mp)
        races = {}
        rn = xc.fresh(base / "rnative")
        base_rate = race(rn, "f.dat", race_s)
        rd = xc.fresh(base / "race")
        with Mount(rd).start():
            for name in ("f.dat", "latest", "model.safetensors", "m.pt"):
                races[name] = race(rd, name, race_s)
                print(transport, name, races[name], flush=True)
            # renames far denser: an open's lookup and its repeat meet more than one rename (T7)
            races["f.dat, 3 writers, 3 readers"] = race(rd, "f.dat", race_s, writers=3, readers=3)
            print(transport, "dense", races["f.dat, 3 writers, 3 readers"], flush=True)
        dense_native = race(xc.fresh(base / "rnative3"), "f.dat", race_s, writers=3, readers=3)
        fails = [r for r in rows if not r.ok]
        out[transport] = {
            "rows": [{"kind": r.kind, "name": r.name, "opts": r.opts, "seed": r.seed, "ok": r.ok,
                      "native_rc": r.native.rc, "mount_rc": r.mount.rc, "native_s": r.native.seconds,
                      "mount_s": r.mount.seconds, "note": r.note} for r in rows],
            "verify_rc": verify_rc, "unreadable": unreadable, "races": races, "native_race": base_rate,
            "native_race_dense": dense_native,
            "seconds": round(time.monotonic() - t0, 1)}
        n_fsx = sum(1 for r in rows if r.kind.startswith("fsx"))
        nat_s = sum(r.native.seconds for r in rows if r.kind == "fsx")
        mnt_s = sum(r.mount.seconds for r in rows if r.kind == "fsx")
        lines.append(f"| {transport} | {n_fsx} fsx runs x {ops} ops, {len(seeds) * 2} fsstress runs | "
                     f"{len(rows) - len(fails)} of {len(rows)} as natively | "
                     f"{'clean' if verify_rc == 0 else 'FAILED'}, {len(unreadable)} unreadable | "
                     + ", ".join(f"{k}: {v['errors'] or 0} errors in {v['reads']} reads, "
                                 f"{v['renames'] / race_s:.0f} renames/s" for k, v in races.items())
                     + f" (native {base_rate['renames'] / race_s:.0f}/s, 3 writers "
                       f"{dense_native['renames'] / race_s:.0f}/s, {dense_native['errors'] or 0} errors) | "
                     f"fsx time {mnt_s / max(nat_s, 1e-9):.1f}x native |")
        for r in fails:
            lines.append(f"| | FAIL {r.line()} | | | | |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return lines


def write_section(lines: list[str], a: argparse.Namespace, out: dict) -> None:
    """Replace the fsx section of docs/results/posix.md (after ``FSX_MARK``; the pjdfstest report
    above it keeps it)."""
    import subprocess

    from campaigns.posix_report import FSX_MARK

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    md = ROOT / "docs" / "results" / "posix.md"
    text = md.read_text() if md.exists() else ""
    head = text[:text.index(FSX_MARK)] if FSX_MARK in text else text.rstrip() + "\n\n"
    body = [FSX_MARK, "", "## fsx, fsstress and the rename race (issue 24)", "",
            f"Written by `scripts/fsx_campaign` (`campaigns/xfstests_report.py`), run "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, 2 cores.  Every run is "
            f"compared with the same program, seed and options natively (ext4 under /tmp): fsx with "
            f"{', '.join(xc.SETS)} on a plain name, a checkpoint name and a file in a live group, "
            f"{a.ops} ops, seeds 1-{a.seeds}; two fsx at once; fsx reopening every 50 ops beside a reader "
            f"process; fsstress -p 4 -n 3000; then `ckptfs verify` and every file read after a remount.  "
            f"The rename race: a writer `write NAME.part; rename(NAME.part, NAME)` in a loop beside a reader "
            f"opening, fstatting and reading NAME, {a.race_seconds:.0f} s per name, and for f.dat three such "
            f"writers beside three readers.  Collapse and insert range "
            f"are off in both runs (the FUSE kernel module refuses them); raw results: "
            f"`docs/results/raw/fsx_campaign.json`.", "", *lines, ""]
    md.write_text(head + "\n".join(body))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=50000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--race-seconds", type=float, default=10.0)
    ap.add_argument("--transports", default="kernel,mfusepy")
    a = ap.parse_args()
    out: dict = {"ops": a.ops, "seeds": a.seeds}
    lines = ["| transport | runs | verdicts | verify after, remount | rename race (reader errors, writer rate) "
             "| cost |", "|---|---|---|---|---|---|"]
    for t in a.transports.split(","):
        lines += run(t, a.ops, list(range(1, a.seeds + 1)), a.race_seconds, out)
    raw = ROOT / "docs" / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "fsx_campaign.json").write_text(json.dumps(out, indent=1, sort_keys=True))
    print("\n".join(lines))
    write_section(lines, a, out)
    bad = any(not r["ok"] for t in out.values() if isinstance(t, dict) for r in t.get("rows", []))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
