"""check-policy: the policy checklist, run on the built-in testing policies and on policies that break it on purpose."""

import numpy as np
import pytest
from helpers import cli

from robocasa_shift.checks.policy_check import CHECKS, check_policy
from robocasa_shift.errors import PolicyOptionError
from robocasa_shift.policies import POLICIES
from robocasa_shift.policies.scripted.fake import FakeRandomPolicy


class IgnoresItsSeed(FakeRandomPolicy):
    def reset(self, seed):
        super().reset(0)  # every rollout draws the same numbers


class ForgetsItsStep(FakeRandomPolicy):
    """Carries a step counter between act calls that get_state leaves out."""

    def reset(self, seed):
        super().reset(seed)
        self.calls = 0

    def act(self, obs):
        self.calls += 1
        chunk = super().act(obs)
        chunk[0, 0] = min(1.0, 0.1 * self.calls)
        return chunk


class SamplesFromItsOwnGenerator(FakeRandomPolicy):
    def sample_actions(self, obs, n, rng):
        return np.stack([self.act(obs)[0] for _ in range(n)])  # moves the policy's generator


class SwallowsEveryOption(FakeRandomPolicy):
    def __init__(self, **options):
        super().__init__()


class WrongActionSize(FakeRandomPolicy):
    def act(self, obs):
        return np.zeros((2, 5))


class BatchDependsOnItsNeighbours(FakeRandomPolicy):
    @classmethod
    def act_batch(cls, policies, observations):
        return [p.act(o) * (1.0 + len(policies)) for p, o in zip(policies, observations)]


@pytest.fixture
def registered(monkeypatch):
    """Register a policy class for one test under its own name."""
    def add(cls):
        monkeypatch.setitem(POLICIES._entries, cls.__name__, cls)
        return cls.__name__
    return add


def failing(result):
    return sorted(check for check, r in result["checks"].items() if not r["passed"])


@pytest.mark.parametrize("policy", ["fake", "fake-expert", "fake-random"])
def test_the_testing_backend_s_policies_pass_every_check_of_the_checklist(policy):
    result = check_policy(policy, "fake", "PickPlace")
    assert result.passed, result.markdown
    assert sorted(result["checks"]) == sorted(CHECKS)
    assert result["offered"]["state"] == "offered"
    assert result["offered"]["samples"] == ("offered" if policy == "fake" else "not offered")


@pytest.mark.parametrize("cls,broken", [
    (IgnoresItsSeed, ["seeded_determinism"]),
    (ForgetsItsStep, ["state_roundtrip"]),
    (SamplesFromItsOwnGenerator, ["samples"]),
    (SwallowsEveryOption, ["options"]),
    (WrongActionSize, ["chunks"]),
    (BatchDependsOnItsNeighbours, ["batch"]),
])
def test_a_policy_that_breaks_the_checklist_fails_the_check_that_names_the_breach(registered, cls, broken):
    result = check_policy(registered(cls), "fake", "Reach")
    assert not result.passed and failing(result) == broken, result.markdown
    assert all(result["checks"][c]["problems"] for c in broken)


class Unbranchable(FakeRandomPolicy):
    state_refusal = "its generators live elsewhere"


def test_a_policy_that_cannot_be_branched_is_told_not_offered_with_its_reason(registered):
    result = check_policy(registered(Unbranchable), "fake", "Reach")
    assert result.passed and result["offered"]["state"] == "not offered"
    assert "its generators live elsewhere" in result["notes"]["state_roundtrip"]


def test_an_unknown_option_of_the_checked_policy_is_refused_before_anything_runs():
    with pytest.raises(PolicyOptionError, match="takes no option 'bogus'"):
        check_policy("fake", "fake", "Reach", {"bogus": 1})


def test_check_policy_command_prints_the_table_and_exits_0_when_it_passes_and_1_when_it_fails(tmp_path):
    out = cli("check-policy", "fake-random", "--backend", "fake", "--task", "Reach", "--out", str(tmp_path / "r.json"))
    assert "| state_roundtrip | ok |" in out.stdout and "PASSED" in out.stdout
    assert (tmp_path / "r.json").exists()
    out = cli("check-policy", "fake", "--backend", "fake", "--policy-option", "bogus=1", check=False)
    assert out.returncode == 2 and "takes no option 'bogus'" in out.stderr
