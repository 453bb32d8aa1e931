"""The optional `language` factor: paired, only the words change, audited; outside the 13-condition matrix."""

import json

import numpy as np
import pandas as pd
import pytest
from helpers import cli

from robocasa_shift import errors
from robocasa_shift.analysis.measures import analyze
from robocasa_shift.backends import get_backend
from robocasa_shift.checks.audit import audit_run
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import Observer, run_rollout
from robocasa_shift.policies import make_policy


def test_language_is_optional_and_outside_the_matrix(protocol):
    assert "language" in protocol.optional_factors
    assert len(protocol.conditions) == 13 and "language:L1" not in protocol.conditions
    assert protocol.known_conditions[:13] == protocol.conditions
    assert {"language:L1", "language:L2", "language:L3"} <= set(protocol.known_conditions)
    assert (protocol.condition("language:L3").factor, protocol.condition("language:L3").level) == ("language", "L3")
    with pytest.raises(errors.UnknownNameError, match="language:L1"):
        protocol.condition("language:L4")  # the message lists every valid condition


def test_an_optional_factor_defines_leading_levels_only(spec_copy):
    path = spec_copy / "language.yaml"
    path.write_text(path.read_text().replace("  L1: {min_distance: 0.0, max_distance: 0.5}\n", ""))  # L2, L3 only
    with pytest.raises(errors.SpecError, match="language.yaml: field 'levels'"):
        specs.load_protocol(spec_copy, verify=False)
    study = spec_copy / "study.yaml"
    study.write_text(study.read_text().replace("optional_factors: [camera_pose,", "optional_factors: [blur, camera_pose,"))
    with pytest.raises(errors.SpecError, match="study.yaml: field 'optional_factors'"):
        specs.load_protocol(spec_copy, verify=False)


class Instructions(Observer):
    """Keeps every instruction the policy was given (the observation it acts on)."""

    def __init__(self):
        self.seen = []

    def before_act(self, rollout, obs):
        self.seen.append(obs.instruction)


def test_the_policy_reads_the_paraphrase_and_nothing_else_changes(protocol):
    env = get_backend("fake").make("PickPlace")
    policy = make_policy("fake")
    stage_spec = specs.load_stage_spec("fake", "PickPlace")
    runs = {}
    for condition in ("clean", "language:L1"):
        seen = Instructions()
        record = run_rollout(env, policy, RolloutKey("formal", "PickPlace", 3, condition), protocol, stage_spec,
                             "fake", observer=seen, horizon=20)
        assert record.valid, record.error
        runs[condition] = (record, seen.seen)
    (clean, clean_seen), (lang, lang_seen) = runs["clean"], runs["language:L1"]
    assert set(clean_seen) == {"put the red object on the green target"}
    # L1: a paraphrase within word edit distance 0.5 of the instruction (two of the fake task's four)
    assert len(set(lang_seen)) == 1 and lang_seen[0] in {"put the red object on top of the green target",
                                                          "put the red object onto the green target"}
    assert lang.env_fingerprint == clean.env_fingerprint
    assert lang.policy_rng_fingerprint == clean.policy_rng_fingerprint
    measured = lang.perturbation["measured"]
    assert measured["instruction"] == lang_seen[0] and measured["clean_instruction"] == clean_seen[0]
    assert 0 < measured["distance"] <= 0.5 and measured["in_band"] == 2
    assert lang.perturbation["ok"] and lang.perturbation["applied"] == {"changed": 1.0, "distance": measured["distance"]}


@pytest.fixture(scope="module")
def language_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("language") / "run"
    cli("run", "--backend", "fake", "--task", "Reach,PickPlace", "--condition", "clean,language:L1", "--episodes",
        "0-2", "--policy", "fake-expert", "--workers", "1", "--no-progress", "--run-dir", str(run_dir))
    return run_dir


def test_a_language_run_audits_clean_and_a_forged_instruction_is_named(language_run, tmp_path):
    assert audit_run(language_run)["passed"]
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(language_run, run_dir)
    path = run_dir / "records" / "formal" / "Reach" / "0001__language-L1__r0.json"
    rec = json.loads(path.read_text())
    rec["perturbation"]["measured"]["instruction"] = rec["perturbation"]["measured"]["clean_instruction"]
    path.write_text(json.dumps(rec))
    report = audit_run(run_dir)
    assert not report["passed"]
    failing = {name: c["rollouts"] for name, c in report["tasks"]["Reach"]["checks"].items() if c["count"]}
    (named,) = failing["invalid_perturbation_records"]
    assert list(failing) == ["invalid_perturbation_records"] and named.startswith("formal/Reach/0001/language:L1/r0")
    assert "the task's own instruction" in named and "sha256" in named


def test_a_backend_without_paraphrases_is_refused_before_anything_runs(tmp_path):
    proc = cli("run", "--task", "Lift", "--condition", "language:L1", "--episodes", "0", "--policy", "expert",
               "--no-progress", "--run-dir", str(tmp_path / "run"), check=False)
    assert proc.returncode != 0
    assert "backend 'robosuite' cannot run factor 'language'" in proc.stderr + proc.stdout
    assert "instruction_paraphrases" in proc.stderr + proc.stdout
    assert not (tmp_path / "run" / "records").exists() or not any((tmp_path / "run" / "records").rglob("*.json"))


def test_scene_variants_are_compared_unpaired():
    """Hand-made: the variant's clean rollouts are resampled apart from the original's, never as pairs."""
    rows = []
    for task, successes in (("spatial-0", [1, 1, 1, 0]), ("spatial_swap-0", [1, 0, 0])):
        for episode, s in enumerate(successes):
            rows.append(dict(phase="formal", task=task, episode=episode, condition="clean", replicate=0, valid=True,
                             success=bool(s), n_stages=2, stages_completed=2 if s else 1,
                             first_incomplete=None if s else 2, env_fingerprint=f"{task}{episode}",
                             policy_rng_fingerprint="p", spec_hash="h", stage_spec_hash="s", backend="libero",
                             policy="expert"))
    summary = analyze(pd.DataFrame(rows), n_boot=2000, variant_of={"spatial_swap-0": "spatial-0"})
    (row,) = summary["unpaired_variants"]
    assert row["pairing"] == "UNPAIRED" and (row["n_variant"], row["n_original"]) == (3, 4)
    assert row["difference"] == pytest.approx(1 / 3 - 3 / 4)
    low, high = row["ci95"]
    assert low < row["difference"] < high and high - low > 0.3  # two small independent samples: a wide interval
    assert analyze(pd.DataFrame(rows), n_boot=10)["unpaired_variants"] == []
    assert np.isfinite(low)
