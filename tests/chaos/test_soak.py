"""Long soak runs (marker ``soak``, excluded from the default test command).

Run them with ``python -m pytest -m soak tests/chaos`` (about 15 minutes): every
scenario with 60 s of load and a different seed, all invariants checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.chaos.scenarios import SCENARIOS, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.soak]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_soak(scenario: str, tmp_path: Path) -> None:
    report = run_scenario(scenario, duration_s=60.0, seed=sum(map(ord, scenario)), out_dir=tmp_path)
    print(report.summary())
    assert report.valid, report.result.problems()
