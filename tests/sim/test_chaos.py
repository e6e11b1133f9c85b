"""A short chaos run in the test suite: kills and failpoint crashes, then the checkers."""

from __future__ import annotations

import re

from tests.sim import chaos


def test_short_chaos_run_finds_no_violation(tmp_path, capsys):
    status = chaos.main(["--cycles", "6", "--seed", "20261121", "--data-dir", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"chaos: (\d+) cycles, (\d+) kills, (\d+) failpoints, (\d+) messages, "
        r"(\d+) transactions, (\d+) violations",
        last,
    )
    assert match, last
    cycles, kills, failpoints, messages, transactions, violations = map(int, match.groups())
    assert status == 0 and violations == 0, last
    assert cycles == 6 and kills + failpoints >= 3
    assert messages > 0 and transactions > 0
