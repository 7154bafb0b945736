"""POSIX conformance: the whole pjdfstest suite (tests/pjdfstest/, vendored) on a ckptfs mount.

Full suite, every directory, run in a subdirectory 1,000 bytes below the mount root (a path of
PATH_MAX from there must work as natively: issue 24).  On a 2-core VM it took 223-249 s on a
mount (201 s natively, ext4), well inside the suite's budget, so no subset is chosen.  The files
pjdfstest selects by filesystem type (``pjd.FS_GATED``: rename/22.t, rename updates ctime) run
again as on the backing filesystem (+7 s).  Passes when at least 99% of its tests pass and every
failing test is listed in
``tests/pjdfstest/known_failures.txt`` (``dir/NN.t:N  # reason``): a new failure fails this test.
Allowlisted tests that now pass are printed, to be pruned.  ``scripts/pjdfstest_report`` writes the
native-vs-ckptfs comparison to docs/results/posix.md.
"""

from __future__ import annotations

import pytest

from campaigns import pjdfstest as pjd

MIN_PASS_RATIO = 0.99


def test_pjdfstest_suite(tmp_path):
    why = pjd.can_run()
    if why:
        pytest.skip(why)
    known = pjd.load_known()
    with pjd.public_tmpdir() as base, pjd.ckptfs_mount(base) as m:
        # in a deep subdirectory (issue 24): a path of PATH_MAX from there is longer from the mount
        # root, and the daemon must take it as a native directory does (*/03.t failed there)
        deep = m.path
        for i in range(5):
            deep = deep / (f"deep{i}" + "d" * 195)
            deep.mkdir(mode=0o755)
            deep.chmod(0o755)
        run = pjd.run_with_backing_fs(deep, base)
        alive = m.proc is not None and m.proc.poll() is None
    (tmp_path / "prove.txt").write_text(run.stdout + "\n--- stderr ---\n" + run.stderr)
    assert run.files, f"prove ran nothing (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert alive, "the ckptfs daemon died during the suite"

    failures = run.failures()
    total = run.tests
    passed = total - len(failures)
    ratio = passed / total if total else 0.0
    new = {k: v for k, v in failures.items() if k not in known}
    fixed = sorted(k for k in known if k not in failures)
    print(f"\npjdfstest on ckptfs: {len(run.files)} files, {total} tests, {passed} passed, "
          f"{len(failures)} failed ({100 * ratio:.2f}% pass), {run.wall_s:.0f} s; "
          f"{len(new)} not in known_failures.txt, {len(fixed)} listed there now pass")
    for d, c in run.per_dir().items():
        print(f"  {d:16} files {c['files']:3}  tests {c['tests']:5}  passed {c['passed']:5}  failed {c['failed']:5}")
    if fixed:
        print("  listed in known_failures.txt but passing now (prune them):", " ".join(fixed[:50]),
              "..." if len(fixed) > 50 else "")
    shown = "\n".join(f"  {k}: {v}" for k, v in list(new.items())[:60])
    more = f"\n  ... and {len(new) - 60} more (full output: {tmp_path / 'prove.txt'})" if len(new) > 60 else ""
    assert not new, f"{len(new)} pjdfstest failures not in tests/pjdfstest/known_failures.txt:\n{shown}{more}"
    assert ratio >= MIN_PASS_RATIO, (f"pjdfstest pass ratio {100 * ratio:.2f}% < {100 * MIN_PASS_RATIO:.0f}% "
                                     f"({len(failures)} of {total} failed)")
