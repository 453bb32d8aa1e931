"""The testing backend's policies: ``fake`` (image-driven, stochastic), ``fake-expert`` (privileged,
scripted, deterministic) and ``fake-random`` (a negative control).

They act in the fake world (``backends/fake.py``; its robot in ``embodiments/fake_planar.py``) and
exist, like it, to test the harness's bookkeeping in milliseconds: their numbers say nothing about robots.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from robocasa_shift.core.policy import (
    NumpySeededPolicy,
    Observation,
    Policy,
    pack_arrays,
    unpack_arrays,
)
from robocasa_shift.embodiments.fake_planar import (
    ACTION_DIM,
    CAMERAS,
    CLOSE,
    MAX_STEP_M,
    OPEN,
    THIRD_PERSON_CAMERAS,
    camera_mounts,
    rot_z,
)
from robocasa_shift.errors import PolicyServerError
from robocasa_shift.geometry import quat_to_mat


def _velocity(delta_m: np.ndarray) -> np.ndarray:
    """The action (in [-1, 1] per axis) that moves the gripper by ``delta_m``, saturating at one step."""
    return np.clip(np.asarray(delta_m) / MAX_STEP_M, -1.0, 1.0)


def camera_to_table(pixel_rc: np.ndarray, size: int, camera: str = THIRD_PERSON_CAMERAS[0]) -> np.ndarray:
    """Base-frame table point seen at (row, col) of a ``size`` image of the NOMINAL camera.

    The image-driven policy assumes its camera is where it was calibrated: a rotated
    camera biases its estimate, as it would a real policy's.
    """
    model = camera_mounts()
    i = CAMERAS.index(camera)
    t = np.tan(np.deg2rad(model["cam_fovy"][i]) / 2)
    r, c = pixel_rc
    ray = np.array([((c + 0.5) / size * 2 - 1) * t, -((r + 0.5) / size * 2 - 1) * t, -1.0])
    d = quat_to_mat(model["cam_quat"][i]) @ ray
    pos = model["cam_pos"][i]
    return pos[:2] - pos[2] / d[2] * d[:2]


def find_colour(image: np.ndarray, channel: int, ratio: float = 1.6, floor: float = 40.0) -> Optional[np.ndarray]:
    """Centroid (row, col) of the pixels where ``channel`` dominates the other two by ``ratio``; None if none."""
    im = image.astype(np.float64)
    others = np.delete(im, channel, axis=-1)
    mask = (im[..., channel] > floor) & (im[..., channel] > ratio * others.max(axis=-1))
    if not mask.any():
        return None
    rows, cols = np.nonzero(mask)
    return np.array([rows.mean(), cols.mean()])


class FakePolicy(NumpySeededPolicy):
    """Image-driven: finds the red object (and the green target) in the third-person image.

    It locates the object by colour in the image, back-projects it through the
    nominal camera, moves the gripper (known from proprioception) there with
    seeded Gaussian action noise, grasps, carries and releases. A rotated camera
    biases its estimates; heavy blur or darkness hides the object from it (it
    then wanders, seeded). Randomness: one numpy Generator seeded by ``reset``.
    """

    name = "fake"
    camera_roles = ("third_person",)
    image_size = 64
    chunk = 2  # actions per decision, executed open loop

    def __init__(self, action_noise: float = 0.15, act_delay_s: float = 0.0, crash_on_seed: Optional[int] = None,
                 hang_on_seed: Optional[int] = None, server_down_while: Optional[str] = None,
                 api_token: Optional[str] = None):
        """
        Args:
            action_noise: standard deviation of the seeded noise added to each action component.
            act_delay_s: wall time each decision takes, to emulate a slow model (tests that kill
                a run half-way need rollouts that last); it changes no record.
            crash_on_seed, hang_on_seed, server_down_while: fault injection for the harness's tests,
                none of them in the identity: the process running the policy kills itself with
                SIGKILL (a segfault or an OOM kill, as the executor sees it) or hangs when reset with
                this policy seed; every decision raises ``PolicyServerError`` while the file
                ``server_down_while`` exists (a policy server that went away and comes back).
            api_token: a credential, as a remote policy takes one, for tests of how secrets are
                handled; kept, never used, never in the identity.
        """
        super().__init__()
        self.action_noise = float(action_noise)
        self.act_delay_s = float(act_delay_s)
        self.crash_on_seed, self.hang_on_seed, self.server_down_while = crash_on_seed, hang_on_seed, server_down_while
        self.api_token = api_token
        self._memory: Dict[str, np.ndarray] = {}

    def reset(self, seed: int) -> None:
        if seed == self.crash_on_seed:
            os.kill(os.getpid(), signal.SIGKILL)
        if seed == self.hang_on_seed:
            time.sleep(24 * 3600)
        super().reset(seed)
        self._memory = {}

    def get_state(self) -> Dict[str, np.ndarray]:
        """The generator and the remembered object and target positions."""
        return {**super().get_state(), **pack_arrays("memory", self._memory)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        super().set_state(state)
        self._memory = unpack_arrays("memory", state)

    def _locate(self, obs: Observation, name: str, channel: int) -> Optional[np.ndarray]:
        image = next(im for cam, im in obs.images.items() if obs.camera_roles[cam] == "third_person")
        pixel = find_colour(image, channel)
        if pixel is not None:
            self._memory[name] = camera_to_table(pixel, image.shape[0])
        return self._memory.get(name)

    def act(self, obs: Observation) -> np.ndarray:
        if self.act_delay_s > 0:
            time.sleep(self.act_delay_s)
        if self.server_down_while and os.path.exists(self.server_down_while):
            raise PolicyServerError(f"the fake policy server is down while {self.server_down_while} exists")
        return self._decide(obs, self.rng)

    def sample_actions(self, obs: Observation, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draws of this decision's first action with the noise drawn from ``rng``; state restored."""
        saved = self.get_state()
        try:
            draws = []
            for _ in range(n):
                self.set_state(saved)
                draws.append(self._decide(obs, rng)[0])
        finally:
            self.set_state(saved)
        return np.array(draws)

    def features(self, obs: Observation) -> np.ndarray:
        """A hidden state for probes (tests of hidden-state monitors), in the sets of :meth:`feature_blocks`: the
        third-person image's mean brightness, then where the green target and the red object show in it (row,
        column as fractions; -1 when not seen) and how many pixels of each. Reads only ``obs``; no generator,
        no state."""
        image = next(im for cam, im in obs.images.items() if obs.camera_roles[cam] == "third_person")
        size = float(image.shape[0])
        out = [float(image.mean() / 255.0)]
        for channel in (1, 0):
            pixel = find_colour(image, channel)
            out += [-1.0, -1.0] if pixel is None else list(pixel / size)
            im = image.astype(np.float64)
            others = np.delete(im, channel, axis=-1)
            out.append(float(((im[..., channel] > 40.0) & (im[..., channel] > 1.6 * others.max(axis=-1))).mean()))
        return np.asarray(out, dtype=np.float32)

    def feature_blocks(self) -> List[Tuple[str, int]]:
        """The sets of :meth:`features`, the base last: the brightness, the green target's three numbers, the red
        object's (what the policy acts on)."""
        return [("image", 1), ("target", 3), ("object", 3)]

    def _decide(self, obs: Observation, rng: np.random.Generator) -> np.ndarray:
        eef = obs.proprio["eef_pos"]
        grasping = bool(obs.proprio["grasping"][0])
        obj = self._locate(obs, "object", 0)
        target = None
        if obs.task == "PickPlace":
            # the carried object hides part of the target: keep the estimate made before the grasp
            target = self._memory.get("target") if grasping else self._locate(obs, "target", 1)
        grip = OPEN
        if obj is None:
            goal = eef + rng.uniform(-0.08, 0.08, 2)  # nothing seen: look around
        elif target is None:
            goal = obj
        elif not grasping:
            goal = obj
            grip = CLOSE if np.linalg.norm(obj - eef) < 0.012 else OPEN
        else:
            goal = target
            grip = OPEN if np.linalg.norm(target - eef) < 0.012 else CLOSE
        chunk = np.zeros((self.chunk, ACTION_DIM))
        planned = np.array(eef, dtype=float)
        for a in chunk:  # each action moves toward the goal from where the previous one should have ended
            a[:2] = np.clip(_velocity(goal - planned) + rng.normal(0.0, self.action_noise, 2), -1.0, 1.0)
            a[2] = grip
            planned = planned + MAX_STEP_M * _velocity(goal - planned)
        return chunk

    def identity(self) -> Dict[str, Any]:
        return {"name": self.name, "action_noise": self.action_noise, "act_delay_s": self.act_delay_s, "testing": True}


class FakeExpertPolicy(Policy):
    """Privileged and scripted: reads the object and target from the simulator state. Deterministic."""

    name = "fake-expert"
    privileged = True

    def get_state(self) -> Dict[str, np.ndarray]:
        """Nothing: each action is a function of the observation alone."""
        return {}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        pass

    def act(self, obs: Observation) -> np.ndarray:
        s = obs.privileged
        rot = rot_z(s["base_pose"][2])[:2, :2]
        eef, obj, target = s["eef_pos"], s["object_pos"], s["target_pos"]
        action = np.zeros(ACTION_DIM)
        if obs.task == "Reach":
            goal, grip = obj, OPEN
        elif not s["holding"][0]:
            close = np.linalg.norm(obj - eef) < 0.005
            goal, grip = obj, CLOSE if close else OPEN
        else:
            goal = target
            grip = OPEN if np.linalg.norm(target - eef) < 0.005 else CLOSE
        action[:2] = _velocity(rot.T @ (goal - eef))  # the action is in the base frame
        action[2] = grip
        return action[None]


class FakeRandomPolicy(NumpySeededPolicy):
    """Uniform random gripper velocity and gripper command: a negative control."""

    name = "fake-random"

    def act(self, obs: Observation) -> np.ndarray:
        return np.concatenate([self.rng.uniform(-1.0, 1.0, 2), [self.rng.choice([OPEN, CLOSE])]])[None]


__all__ = ["FakeExpertPolicy", "FakePolicy", "FakeRandomPolicy", "camera_to_table", "find_colour"]
