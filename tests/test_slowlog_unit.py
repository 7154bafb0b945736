"""Issue 24, item 7: routine slow commits do not flood the daemon log (logic test of SlowLog)."""

from __future__ import annotations

from ckptfs.latency import SLOW_SUMMARY_SECONDS, SLOW_WARN_SECONDS, SlowLog


def test_routine_slow_commits_become_one_summary_line_per_interval() -> None:
    now = [0.0]
    sl = SlowLog(clock=lambda: now[0])
    said = []
    for i in range(6_000):  # 6,000 commits of 2-20 ms over 10 minutes (an fsstress run's worth)
        now[0] = i * 0.1
        got = sl.note(f"f{i}", 4096, 0.002 + (i % 10) * 0.002)
        if got is not None:
            said.append(got)
    assert len(said) <= 600 / SLOW_SUMMARY_SECONDS + 1
    assert all(level == "info" for level, _ in said)
    assert "slowest 0.020 s" in said[0][1]


def test_a_really_slow_commit_is_a_warning_of_its_own() -> None:
    sl = SlowLog(clock=lambda: 0.0)
    got = sl.note("step_1/model.pt", 1 << 30, SLOW_WARN_SECONDS + 0.5)
    assert got is not None and got[0] == "warning" and "step_1/model.pt" in got[1]
