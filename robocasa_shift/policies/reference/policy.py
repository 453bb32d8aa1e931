"""The ``reference`` policy: learned perception (small CNNs on camera images) + scripted control.

It stands in for a vision-language-action model in the embedded study:

- It reads only camera images, proprioception and the task's name
  (``obs.task``: its networks and plans are per task), never object state.
  A third-person network estimates object positions in the robot base frame
  for the coarse approach; a wrist network estimates the object relative to
  the gripper and closes the loop for the final approach, as VLAs
  effectively do. Estimates are refreshed at every observation.
- It acts in chunks of ``chunk`` control steps (one observation per chunk).
- It is stochastic the way VLAs are: Gaussian action noise and perception
  dropout (an estimate not refreshed) come from one torch Generator seeded
  only by ``reset(seed)``; its fingerprint is read back from that generator.
- ``blind=True`` feeds blank images (the ablation that shows how much of its
  success comes from perception).
- ``act_batch`` serves several rollouts with one network pass per camera; the
  networks' ``predict`` is batch-invariant, so batching never changes actions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.core.policy import Observation, Policy, pack_arrays, unpack_arrays
from robocasa_shift.embodiments.panda_omron import (
    ACTION_DIM,
    ARM_MODE,
    ARM_POS,
    ARM_YAW,
    CLOSE,
    GRIPPER,
    MODE,
    OPEN,
)
from robocasa_shift.errors import WeightsMissing
from robocasa_shift.extras import require
from robocasa_shift.geometry import quat_xyzw_to_mat, wrap
from robocasa_shift.policies.reference.perception import PERCEPTION, resize
from robocasa_shift.policies.reference.weights import MANIFEST, WEIGHTS_DIR
from robocasa_shift.policies.scripted.expert import YAW_GAIN, closing_axis_yaw
from robocasa_shift.seeding import rng_state_hash

# Monitor samples (sample_actions): each keypoint feature is dropped with this probability.
SAMPLE_DROPOUT = 0.1
# Approximate object sizes a VLA would know from experience (metres).
CUBE_A_HALF, CUBE_B_HALF = 0.021, 0.025


# Networks by (weights folder, net name), shared by every policy instance in the process.
_NETS: Dict[tuple, object] = {}


class ReferencePolicy(Policy):
    name = "reference"
    camera_roles = ("third_person", "wrist")
    image_size = 128
    deterministic = False
    requires = (("torch", "policy"),)

    def __init__(
        self,
        weights_dir: Optional[str] = None,
        blind: bool = False,
        chunk: int = 4,
        action_noise: float = 0.05,
        dropout: float = 0.1,
        gain: float = 7.0,
        wrist_gate: float = 0.04,
    ):
        self._torch = require("torch", "policy", "the reference policy")
        self.weights_dir = Path(weights_dir or WEIGHTS_DIR)
        path = self.weights_dir / MANIFEST
        if not path.exists():
            raise WeightsMissing(f"no reference weights at {path}; run `make train-reference`")
        self.manifest = json.loads(path.read_text())
        self.blind, self.chunk, self.action_noise, self.dropout, self.gain = blind, chunk, action_noise, dropout, gain
        self.wrist_gate = wrist_gate
        self.reset(0)

    # ------------------------------------------------------------------ seeding

    def reset(self, seed: int) -> None:
        self.generator = self._torch.Generator().manual_seed(int(seed) % (2**63))
        self._phase = 0
        self._steps_in_phase = 0
        self._memo: Dict[str, np.ndarray] = {}
        self._estimates: Dict[str, np.ndarray] = {}

    def rng_fingerprint(self) -> str:
        return rng_state_hash(self.generator.get_state().numpy())

    def get_state(self) -> Dict[str, np.ndarray]:
        """The generator, the phase, the memo and the (possibly stale) estimates.

        ``_eef``, ``_closing_yaw`` and ``_yaw_rate`` are set at the start of every decision
        before they are read, so they carry nothing between calls.
        """
        return {"generator": self.generator.get_state().numpy().copy(),
                "phase": np.asarray(self._phase, dtype=np.int64),
                "steps_in_phase": np.asarray(self._steps_in_phase, dtype=np.int64),
                **pack_arrays("memo", self._memo), **pack_arrays("estimates", self._estimates)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.generator.set_state(self._torch.from_numpy(np.array(state["generator"], dtype=np.uint8)))
        self._phase, self._steps_in_phase = int(state["phase"]), int(state["steps_in_phase"])
        self._memo, self._estimates = unpack_arrays("memo", state), unpack_arrays("estimates", state)

    def identity(self) -> Dict:
        return {
            "name": self.name,
            "weights_sha256": self.manifest["weights_sha256"],
            "blind": self.blind,
            "chunk": self.chunk,
            "action_noise": self.action_noise,
            "dropout": self.dropout,
            "gain": self.gain,
            "wrist_gate": self.wrist_gate,
        }

    # ------------------------------------------------------------------ perception

    def _net(self, key: str):
        """A network, loaded once per process and weights folder (policy instances share it)."""
        cache_key = (str(self.weights_dir), key)
        if cache_key not in _NETS:
            from robocasa_shift.policies.reference.nets import KeypointNet

            info = self.manifest["nets"][key]
            net = KeypointNet(info["n_out"])
            # weights_only: a weights file is data; never let one (from another weights_dir) run code
            net.load_state_dict(self._torch.load(self.weights_dir / info["file"], weights_only=True))
            net.eval()
            _NETS[cache_key] = net
        return _NETS[cache_key]

    def _task(self, obs: Observation) -> str:
        """``obs.task``, when the weights hold networks for it."""
        if obs.task not in self.manifest["tasks"]:
            raise ValueError(f"the reference policy has no networks for task {obs.task!r}; it has networks for: "
                             f"{', '.join(sorted(self.manifest['tasks']))}")
        return obs.task

    def _perceive(self, task: str, estimates: Dict[str, np.ndarray]) -> None:
        """Take in fresh network outputs; dropout keeps some old estimates (never the first ones)."""
        keep_old = self._torch.rand(len(estimates), generator=self.generator).numpy() < self.dropout
        for (key, value), stale in zip(sorted(estimates.items()), keep_old):
            if not (stale and key in self._estimates):
                self._estimates[key] = value

    @classmethod
    def act_batch(cls, policies: Sequence["ReferencePolicy"], observations: Sequence[Observation]) -> List[np.ndarray]:
        """One network pass per (task, camera) for the whole batch; each item keeps its own generator.

        ``KeypointNet.predict`` gives an image the same output in any batch, so batched and
        single calls give identical actions.
        """
        tasks = [p._task(obs) for p, obs in zip(policies, observations)]
        groups: Dict[tuple, List[int]] = {}
        for i, (p, task) in enumerate(zip(policies, tasks)):
            for role, camera in (("third_person", "third"), ("wrist", "wrist")):
                if PERCEPTION[task].third_points if camera == "third" else PERCEPTION[task].wrist_points:
                    groups.setdefault((str(p.weights_dir), task, role, camera), []).append(i)
        estimates: List[Dict[str, np.ndarray]] = [{} for _ in policies]
        for (_, task, role, camera), items in groups.items():
            images = np.stack([resize(policies[i]._image(observations[i], role)) for i in items])
            owner = policies[items[0]]
            out = owner._net(f"{task}_{camera}").predict(owner._torch.from_numpy(images)).numpy().astype(float)
            perception = PERCEPTION[task]
            points = perception.third_points if camera == "third" else perception.wrist_points
            for row, i in zip(out, items):
                estimates[i].update({f"{camera}.{p}": row[3 * k : 3 * k + 3] for k, p in enumerate(points)})
        return [p._act(task, obs, est) for p, task, obs, est in zip(policies, tasks, observations, estimates)]

    def sample_actions(self, obs: Observation, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draws of this decision with Monte Carlo dropout through the networks (monitor samples).

        Each draw drops every keypoint feature of every network with probability
        :data:`SAMPLE_DROPOUT` (masks from ``rng``), plans from those estimates as ``act``
        would, and returns the chunk's first action without action noise. The policy's state
        (generator, phase, memo, estimates) is restored afterwards, so the rollout is unchanged.
        """
        task = self._task(obs)
        perception = PERCEPTION[task]
        saved = self.get_state()
        draws: Dict[str, np.ndarray] = {}
        try:
            for role, camera, points in (("third_person", "third", perception.third_points),
                                         ("wrist", "wrist", perception.wrist_points)):
                if not points:
                    continue
                net = self._net(f"{task}_{camera}")
                width = net.head[0].in_features
                keep = self._torch.from_numpy((rng.random((n, width)) >= SAMPLE_DROPOUT).astype(np.float32))
                image = self._torch.from_numpy(resize(self._image(obs, role))[None])
                out = net.predict_with_dropout(image, keep, SAMPLE_DROPOUT).numpy().astype(float)
                draws.update({f"{camera}.{p}": out[:, 3 * k: 3 * k + 3] for k, p in enumerate(points)})
            actions = np.zeros((n, ACTION_DIM))
            eef = np.asarray(obs.proprio["robot0_base_to_eef_pos"], dtype=float)
            for i in range(n):
                self.set_state(saved)
                self._estimates.update({key: value[i] for key, value in draws.items()})
                self._eef = eef
                self._closing_yaw = closing_axis_yaw(obs.proprio["robot0_eef_quat"],
                                                     quat_xyzw_to_mat(obs.proprio["robot0_base_quat"]))
                self._yaw_rate = 0.0
                target, grip = getattr(self, f"_plan_{task}")(eef)
                actions[i, ARM_POS] = np.clip(self.gain * (target - eef), -1.0, 1.0)
                actions[i, ARM_YAW] = np.clip(self._yaw_rate, -1.0, 1.0)
                actions[i, GRIPPER], actions[i, MODE] = grip, ARM_MODE
        finally:
            self.set_state(saved)
        return actions

    def features(self, obs: Observation) -> np.ndarray:
        """Every layer of both networks for ``obs`` (the policy's hidden state, for probes), as float32.

        Layer by layer from the input side (:meth:`feature_blocks`: ``conv1``, ``conv2``, ``conv3``,
        ``keypoints``, ``hidden``; ``KeypointNet.layer_features``), each the third-person network's values
        then the wrist network's; a task without a network for a camera (PickPlaceCan has no third-person
        one) gets zeros there, so every task gives a vector of one length. No generator is drawn and no
        state changes.
        """
        task = self._task(obs)
        perception = PERCEPTION[task]
        layers: Dict[str, List[np.ndarray]] = {}
        for role, camera, points in (("third_person", "third", perception.third_points),
                                     ("wrist", "wrist", perception.wrist_points)):
            if points:
                image = self._torch.from_numpy(resize(self._image(obs, role))[None])
                values = {k: v.numpy()[0] for k, v in self._net(f"{task}_{camera}").layer_features(image).items()}
            else:
                values = {k: np.zeros(w) for k, w in self._net(f"{task}_wrist").layer_widths().items()}
            for name, value in values.items():
                layers.setdefault(name, []).append(value.astype(np.float32))
        return np.concatenate([block for name in layers for block in layers[name]])

    def feature_blocks(self) -> List[Tuple[str, int]]:
        """The layers :meth:`features` concatenates, input side first; ``hidden`` (the head's) is the base."""
        task = sorted(self.manifest["tasks"])[0]
        return [(name, 2 * width) for name, width in self._net(f"{task}_wrist").layer_widths().items()]

    def _image(self, obs: Observation, role: str) -> np.ndarray:
        image = next(obs.images[name] for name, r in obs.camera_roles.items() if r == role)
        return np.zeros_like(image) if self.blind else image

    # ------------------------------------------------------------------ control

    def act(self, obs: Observation) -> np.ndarray:
        return self.act_batch([self], [obs])[0]

    def _act(self, task: str, obs: Observation, estimates: Dict[str, np.ndarray]) -> np.ndarray:
        self._perceive(task, estimates)
        eef = np.asarray(obs.proprio["robot0_base_to_eef_pos"], dtype=float)
        self._eef = eef
        # heading of the fingers' closing axis in the base frame (the frame the arm is commanded in)
        self._closing_yaw = closing_axis_yaw(obs.proprio["robot0_eef_quat"], quat_xyzw_to_mat(obs.proprio["robot0_base_quat"]))
        self._yaw_rate = 0.0
        target, grip = getattr(self, f"_plan_{task}")(eef)
        self._steps_in_phase += self.chunk
        return self._chunk(eef, target, grip)

    def _chunk(self, eef: np.ndarray, target: np.ndarray, grip: float) -> np.ndarray:
        actions = np.zeros((self.chunk, ACTION_DIM))
        actions[:, ARM_POS] = np.clip(self.gain * (target - eef), -1.0, 1.0)
        actions[:, ARM_YAW] = np.clip(self._yaw_rate, -1.0, 1.0)
        noise = self._torch.randn((self.chunk, 3), generator=self.generator, dtype=self._torch.float64).numpy()
        actions[:, ARM_POS] = np.clip(actions[:, ARM_POS] + self.action_noise * noise, -1.0, 1.0)
        actions[:, GRIPPER] = grip
        actions[:, MODE] = ARM_MODE
        return actions

    def _advance(self, done: bool) -> None:
        if done:
            self._phase += 1
            self._steps_in_phase = 0

    def _release(self, eef: np.ndarray, first: bool, rise: float):
        """The last two phases: open the gripper where it is (8 steps), then rise ``rise`` metres."""
        if first:
            self._memo.setdefault("release_at", eef.copy())
            self._advance(self._steps_in_phase >= 8)
            return self._memo["release_at"], OPEN
        return self._memo["release_at"] + [0.0, 0.0, rise], OPEN

    def _wrist(self, point: str) -> np.ndarray:
        """The wrist estimate of ``point`` relative to the gripper, checked against the third-person one.

        The wrist network is precise near the poses it was trained on and can be far off elsewhere;
        followed blindly, one bad estimate walks the gripper away until the object leaves the view.
        When the two cameras disagree by more than ``wrist_gate`` horizontally, the third-person
        estimate wins.
        """
        rel = self._estimates[f"wrist.{point}"]
        third = self._estimates.get(f"third.{point}")
        if third is not None and np.linalg.norm((self._eef + rel - third)[:2]) > self.wrist_gate:
            return third - self._eef
        return rel

    def _third(self, point: str) -> np.ndarray:
        return self._estimates[f"third.{point}"]

    def _turn_fingers(self, heading: float) -> None:
        """Turn the gripper so its fingers close along ``heading`` (base frame; the gripper is symmetric)."""
        self._yaw_rate = YAW_GAIN * wrap(heading - self._closing_yaw, np.pi)

    def _grasp(self, eef: np.ndarray, coarse: np.ndarray, point: str, hover: float, avoid: Optional[np.ndarray] = None,
               across: Optional[np.ndarray] = None):
        """Phases 0-3: coarse approach, wrist alignment, descent, close. Returns (target, grip) or None.

        With ``avoid`` (another object's estimated position), the fingers turn to close across
        the line to it, so they do not land on it when the two stand close together; with
        ``across`` (a direction), they close across that direction (a handle).
        """
        p = self._phase
        if p <= 2 and (avoid is not None or across is not None):
            d = across if across is not None else avoid - coarse
            self._turn_fingers(np.arctan2(d[1], d[0]) + np.pi / 2)
        if p == 0:  # coarse: the third-person estimate (or a prior) gets the wrist camera over the object
            target = coarse + [0.0, 0.0, hover]
            err = target - eef
            self._advance(bool(np.linalg.norm(err[:2]) < 0.02 and abs(err[2]) < 0.03) or self._steps_in_phase > 120)
            return target, OPEN
        if p == 1:  # the wrist camera aligns the gripper above the object
            rel = self._wrist(point)
            target = eef + np.array([rel[0], rel[1], rel[2] + hover * 0.5])
            self._advance(bool(np.linalg.norm(rel[:2]) < 0.006) or self._steps_in_phase > 60)
            return target, OPEN
        if p == 2:  # descend onto it, still steering with the wrist estimate
            rel = self._wrist(point)
            target = eef + rel + [0.0, 0.0, -0.004]
            self._advance(bool(abs(rel[2]) < 0.008) or self._steps_in_phase > 40)
            return target, OPEN
        if p == 3:  # close
            self._memo.setdefault("grasp_at", eef.copy())
            self._advance(self._steps_in_phase >= 8)
            return self._memo["grasp_at"], CLOSE
        return None

    def _plan_Lift(self, eef):
        step = self._grasp(eef, self._third("cube"), "cube", hover=0.06)
        if step is not None:
            return step
        return self._memo["grasp_at"] + [0.0, 0.0, 0.2], CLOSE

    def _plan_Stack(self, eef):
        step = self._grasp(eef, self._third("cubeA"), "cubeA", hover=0.06, avoid=self._third("cubeB"))
        if step is not None:
            return step
        p = self._phase - 4
        held = self._wrist("cubeA")  # cubeA relative to the gripper while held
        stack_z = CUBE_A_HALF + CUBE_B_HALF + 0.006
        if p == 0:  # lift
            target = self._memo["grasp_at"] + [0.0, 0.0, 0.12]
            self._advance(abs(target[2] - eef[2]) < 0.02 or self._steps_in_phase > 40)
            return target, CLOSE
        if p == 1:  # carry over cubeB (third-person estimate)
            goal = self._third("cubeB") - held + [0.0, 0.0, stack_z + 0.06]
            err = goal - eef
            self._advance(bool(np.linalg.norm(err[:2]) < 0.015 and abs(err[2]) < 0.03) or self._steps_in_phase > 100)
            return goal, CLOSE
        if p == 2:  # wrist alignment of cubeA over cubeB, then lower
            rel = self._wrist("cubeB") - held
            target = eef + np.array([rel[0], rel[1], rel[2] + stack_z + 0.03])
            self._advance(bool(np.linalg.norm(rel[:2]) < 0.005) or self._steps_in_phase > 60)
            return target, CLOSE
        if p == 3:
            rel = self._wrist("cubeB") - held
            target = eef + np.array([rel[0], rel[1], rel[2] + stack_z])
            self._advance(bool(abs(rel[2] + stack_z) < 0.006) or self._steps_in_phase > 40)
            return target, CLOSE
        return self._release(eef, first=p == 4, rise=0.1)

    def _plan_PickPlaceCan(self, eef):
        priors = self.manifest["tasks"]["PickPlaceCan"]["priors"]
        step = self._grasp(eef, np.asarray(priors["can"]), "can", hover=0.2)
        if step is not None:
            return step
        p = self._phase - 4
        bin_target = np.asarray(priors["bin"])
        if p == 0:
            target = self._memo["grasp_at"] + [0.0, 0.0, 0.25]
            self._advance(abs(target[2] - eef[2]) < 0.03 or self._steps_in_phase > 60)
            return target, CLOSE
        if p == 1:  # carry high over the target bin (a learned prior: the bin never moves in training)
            target = bin_target + [0.0, 0.0, 0.30]
            err = target - eef
            self._advance(bool(np.linalg.norm(err[:2]) < 0.02) or self._steps_in_phase > 100)
            return target, CLOSE
        if p == 2:
            target = bin_target + [0.0, 0.0, 0.12]
            self._advance(abs(target[2] - eef[2]) < 0.02 or self._steps_in_phase > 60)
            return target, CLOSE
        return self._release(eef, first=p == 3, rise=0.12)

    def _plan_NutAssemblySquare(self, eef):
        handle_dir = self._third("nut_handle") - self._third("nut")
        if self._phase == 1:  # closer: the wrist view of the handle is sharper
            handle_dir = self._wrist("nut_handle") - self._wrist("nut")
        step = self._grasp(eef, self._third("nut_handle"), "nut_handle", hover=0.06, across=handle_dir)
        if step is not None:
            return step
        p = self._phase - 4
        held = self._wrist("nut")  # the nut's centre relative to the gripper while held
        heading = np.arctan2(*(self._wrist("nut_handle") - held)[1::-1])
        # the square hole fits the peg when the nut's yaw (its handle's heading) is a multiple of 90 degrees
        self._yaw_rate = -YAW_GAIN * wrap(heading, np.pi / 2) if p in (1, 2) else 0.0
        peg = self._third("peg")
        if p == 0:
            target = self._memo["grasp_at"] + [0.0, 0.0, 0.15]
            self._advance(abs(target[2] - eef[2]) < 0.02 or self._steps_in_phase > 40)
            return target, CLOSE
        if p == 1:  # carry the nut's centre over the peg, squaring it up
            target = peg - held + [0.0, 0.0, 0.15]
            err = target - eef
            square = abs(wrap(heading, np.pi / 2)) < np.deg2rad(3)
            self._advance(bool(np.linalg.norm(err[:2]) < 0.01 and square) or self._steps_in_phase > 120)
            return target, CLOSE
        if p == 2:  # lower it onto the peg
            target = peg - held + [0.0, 0.0, -0.01]
            self._advance(abs(target[2] - eef[2]) < 0.01 or self._steps_in_phase > 60)
            return target, CLOSE
        return self._release(eef, first=p == 3, rise=0.12)


class BlindReferencePolicy(ReferencePolicy):
    """The reference policy fed blank images: how far scripted control and priors get without perception."""

    name = "reference-blind"

    def __init__(self, **options):
        super().__init__(**{**options, "blind": True})
