"""RESCUE's label-leak control, the SAFE-style sequence head and the pooled-AUC report's feature-set analyses
(incremental value, time-resolved fusion with a shuffled control, CKA), each on data the test makes, with an
answer worked out by hand or by exact enumeration."""

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.analysis import monitor_decision as decision
from robocasa_shift.analysis import monitor_detection as detection
from robocasa_shift.monitoring import monitors


def boundary_table(outcomes, task="A", condition="clean", boundaries=(0, 10, 20), horizon=40):
    """One row per boundary: rollouts ``task/e`` with ``outcomes[e]`` (True: success); failures run to the
    horizon, successes end at the last boundary + 5."""
    rows = []
    for episode, success in enumerate(outcomes):
        steps = boundaries[-1] + 5 if success else horizon
        for step in boundaries:
            rows.append({"rollout_id": f"formal/{task}/{episode}/{condition}", "task": task, "episode": episode,
                         "condition": condition, "success": bool(success), "steps": steps, "horizon": horizon,
                         "step": step, "score": 0.0})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- the label leak


def test_the_label_leak_scores_every_failure_boundary_infinite_and_every_success_boundary_zero():
    table = boundary_table([True, False, True])
    leak = monitors.label_leak_scores(table)
    assert list(leak.columns) == list(table.columns) and leak.drop(columns="score").equals(table.drop(columns="score"))
    assert (leak.loc[~leak["success"], "score"] == np.inf).all() and (leak.loc[leak["success"], "score"] == 0).all()


def test_the_label_leak_is_the_ideal_detector_worked_out_by_hand_and_minus_the_leak_is_rejected():
    # validation: 20 successes and 4 failures; test: 30 successes (25 steps) and 6 failures (40-step timeouts)
    validation = monitors.label_leak_scores(boundary_table([True] * 20 + [False] * 4))
    test = monitors.label_leak_scores(boundary_table([True] * 30 + [False] * 6, task="A").assign(
        rollout_id=lambda d: d["rollout_id"].str.replace("formal/A/", "formal/A/t")))
    window = {"A": None}
    ep_val = detection.episode_scores(validation, window)
    # every success ties at 0: no observed score meets 5%, so +inf, which only the failures reach
    threshold = detection.select_threshold(ep_val[ep_val["success"]], 0.05)
    assert threshold == np.inf
    ep_test = detection.episode_scores(test, window)
    fail = ~ep_test["success"].to_numpy()
    assert detection.roc_auc(ep_test["score"][fail], ep_test["score"][~fail]) == 1.0
    alarms = detection.alarm_steps(test, threshold, window).set_index("rollout_id").loc[ep_test["rollout_id"]]
    assert (alarms["alarm_step"][fail] == 0).all() and alarms["alarm_step"][~fail].isna().all()
    episodes = pd.DataFrame({"success": ep_test["success"].to_numpy(), "steps": ep_test["steps"].to_numpy(),
                             "alarm_step": alarms["alarm_step"].to_numpy()})
    sheet = decision.worksheet(episodes, decision.CostModel(kappa=0.1))
    assert (sheet["d"], sheet["t_d"], sheet["f"]) == (1.0, 0.0, 0.0)
    # by hand: c = 0.1 / 25 per step. Never intervening, a success costs 25c = 0.1 and a failure 40c + 1
    # (a reset, then a fresh attempt): C_never = (30 * 0.1 + 6 * 1.16) / 30 = 0.332 per completed task.
    # Stopping each failure at step 0 costs the reset alone: (30 * 0.1 + 6 * 1) / 30 = 0.3, so the
    # excess is -0.032, in direct accounting and in the closed form
    assert sheet["C_never"] == pytest.approx(0.332)
    assert sheet["excess_direct"] == pytest.approx(-0.032) and sheet["excess_closed"] == pytest.approx(-0.032)
    # the other side: minus the leak ranks every failure last and never alarms on one
    flipped = test.assign(score=-test["score"])
    ep_flip = detection.episode_scores(flipped, window)
    assert detection.roc_auc(ep_flip["score"][fail], ep_flip["score"][~fail]) == 0.0
