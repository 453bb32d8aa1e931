"""Kitchen studies whole, on the stand-in kit (``make test-robocasa``): the backend contract and the golden run.

Each runs for minutes in a process of its own making, without the kitchens tests/test_robocasa.py keeps open, so
``make test-robocasa`` runs this file beside that one. Skipped, with the reason, where kitchens cannot run.
"""

import json

import pytest
from helpers import cli
from kitchens import kit_opt_in, skip_unless_required, unavailable_reason


def test_the_robocasa_backend_passes_every_check_of_the_contract():
    """``check-backend robocasa`` on one kitchen, as every built-in backend passes it (81 s on 2 cores on the kit):
    seeded resets, fingerprints, every condition applied, read back and undone, renders, snapshots."""
    reason = unavailable_reason()
    if reason is not None:
        skip_unless_required(f"needs a working robocasa backend (kitchen assets included): {reason}")
    from robocasa_shift.checks.backend_check import check_backend

    result = check_backend("robocasa", ["RinseSinkBasin"], episodes=(0,), asset_kit=kit_opt_in())
    assert result.passed, result.markdown
    assert set(result["tasks"]) == {"RinseSinkBasin"}


@pytest.mark.parametrize("stock", [False, True])
def test_the_kitchen_golden_run_is_reproduced_with_and_without_the_fast_path(tmp_path, stock):
    """The expert's golden kitchen run (recorded with the code from before the fast path), field for field: one base
    episode's clean and perturbed rollouts on the fast path, the other's on the stock simulator."""
    from golden import assert_reproduced, backend_golden

    if kit_opt_in() is None:
        pytest.skip("the kitchen golden run was recorded on the stand-in kit")
    digest, _, why = backend_golden("robocasa")
    if digest is None:
        pytest.skip(why)
    run = tmp_path / "run"
    cli("run", "--backend", "robocasa", "--asset-kit", "standin", "--task", "RinseSinkBasin", "--phase", "validation",
        "--condition", "clean,action_latency:L2", "--episodes", "1" if stock else "0", "--policy", "expert",
        "--workers", "1", "--no-progress", "--run-dir", str(run), *(["--stock-simulator"] if stock else []),
        timeout=1800)
    assert_reproduced(digest, run, count=2)
    fastpath = json.loads((run / "manifest.json").read_text())["simulator"]["fastpath"]
    assert fastpath["enabled"] is not stock and fastpath.get("fused_step", False) is not stock
