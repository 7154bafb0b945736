"""``scripts/reliability_report``: run the campaigns and write docs/results/reliability.md.

    scripts/reliability_report            # full counts; writes docs/results/reliability.md
                                          # and the raw JSON of every campaign in docs/results/raw/
    scripts/reliability_report --quick    # small counts, into /tmp (a smoke run)
    scripts/reliability_report --reuse    # take campaigns whose raw JSON exists from it, run the rest
    scripts/reliability_report --render   # only re-render the markdown from the raw JSON

Tables follow the seed paper's Table 2 (condition, OK/total, rate, Wilson 95%
interval) and Table 3 (fault, total, detected, breakdown).  The model checker
(``scripts/modelcheck --bound 16 --extra --bad --json``, issue 5 part 3) is included when that script
exists, else the report says "not run".  Every number in the markdown comes
from the JSON of the run that produced it.
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

from . import daemon, faultsweep, resume, writer
from .common import ROOT, fstype, interruptible, machine, wilson

RESULTS = ROOT / "docs" / "results"
QUICK = {"writer_scale": 0.05, "per_point": 1, "recovery": 1, "random": 2, "kills": 8}
FULL = {"writer_scale": 1.0, "per_point": 16, "recovery": 8, "random": 30, "kills": 50}


def pct(ok: int, n: int) -> str:
    lo, hi = wilson(ok, n)
    return f"{ok}/{n} | {100 * ok / n if n else 0:.1f} | [{100 * lo:.1f}, {100 * hi:.1f}]"


def run_campaigns(raw: Path, counts: dict, reuse: bool) -> dict[str, dict]:
    """Run (or reuse) each campaign; every result is written to raw/<name>.json at once."""
    raw.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict] = {}

    def step(name: str, fn, command: str) -> None:
        path = raw / f"{name}.json"
        if reuse and path.exists():
            out[name] = json.loads(path.read_text())
            print(f"{name}: reused {path}", flush=True)
            return
        print(f"{name}: running ({command})", flush=True)
        res = fn()
        res["command"] = command
        path.write_text(json.dumps(res, indent=1) + "\n")
        out[name] = res
        print(f"{name}: {res['trials']} trials, {len(res['violations'])} violations, {res.get('wall_s', '?')} s",
              flush=True)

    sc = counts["writer_scale"]
    wcounts = {k: max(1, round(v * sc)) for k, v in writer.full_counts().items()}
    step("writer", lambda: writer.run(wcounts), "scripts/kill_writer_campaign" + (f" --scale {sc}" if sc != 1 else ""))
    step("daemon", lambda: daemon.run(counts["per_point"], counts["recovery"], counts["random"]),
         f"scripts/kill_daemon_campaign --per-point {counts['per_point']} --recovery {counts['recovery']} "
         f"--random {counts['random']}")
    step("resume", lambda: resume.run(counts["kills"]), f"scripts/resume_campaign --kills {counts['kills']}")

    def faults() -> dict:
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix="ckptfs-faults-"))
        try:
            res = faultsweep.run(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        return res

    step("faults", faults, "campaigns.faultsweep.run (also tests/test_faults_unit.py)")
    mc = ROOT / "scripts" / "modelcheck"
    path = raw / "modelcheck.json"
    if reuse and path.exists():
        out["modelcheck"] = json.loads(path.read_text())
    elif mc.exists():
        args = ["--bound", "16", "--extra", "--bad", "--json", os.path.relpath(path, ROOT)]  # bound 256: hours
        print(f"modelcheck: running scripts/modelcheck {' '.join(args)}", flush=True)
        date, t0 = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
        r = subprocess.run([sys.executable, str(mc), *args], cwd=ROOT, capture_output=True, text=True)
        if path.exists():
            res = json.loads(path.read_text())
            res.update(date=date, wall_s=round(time.perf_counter() - t0, 1), _exit_status=r.returncode)
            path.write_text(json.dumps(res, indent=1) + "\n")
            out["modelcheck"] = res
        else:
            out["modelcheck"] = {"_not_run": f"scripts/modelcheck exited {r.returncode} without JSON: "
                                 f"{(r.stderr or r.stdout).strip()[-300:]}"}
    return out


def render(res: dict[str, dict], machine_line: str) -> str:
    w, d, r, f = res.get("writer"), res.get("daemon"), res.get("resume"), res.get("faults")
    viol = {k: len(v.get("violations", [])) for k, v in res.items() if isinstance(v, dict) and "violations" in v}
    L = ["# Reliability results", "",
         f"Written by `scripts/reliability_report` from the raw JSON in `docs/results/raw/` "
         f"(generated {time.strftime('%Y-%m-%d %H:%M')}).", "",
         f"Machine: {machine_line}. Backing filesystem: the temp directory's ({fstype()}).", "",
         "Commands (each runs on its own; the report runs them all):", ""]
    L += [f"* `{v['command']}` - {v.get('date', '')}, {v.get('wall_s', '?')} s" for v in res.values()
          if isinstance(v, dict) and "command" in v]
    L += ["", "## Invariant violations", "", "| campaign | trials | violations |", "|---|---|---|"]
    L += [f"| {k} | {res[k]['trials']} | {n} |" for k, n in viol.items()]
    for k in viol:
        L += [f"* {k}: {x}" for x in res[k]["violations"][:20]]
    if w:
        ck = [c for c in w["conditions"] if c["mode"].startswith("ckptfs")]
        ok, n = sum(c["ok"] for c in ck), sum(c["trials"] for c in ck)
        L += ["", "## 1. Writer killed (kill -9) during a save: ckptfs vs the three native modes", "",
              f"Workloads: `torch.save` of a {4 * w['state_numel'] // 2**20} MiB state over the existing file; "
              "a group save (3 shards + manifest, then the `latest` pointer, rotation keeping two steps).  Kill time "
              "uniform in the condition's measured save window.  OK = the resume logic loads bit-exact data "
              "of the previous or the new generation/step (the new one if the writer finished first) and no torn "
              "file is visible.  \"killed\" = the writer was still running when killed; \"refused\" = versions "
              "ckptfs refused to commit (dying writer).", "",
              "| condition | OK/total | OK rate (%) | 95% CI (Wilson) | killed | refused | torn/unloadable "
              "| wrong version | writer error | save window (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in w["conditions"]:
            o = c["outcomes"]
            L.append(f"| {c['mode']}@{c['workload']} | {pct(c['ok'], c['trials'])} | {c['killed_mid_run']} | "
                     f"{c['ckptfs_aborts']} | {o['torn_or_unloadable']} | {o['wrong_version']} | "
                     f"{o.get('writer_error', 0)} | {c['save_window_s']} |")
        un = [c for c in w["conditions"] if c["mode"] == "unsafe"]
        lo, hi = wilson(ok, n)
        L += ["", f"ckptfs, all writer conditions: {ok}/{n} OK, Wilson 95% CI [{100 * lo:.1f}, {100 * hi:.1f}] %."]
        if un:
            uo, un_n = sum(c["ok"] for c in un), sum(c["trials"] for c in un)
            L.append(f"Native unsafe (in-place writes), same run: {uo}/{un_n} OK, failure rate "
                     f"{100 * (un_n - uo) / un_n:.1f} %.")
        L += ["", "A process kill never drops page-cache data, so `atomic_nodirsync` and `atomic_dirsync` cannot "
              "differ here and both look perfect; what separates them (and ckptfs) is power loss, which is the "
              "model checker's subject (section 5)."]
    if d:
        windows = ", ".join(f"{k} {v} s" for k, v in d["windows_s"].items())
        L += ["", "## 2. ckptfs daemon killed (kill -9), remount, check", "",
              f"Workload `tests/workloads/sequence.py`, {d['steps_per_trial']} steps per trial (3 shards, pointer "
              "by rename, rotation, directory fsync, ack), each trial continuing the same directory.  `<point>`: "
              "`CKPTFS_CRASH_AT=<point>:<n>` (n random in the reachable range); `recovery`: a crash at a random "
              "point, then a second crash inside mount-time recovery; `random`: kill at a uniform time within "
              f"the workload's duration (measured: {windows}).  OK = after remount the state is a prefix "
              "of the completed operations, every visible shard loads bit-exact, nothing acknowledged is lost, "
              "and a clean unmount leaves staging empty.  \"crashed\" = the crash happened as planned.", "",
              "| condition | OK/total | OK rate (%) | 95% CI (Wilson) | crashed |", "|---|---|---|---|---|"]
        L += [f"| {c['condition']} | {pct(c['ok'], c['trials'])} | {c['crashed']} |" for c in d["conditions"]]
        ok, n = sum(c["ok"] for c in d["conditions"]), d["trials"]
        L += ["", f"All daemon trials: {ok}/{n} OK, Wilson 95% CI [{100 * wilson(ok, n)[0]:.1f}, "
              f"{100 * wilson(ok, n)[1]:.1f}] %."]
    if r:
        L += ["", "## 3. Resume exactness", "",
              f"`tests/workloads/train.py`: {r['total_steps']} steps, checkpoint every {r['checkpoint_every']} "
              "steps through the mount (`latest` pointer, rotation), dropout, AdamW, StepLR, DataLoader cursor, "
              "torch/numpy/python RNG state; killed at random, resumed from the newest visible checkpoint each "
              "time, then run to the end; compared with an uninterrupted run in a plain directory.", "",
              "| kills | killed while running | resumes | step reached before the final run | refused versions "
              "| tensors compared | bit-identical |", "|---|---|---|---|---|---|---|",
              f"| {r['kills']} | {r['killed_while_running']} | {r['resumes']} | "
              f"{r.get('step_reached_before_final_run', '?')}/{r['total_steps']} | {r['ckptfs_aborts']} | "
              f"{r['tensors_compared']} | {'yes' if r['bit_identical'] and not r['violations'] else 'NO'} |"]
    if f:
        L += ["", "## 4. I/O-error matrix (every mutating backing call of an overwrite fails once, in turn)", "",
              "| error | commit | kept generations | calls swept | errors surfaced to the app | saved, error after "
              "the install | partial visible | old version intact | new complete (failure after rename) | "
              "staging leaks | recovery disagrees |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        L += [f"| {c['error']} | {c['commit']} | {c.get('keep_generations', 1)} | {c['calls_swept']} | "
              f"{c['errors_surfaced']} | {c.get('after_install', 0)} | "
              f"{c['partial_visible']} | {c['old_intact']} | {c['new_complete_after_rename']} | "
              f"{c['staging_leaks']} | {c['recovery_disagrees']} |" for c in f["conditions"]]
        L += ["", "Calls swept: " + ", ".join(sorted({o for c in f["conditions"] for o in c["ops"]})) + "."]
    L += ["", "## 5. Power loss: model checker", ""]
    mc = res.get("modelcheck")
    if mc is None:
        L.append("Not run: `scripts/modelcheck` does not exist in this tree (issue 5 part 3, another branch).")
    elif "_not_run" in mc:
        L.append(f"Not run: {mc['_not_run']}")
    else:
        L += _modelcheck_tables(mc, "`" + mc.get("command", "scripts/modelcheck") + "`")
        L += ["", "The defects earlier runs found, and their fixes, are listed in `docs/results/modelcheck.md`."]
    return "\n".join(L) + "\n"


def _modelcheck_tables(mc: dict, cmd: str) -> list[str]:
    L = [f"{cmd} (bound {mc.get('bound')} states per crash point, exhaustive up to it, sampled beyond; "
         f"complete: {mc.get('complete')}):", "",
         "| workload | model | mode | kind | crash points | states checked | distinct | exhaustive points "
         "| crash-during-recovery states | violations |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in mc.get("results", []):
        L.append(f"| {r['workload']} | {r['model']} | {r.get('mode', '')} | {r.get('kind', '')} | "
                 f"{r['crash_points']} | {r['states_checked']} | {r.get('distinct_states', '')} | "
                 f"{r.get('exhaustive_points', '')}/{r['crash_points']} | {r.get('recovery_crash_states', '')} | "
                 f"{r['violations']} |")
    L += ["", "kind `real` = the ckptfs protocol (must be 0 under weak and ext4; weak-unordered lets a renamed "
          "file lose both names, which no rename-based protocol survives: violations expected there); "
          "kind `bad` = a deliberately broken variant (must be caught: violations > 0)."]
    return L




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/reliability_report", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts; output under /tmp unless --out")
    ap.add_argument("--reuse", action="store_true", help="reuse raw JSON that exists; run the rest")
    ap.add_argument("--render", action="store_true", help="only render the markdown from the raw JSON")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    interruptible()
    if a.quick:
        base = Path(tempfile.gettempdir()) / "ckptfs-reliability-quick"
        raw, out = base / "raw", Path(a.out or base / "reliability.md")
    else:
        raw, out = RESULTS / "raw", Path(a.out or RESULTS / "reliability.md")
    if a.render:
        res = {p.stem: json.loads(p.read_text()) for p in sorted(raw.glob("*.json"))
               if p.stem in ("writer", "daemon", "resume", "faults", "modelcheck")}  # not other results
    else:
        res = run_campaigns(raw, QUICK if a.quick else FULL, a.reuse or a.render)
    m = next((v["machine"] for v in res.values() if isinstance(v, dict) and "machine" in v), None) or machine()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(res, m))
    print(f"wrote {out}")
    return 1 if any(v.get("violations") for v in res.values() if isinstance(v, dict)) else 0
