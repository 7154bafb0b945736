"""The evidence checker (ckptfs_testing/evidence.py, scripts/evidence_check) in the suite: every way
one writer can end a step directory's save is judged against the torn/sealed rule (issue 25) on a
real mount, and each known-bad variant of that rule (ckptfs_testing/variant.py) is caught."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_group_evidence import needs_exit_events

from ckptfs_testing.evidence import check, expected, scenarios, summary


def test_the_oracle_is_the_rule_written_down() -> None:
    """The expected outcomes come from the scenario alone: a marker closed before the end seals;
    else exit 0 seals (or leaves an ordinary empty directory); else torn."""
    want = {s.name: expected(s) for s in scenarios()}
    assert want["files2-kill"] == want["files3-exit1"] == want["shell-begun-kill"] == "torn"
    assert want["plain-begun-exit1"] == want["shell-begun-exit1"] == want["files0-kill"] == "torn"
    assert want["files3-exit0"] == want["shell-done-kill"] == want["touch-done-exit1"] == "sealed"
    assert want["files0-exit0"] == "none"
    assert len(want) == 28


@needs_exit_events
def test_every_end_of_a_save_is_judged_as_the_rule_says(tmp_path: Path) -> None:
    """28 scenarios, one mount: 0 torn shown as good, 0 good hidden, mounted, unmounted and after
    a remount (a marker begun and then ``exit 1`` sealed its torn group before)."""
    s = summary(check(tmp_path, "good"))
    assert s["violations"] == [], s


@needs_exit_events
@pytest.mark.parametrize("variant,names,caught", [
    ("seal-on-flush", ["shell-done-exit0", "shell-done-kill", "shell-begun-exit1", "plain-done-exit0"],
     {"shell-done-exit0", "shell-done-kill", "shell-begun-exit1"}),
    ("ignore-exits", ["files1-kill", "files2-exit1", "files3-exit0", "files1-kill-open"],
     {"files1-kill", "files2-exit1"}),
])
def test_each_known_bad_variant_is_caught(tmp_path: Path, variant: str, names: list[str], caught: set[str]) -> None:
    """Without the seal-on-last-close rule a shell's marker is sealed empty (the next mount finds the
    group corrupt); without exit evidence a writer killed between files leaves a sealed torn group.
    The scenarios those rules do not decide stay as expected under the variant."""
    s = summary(check(tmp_path, variant, only=names))
    assert {x["scenario"] for x in s["violations"]} == caught, s
