"""The reader/writer race (issue 15, V1): one process saves a checkpoint over the same path N times,
another loads it in a loop (tests/workloads/race.py).  Used by tests/test_readers.py and
scripts/reader_race_campaign."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RACE = str(ROOT / "tests" / "workloads" / "race.py")


def race(mountpoint: Path, tmp: Path, kind: str, rel: str, mode: str, n: int = 30,
         writer_must_succeed: bool = True) -> dict:
    """Save ``n`` versions of ``rel`` (KIND, MODE: see race.py) while a reader loads it in a loop.
    The reader's report: loads, errors (messages), absent (not there: between an unlink and the next
    save), torn (a load mixing versions), gens (the version of each load, in order), plus
    ``reader_rc`` (its exit status: -7 is SIGBUS), ``writer_rc`` and ``writer_error`` (a failed writer
    raises AssertionError unless ``writer_must_succeed`` is False: the campaign records it) and
    ``final`` (the version loaded afterwards)."""
    path = str(mountpoint / rel)
    subprocess.run([sys.executable, RACE, "write", kind, path, "1", "inplace"], check=True, timeout=120,
                   stderr=subprocess.DEVNULL)
    stop, out = tmp / f"stop-{kind}-{mode}", tmp / f"read-{kind}-{mode}.json"
    stop.unlink(missing_ok=True)
    out.unlink(missing_ok=True)
    reader = subprocess.Popen([sys.executable, RACE, "read", kind, path, str(stop), str(out)],
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # the reader is loading (its imports done) before the first save starts
        t0 = time.monotonic()
        w = subprocess.run([sys.executable, RACE, "write", kind, path, str(n), mode], timeout=300,
                           stderr=subprocess.PIPE, text=True)
        if w.returncode != 0 and writer_must_succeed:
            raise AssertionError(f"writer failed ({w.returncode}): {w.stderr[-500:]}")
        seconds = time.monotonic() - t0
        time.sleep(0.5)
    finally:
        stop.touch()
        rc = reader.wait(timeout=120)
    rep = json.loads(out.read_text()) if out.exists() else {"loads": 0, "errors": [], "absent": 0, "torn": 0,
                                                            "gens": []}
    rep["reader_rc"] = rc
    rep["writer_rc"] = w.returncode
    if w.returncode != 0:
        rep["writer_error"] = (w.stderr.strip().splitlines() or [""])[-1][:300]
    rep["save_seconds"] = round(seconds, 2)
    rep["final"] = subprocess.run([sys.executable, "-c", (
        f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'workloads')!r}); import race; "
        f"print(race.generation(race.load({kind!r}, {path!r})))")], check=True, capture_output=True,
        text=True, timeout=120).stdout.strip()
    return rep
