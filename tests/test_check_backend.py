"""check-backend: the backend contract, run on the built-in backends and on backends that break it on purpose."""

import numpy as np
import pytest

from robocasa_shift.backends import BACKENDS
from robocasa_shift.backends.fake import FakeBackend, FakeEnv
from robocasa_shift.checks.backend_check import CHECKS, check_backend
from helpers import cli


def break_fake(monkeypatch, env_class):
    """The fake backend with its environments replaced by ``env_class``, for this test only (its stage specs
    and predicates stay the fake's)."""
    backend = type(f"{env_class.__name__}Backend", (FakeBackend,),
                   {"make": lambda self, task, render_profile="fast", stock_simulator=False:
                    env_class(self.tasks[task], render_profile)})
    monkeypatch.setitem(BACKENDS._entries, "fake", backend)


def failing(result):
    return sorted(check for check, r in result["checks"].items() if not r["passed"])


def test_the_fake_backend_passes_every_check_of_the_contract():
    result = check_backend("fake")
    assert result.passed and sorted(result["checks"]) == sorted(CHECKS)
    # 12 of the matrix, 30 levels of the optional factors, the 3 predeclared combinations and the 12 levels of the
    # four dynamics factors the fake models
    assert result["tasks"]["Reach"]["conditions"] == 57


def test_check_backend_command_prints_the_table_and_exits_0_when_it_passes():
    out = cli("check-backend", "fake", "--task", "Reach")
    assert "| restore_nominal | ok |" in out.stdout and "PASSED" in out.stdout


class StateBlindFingerprint(FakeEnv):
    def fingerprint(self):
        return "same for every state"


class LeakyLights(FakeEnv):
    def restore_nominal(self):
        pass  # an illumination level stays for the next rollout


class NoisyRender(FakeEnv):
    def render(self, camera, size):
        frame = super().render(camera, size)
        frame[0, 0, 0] ^= np.uint8(self.steps + np.random.default_rng().integers(1, 255))
        return frame


class ClosingSuccessCheck(FakeEnv):
    def is_success(self):
        self.x[9] = 1.0  # reading success closes the gripper
        return super().is_success()


@pytest.mark.parametrize("env_class,broken", [
    (StateBlindFingerprint, ["fingerprint_stability", "reset_determinism"]),
    (LeakyLights, ["restore_nominal"]),
    (NoisyRender, ["render_determinism"]),
    (ClosingSuccessCheck, ["side_effect_free"]),
])
def test_a_backend_that_breaks_the_contract_fails_the_check_that_names_the_breach(monkeypatch, env_class, broken):
    break_fake(monkeypatch, env_class)
    result = check_backend("fake", ["Reach"])
    assert not result.passed and failing(result) == broken, result.markdown
    assert all(result["checks"][c]["problems"] for c in broken)


class WithoutCapabilities(FakeEnv):
    """The fake environment declaring no optional capability (a protocol method set to None is not offered)."""

    outcome_points = camera_frame = target_contact = contact_state = None


class ContactThatMovesTheObject(FakeEnv):
    def target_contact(self):
        self.x[5] += 0.01  # reading the event pushes the object
        return super().target_contact()


class ContactsOutOfRange(FakeEnv):
    def contact_state(self):
        return np.array([0, 0, 2, 1, 0])  # holding is a flag, not a count


class SkewedCameraFrame(FakeEnv):
    def camera_frame(self, camera):
        pos, rot, fovy = super().camera_frame(camera)
        return pos, 2.0 * rot, fovy


def test_check_backend_reports_each_capability_offered_or_not_offered():
    result = check_backend("fake", ["PickPlace"], episodes=(0,))
    assert result["tasks"]["PickPlace"]["capabilities"] == {"object_points": "offered", "task_events": "offered",
                                                            "contacts": "offered"}
    assert "Capabilities of PickPlace: object_points offered, task_events offered, contacts offered." in result.markdown


def test_a_backend_without_the_optional_capabilities_passes_and_is_told_they_are_not_offered(monkeypatch):
    break_fake(monkeypatch, WithoutCapabilities)
    result = check_backend("fake", ["PickPlace"], episodes=(0,))
    assert result.passed, result.markdown
    assert result["tasks"]["PickPlace"]["capabilities"] == {"object_points": "not offered",
                                                            "task_events": "not offered", "contacts": "not offered"}
    assert "object_points not offered, task_events not offered, contacts not offered" in result.markdown


@pytest.mark.parametrize("env_class,problem", [
    (ContactThatMovesTheObject, "reading a capability changed the state"),
    (SkewedCameraFrame, "camera_frame is not a position (3,) and a rotation (3, 3)"),
    (ContactsOutOfRange, "not 5 integers"),
])
def test_an_offered_capability_that_breaks_its_promise_fails_the_capabilities_check(monkeypatch, env_class, problem):
    break_fake(monkeypatch, env_class)
    result = check_backend("fake", ["PickPlace"], episodes=(0,))
    assert not result.passed and failing(result) == ["capabilities"], result.markdown
    assert any(problem in p for p in result["checks"]["capabilities"]["problems"])


def test_validate_stages_on_the_fake_backend_records_demos_with_its_own_demonstration_policy(tmp_path):
    out = cli("validate-stages", "--backend", "fake", "--task", "Reach", "--run-dir", str(tmp_path / "run"))
    assert "PASSED" in out.stdout
    assert len(list((tmp_path / "run" / "demos" / "Reach").glob("*.npz"))) >= 5


@pytest.mark.sim
def test_the_robosuite_backend_passes_every_check_of_the_contract():
    pytest.importorskip("robosuite")
    result = check_backend("robosuite", episodes=(0,))  # every condition on every task, one base episode
    assert result.passed, result.markdown
    assert set(result["tasks"]) == {"Lift", "Stack", "PickPlaceCan", "NutAssemblySquare"}


@pytest.mark.sim
def test_the_robosuite_environments_offer_object_points_and_target_contact_read_from_the_simulator():
    pytest.importorskip("robosuite")
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.backend import offered_capabilities

    backend = get_backend("robosuite")
    env = backend.make("Stack")
    try:
        env.reset(0)
        assert offered_capabilities(env) == ["object_points", "task_events", "contacts"]
        assert env.target_contact() is False  # the cubes start apart
        a, b = env.outcome_points(["cubeA", "cubeB", "no such point"])
        state = env.privileged_state()
        assert np.array_equal(a, state["cubeA_pos"]) and np.array_equal(b, state["cubeB_pos"])
        pos, rot, fovy = env.camera_frame(env.third_person_cameras[0])
        x, y, z = rot.T @ (a - pos)
        assert z < 0 and abs(x / -z) < np.tan(np.deg2rad(fovy) / 2) and abs(y / -z) < np.tan(np.deg2rad(fovy) / 2)
    finally:
        env.close()
    lift = backend.make("Lift")
    try:
        lift.reset(0)
        assert lift.target_contact() is None  # no target
    finally:
        lift.close()
