"""The ``dynamics`` family: how the world and the robot respond, frozen and paired.

Six kinds scale a physical quantity of the simulator's model by a level's ``scale`` (computed from the nominal
values the environment restored at reset, so levels never stack):

- ``joint_friction``: the arm joints' dry friction (MuJoCo ``dof_frictionloss``), multiplied;
- ``joint_damping``: the arm joints' viscous damping (``dof_damping``), multiplied;
- ``actuator_gain``: the arm actuators' gain (``gainprm[0]``; a position actuator's bias ``biasprm[1:3]`` with it),
  scaled down: a torque-controlled arm delivers that fraction of every commanded torque;
- ``gripper_force``: the gripper actuators' force limit (``forcerange``), scaled down;
- ``object_mass``: the mass and rotational inertia of the task's manipulated objects (uniformly denser);
- ``object_friction``: the sliding friction of the manipulated objects' collision geoms, which then take contact
  priority (MuJoCo otherwise uses the larger of two touching geoms' frictions, so the fingers' would hide it).

The manipulated objects are the ``object`` arguments of the task's stage spec (``stage_objects``), resolved by the
backend to its bodies; a factor never guesses a name. The environment offers the ``dynamics`` hook
(``core/backend.py``): per quantity, the elements it scales and their values, nominal and now; a backend that cannot
scale a quantity does not list it (``DYNAMICS_QUANTITIES``) and is refused that factor by name before a study starts.

``execution_noise`` is the seventh: Gaussian noise of the level's ``sigma`` on the arm's continuous commands of every
action the policy returns, clipped to the action space (RESCUE's weakened policy; the branch studies' ``--sigma``
uses the same :class:`ExecutionNoise`). Its generator is seeded by the factor's own draw, shared by the levels, so
the levels of a base episode scale the same standard-normal sequence.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from robocasa_shift.core.factors import FACTOR_KINDS, READBACK_ATOL, FactorKind, _never_rejected, max_abs_difference
from robocasa_shift.core.loop_wrappers import LoopWrapper
from robocasa_shift.errors import PerturbationError

FAMILY = "dynamics"  # core.shifts.FAMILIES describes it

# quantity -> what it is (the hook's names; the units are MuJoCo's)
QUANTITIES: Dict[str, str] = {
    "joint_friction": "the arm joints' dry friction (dof_frictionloss, N m)",
    "joint_damping": "the arm joints' viscous damping (dof_damping, N m s / rad)",
    "actuator_gain": "the arm actuators' gain (gainprm[0]; with biasprm[1:3] where position-controlled)",
    "gripper_force": "the gripper actuators' force limits (forcerange, N)",
    "object_mass": "the manipulated objects' body masses (kg) and inertias (kg m^2)",
    "object_friction": "the manipulated objects' collision geoms' sliding friction, with contact priority",
}


def stage_objects(stage_spec) -> List[str]:
    """The task's manipulated objects: every subgoal's ``object`` argument, in order of first appearance."""
    out: List[str] = []
    for subgoal in stage_spec.subgoals:
        name = (subgoal.args or {}).get("object")
        if isinstance(name, str) and name not in out:
            out.append(name)
    return out


class ModelScale(FactorKind):
    """A quantity of the model (``quantity``) scaled by the level's ``scale`` from its nominal values.

    Applied after the pre-perturbation fingerprint: every element the backend lists for the quantity is set to
    ``scale`` x its nominal values and read back from the model; ``measured`` keeps the nominal values, which the
    audit checks the asked values against (``scale`` x nominal, element by element, the same elements).
    """

    family = FAMILY
    level_params = ("scale",)
    quantity = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.requires = (f"dynamics:{cls.quantity}",)  # the hook, and the quantity it must offer

    def apply(self, env, params, draw):
        nominal = {k: np.asarray(v, dtype=float) for k, v in env.nominal_dynamics(self.quantity).items()}
        if not nominal:
            raise PerturbationError(f"task '{env.task.name}' has nothing to scale for {self.quantity} "
                                    f"({QUANTITIES[self.quantity]})")
        expected = {k: (v * float(params["scale"])).tolist() for k, v in nominal.items()}
        env.set_dynamics(self.quantity, expected)
        return {"applied": self.readback(env), "expected": expected,
                "measured": {"quantity": self.quantity, "nominal": {k: v.tolist() for k, v in nominal.items()}}}

    def readback(self, env):
        return {k: np.asarray(v, dtype=float).tolist() for k, v in env.dynamics(self.quantity).items()}

    def audit(self, spec, level, draw, perturbation, context):
        """The asked values are the level's scale times the recorded nominal values, for the same elements."""
        measured = perturbation.get("measured") if isinstance(perturbation.get("measured"), dict) else {}
        nominal, expected = measured.get("nominal"), perturbation.get("expected")
        if measured.get("quantity") != self.quantity or not isinstance(nominal, dict) or not nominal:
            return [f"no nominal {self.quantity} recorded"]
        if not isinstance(expected, dict) or sorted(expected) != sorted(nominal):
            return [f"the scaled elements {sorted(expected or {})} are not the nominal ones {sorted(nominal)}"]
        scale = float(spec.level(level)["scale"])
        try:
            want = {k: (np.asarray(v, dtype=float) * scale).tolist() for k, v in nominal.items()}
        except (TypeError, ValueError):
            return [f"recorded nominal {self.quantity} is not numeric"]
        if not max_abs_difference(expected, want) <= READBACK_ATOL:
            return [f"asked {self.quantity} is not {scale:g} x the nominal values"]
        return []

    def calibration_intended(self, spec, level, view):
        """The scaled values read back as asked (nothing a camera shows changes)."""
        return bool(view.readback_ok) and view.third_person_change == 0.0 and view.wrist_identical


@FACTOR_KINDS.register("joint_friction")
class JointFriction(ModelScale):
    quantity = "joint_friction"


@FACTOR_KINDS.register("joint_damping")
class JointDamping(ModelScale):
    quantity = "joint_damping"


@FACTOR_KINDS.register("actuator_gain")
class ActuatorGain(ModelScale):
    quantity = "actuator_gain"


@FACTOR_KINDS.register("gripper_force")
class GripperForce(ModelScale):
    quantity = "gripper_force"


@FACTOR_KINDS.register("object_mass")
class ObjectMass(ModelScale):
    quantity = "object_mass"


@FACTOR_KINDS.register("object_friction")
class ObjectFriction(ModelScale):
    quantity = "object_friction"


# --------------------------------------------------------------------------- execution noise


class ExecutionNoise:
    """Seeded Gaussian noise on the arm's continuous commands of each chunk the policy returns, clipped to [-1, 1]
    (the action space); never on the gripper. Draws ``len(chunk) x len(dims)`` standard normals per chunk, so the
    noise of the n-th executed action does not depend on how the policy chunks its actions.

    Keeps what it did: how many actions it noised, how many commands the clip cut, and a hash of the noise it added
    (before the clip), which the audit recomputes from the seed.
    """

    def __init__(self, seed: int, sigma: float, dims: Sequence[int]):
        self.rng = np.random.default_rng(int(seed))
        self.sigma, self.dims = float(sigma), list(dims)
        self.actions = 0
        self.clipped = 0
        self._hash = hashlib.sha256()

    def __call__(self, chunk: np.ndarray) -> np.ndarray:
        chunk = np.array(chunk, dtype=np.float64)
        if chunk.ndim == 1:
            chunk = chunk[None]
        noise = self.sigma * self.rng.standard_normal((len(chunk), len(self.dims)))
        noisy = chunk[:, self.dims] + noise
        chunk[:, self.dims] = np.clip(noisy, -1.0, 1.0)
        self.actions += len(chunk)
        self.clipped += int(np.count_nonzero(np.abs(noisy) > 1.0))
        self._hash.update(np.ascontiguousarray(noise).tobytes())
        return chunk

    def measured(self) -> Dict[str, Any]:
        return {"sigma": self.sigma, "dims": list(self.dims), "actions": self.actions, "clipped": self.clipped,
                "noise_sha256": self._hash.hexdigest()}

    @staticmethod
    def noise_hash(seed: int, sigma: float, n_dims: int, actions: int) -> str:
        """The hash of the noise ``actions`` actions drew from ``seed`` (in one block: the stream is the same)."""
        noise = float(sigma) * np.random.default_rng(int(seed)).standard_normal((int(actions), int(n_dims)))
        return hashlib.sha256(np.ascontiguousarray(noise).tobytes()).hexdigest()


class NoisyExecution(LoopWrapper):
    """The loop-side wrapper of ``execution_noise``: every chunk the policy returns passes through an
    :class:`ExecutionNoise` on the embodiment's arm commands; ``measured`` gets what it added."""

    def __init__(self, sigma: float, seed: int):
        self.sigma, self.seed, self.noise = float(sigma), int(seed), None
        self.measured: Dict[str, Any] = {"sigma": self.sigma}

    def start(self, rollout, capture):
        self.noise = ExecutionNoise(self.seed, self.sigma, rollout.env.action_layout.arm_continuous)

    def chunk(self, rollout, chunk):
        return self.noise(chunk)

    def finish(self, rollout):
        if self.noise is not None:
            self.measured.update(self.noise.measured())


@FACTOR_KINDS.register("execution_noise")
class ExecutionNoiseKind(FactorKind):
    """Gaussian noise of ``sigma`` on the executed arm commands (:class:`ExecutionNoise`), from a seed drawn once per
    base episode from the factor's stream and shared by the levels. A loop-side factor (:class:`NoisyExecution`): the
    simulator and the images are untouched; the loop records what it added, which the audit recomputes."""

    side = "loop"
    family = FAMILY
    draw_kind = "seed"
    level_params = ("sigma",)

    def draw(self, spec, rng, env=None):
        return {"draw": [int(rng.integers(0, 2 ** 32))], "draws_rejected": 0}  # exact as a float

    def replay_draw(self, spec, rng, draws_rejected):
        _never_rejected(draws_rejected)
        return self.draw(spec, rng)["draw"]

    def apply(self, env, params, draw):
        value = {"sigma": float(params["sigma"])}
        return {"applied": dict(value), "expected": dict(value)}

    def readback(self, env):
        return {}

    def loop_wrapper(self, params, draw=None):
        sigma = float(params["sigma"])
        if not sigma > 0:
            raise PerturbationError(f"execution noise needs sigma > 0, got {sigma}")
        if not draw:
            raise PerturbationError("execution noise needs its episode's draw (the noise seed)")
        return NoisyExecution(sigma, int(draw[0]))

    def audit(self, spec, level, draw, perturbation, context):
        """The noise the loop added is the level's sigma times the seed stream's standard normals."""
        measured = perturbation.get("measured") if isinstance(perturbation.get("measured"), dict) else {}
        sigma = float(spec.level(level)["sigma"])
        actions, dims = measured.get("actions"), measured.get("dims")
        if not isinstance(actions, int) or isinstance(actions, bool) or actions < 0 or not isinstance(dims, list):
            return ["no record of the execution noise the loop added"]
        problems = []
        if measured.get("sigma") != sigma:
            problems.append(f"the loop added noise of sigma {measured.get('sigma')!r}, not the frozen {sigma:g}")
        if draw is not None and measured.get("noise_sha256") != ExecutionNoise.noise_hash(draw[0], sigma, len(dims),
                                                                                           actions):
            problems.append("the noise added is not the level's sigma times the seed stream's draws")
        return problems


def dynamics_readout(env, quantity: str) -> Dict[str, Any]:
    """A physical read-out of a quantity as the model holds it now (the calibration sheet's): the mean over its
    elements of each value's first entry (friction, damping, gain, force limit, body mass, friction), companions left
    out."""
    # an element's companions (a body's inertia beside its mass, an actuator's bias beside its gain) scale with it
    values = {k: v for k, v in env.dynamics(quantity).items() if not k.endswith((".inertia", ".bias"))}
    firsts = [float(np.abs(np.asarray(v, dtype=float).reshape(-1)[0])) for v in values.values()]
    return {"quantity": quantity, "elements": len(values), "mean": float(np.mean(firsts)) if firsts else None}


__all__ = ["ActuatorGain", "ExecutionNoise", "ExecutionNoiseKind", "FAMILY", "GripperForce", "JointDamping",
           "JointFriction", "ModelScale", "NoisyExecution", "ObjectFriction", "ObjectMass", "QUANTITIES", "dynamics_readout",
           "stage_objects"]
