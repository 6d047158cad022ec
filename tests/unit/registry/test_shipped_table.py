"""The table of verdicts this package ships: made by the current rules, for
every release CI tests and every fix (``scripts/ship_verdicts.py`` makes it)."""

from __future__ import annotations

import json

from vllm_graphsafe import releases, shipped_verdicts
from vllm_graphsafe.fixes import fix_ids

REMAKE = "run `python scripts/ship_verdicts.py` (it judges each CI release's venv)"


def test_the_shipped_table_was_made_by_these_rules() -> None:
    document = json.loads(shipped_verdicts.SHIPPED_FILE.read_text())
    assert document["rules"] == shipped_verdicts.rules_digest(), (
        f"a rule file changed after the shipped verdicts were judged: {REMAKE}"
    )
    assert shipped_verdicts.read_table(shipped_verdicts.SHIPPED_FILE)


def test_every_ci_release_ships_a_verdict_for_every_fix() -> None:
    shipped = shipped_verdicts.read_table(shipped_verdicts.SHIPPED_FILE)
    have = {(verdict.release, verdict.patch) for verdict in shipped}
    want = {(r, fix) for r in releases.ci_releases() for fix in fix_ids()}
    assert want <= have, f"missing {sorted(want - have)}: {REMAKE}"
