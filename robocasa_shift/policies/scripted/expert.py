"""Built-in policies without learned parts: ``expert`` (privileged, scripted) and ``random``.

The expert's kitchen plans (robocasa backend) are in :mod:`robocasa_shift.policies.scripted.kitchen`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional

import numpy as np

from robocasa_shift.core.policy import (
    NumpySeededPolicy,
    Observation,
    Policy,
    pack_arrays,
    unpack_arrays,
)
from robocasa_shift.embodiments.panda_omron import (
    CLOSE,
    LAYOUT,
    OPEN,
)
from robocasa_shift.geometry import quat_xyzw_to_mat, wrap
from robocasa_shift.policies.scripted.kitchen import kitchen_plans

# The building blocks live in scripted/phases.py (the kitchen plans share them); imported here for existing callers.
from robocasa_shift.policies.scripted.phases import (
    YAW_GAIN,
    Phase,
    after,
    arm_action,
    base_action,
    closing_axis_yaw,
    reached,
    yaw_of_wxyz,
)


class ExpertPolicy(Policy):
    """Scripted from privileged simulator state; provides demonstrations. Deterministic.

    Each task is a list of phases (approach, descend, close, lift, carry, place,
    release, retreat); a phase's target is recomputed from the live object
    poses at every step.
    """

    name = "expert"
    privileged = True

    def __init__(self):
        self._plans: Dict[str, List[Phase]] = {
            "Lift": self._pick("cube", lift_to=0.25, retreat=False),
            "Stack": self._pick("cubeA", lift_to=0.15, avoid="cubeB") + self._place_on_point(self._stack_target, "cubeA"),
            "PickPlaceCan": self._pick("can", lift_to=0.30) + self._place_on_point(self._bin_target, "can", high=0.32),
            "NutAssemblySquare": self._nut_plan(),
            **kitchen_plans(),  # RoboCasa's kitchens (the robocasa backend's privileged state)
        }
        self._goal_plan = self._pick_and_place_goal()  # LIBERO: the goal's first On/In conjunct
        self.reset(0)

    def reset(self, seed: int) -> None:
        self._phase = 0
        self._steps_in_phase = 0
        self._memo: dict = {}

    def get_state(self) -> Dict[str, np.ndarray]:
        """The phase, its step count and the memo (its values are arrays); the plans hold no state."""
        return {"phase": np.asarray(self._phase, dtype=np.int64),
                "steps_in_phase": np.asarray(self._steps_in_phase, dtype=np.int64), **pack_arrays("memo", self._memo)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        self._phase, self._steps_in_phase = int(state["phase"]), int(state["steps_in_phase"])
        self._memo = unpack_arrays("memo", state)

    # -------------------------------------------------------------- plans

    @staticmethod
    def _pick(obj: str, lift_to: float, retreat: bool = True, avoid: Optional[str] = None) -> List[Phase]:
        """Approach, descend, close, lift; with ``avoid``, the fingers close across the line to that
        object, so they do not land on it when the two stand close together."""

        def yaw(obs, memo) -> float:
            if avoid is None:
                return 0.0
            d = obs.privileged[f"{avoid}_pos"] - obs.privileged[f"{obj}_pos"]
            return YAW_GAIN * wrap(np.arctan2(d[1], d[0]) + np.pi / 2 - closing_axis_yaw(obs.proprio["robot0_eef_quat"]), np.pi)

        def above(obs, memo):
            return obs.privileged[f"{obj}_pos"] + [0, 0, 0.08]

        def at(obs, memo):
            return obs.privileged[f"{obj}_pos"] + [0, 0, -0.005]

        def hold(obs, memo):
            memo.setdefault("hold", obs.proprio["robot0_eef_pos"].copy())
            return memo["hold"]

        def up(obs, memo):
            table = obs.privileged["table_z"][0]
            p = memo.setdefault("grasp_xy", obs.proprio["robot0_eef_pos"].copy())
            return np.array([p[0], p[1], table + lift_to])

        return [
            Phase("approach", above, OPEN, reached(0.01, 0.02), yaw=yaw),
            Phase("descend", at, OPEN, reached(0.006, 0.006, max_steps=40), yaw=yaw),
            Phase("close", hold, CLOSE, after(10)),
            Phase("lift", up, CLOSE, reached(0.02, 0.02, max_steps=60) if retreat else after(10**6)),
        ]

    @staticmethod
    def _stack_target(obs) -> np.ndarray:
        p = obs.privileged
        return p["cubeB_pos"] + [0, 0, p["cubeA_size"][2] + p["cubeB_size"][2] + 0.004]

    @staticmethod
    def _bin_target(obs) -> np.ndarray:
        return obs.privileged["bin_pos"] + [0, 0, 0.10]

    @staticmethod
    def _place_on_point(goal: Callable[[Observation], np.ndarray], held: str, high: float = 0.15) -> List[Phase]:
        """Carry the ``held`` object (tracking its live offset from the gripper) to ``goal`` and let go."""

        def held_offset(obs, memo):
            # eef - object, re-read live so a slipping grasp is compensated
            return obs.proprio["robot0_eef_pos"] - obs.privileged[f"{held}_pos"]

        def over(obs, memo):
            t = goal(obs) + held_offset(obs, memo)
            return np.array([t[0], t[1], obs.privileged["table_z"][0] + high])

        def down(obs, memo):
            return goal(obs) + held_offset(obs, memo)

        def hold(obs, memo):
            memo.setdefault("release_at", obs.proprio["robot0_eef_pos"].copy())
            return memo["release_at"]

        def away(obs, memo):
            return memo["release_at"] + [0, 0, 0.12]

        return [
            Phase("carry", over, CLOSE, reached(0.008, 0.03, max_steps=100)),
            Phase("lower", down, CLOSE, reached(0.006, 0.006, max_steps=60)),
            Phase("release", hold, OPEN, after(8)),
            Phase("retreat", away, OPEN, after(10**6)),
        ]

    def _nut_plan(self) -> List[Phase]:
        def handle_dir(obs) -> float:
            d = obs.privileged["nut_handle_pos"] - obs.privileged["nut_pos"]
            return float(np.arctan2(d[1], d[0]))

        def align_to_handle(obs, memo) -> float:
            # fingers close across the handle: closing axis perpendicular to the handle
            return YAW_GAIN * wrap(handle_dir(obs) + np.pi / 2 - closing_axis_yaw(obs.proprio["robot0_eef_quat"]), np.pi)

        def above_handle(obs, memo):
            return obs.privileged["nut_handle_pos"] + [0, 0, 0.08]

        def at_handle(obs, memo):
            return obs.privileged["nut_handle_pos"] + [0, 0, -0.005]

        def hold(obs, memo):
            memo.setdefault("hold", obs.proprio["robot0_eef_pos"].copy())
            return memo["hold"]

        def up(obs, memo):
            p = memo.setdefault("grasp_xy", obs.proprio["robot0_eef_pos"].copy())
            return np.array([p[0], p[1], obs.privileged["table_z"][0] + 0.20])

        def square_up(obs, memo) -> float:
            # the square hole fits the peg when the nut's yaw is a multiple of 90 degrees
            return -YAW_GAIN * wrap(yaw_of_wxyz(obs.privileged["nut_quat"]), np.pi / 2)

        def aligned(tol_rad):
            def done(obs, memo, steps):
                ok = abs(wrap(yaw_of_wxyz(obs.privileged["nut_quat"]), np.pi / 2)) < tol_rad
                return ok and reached(0.01, 0.03)(obs, memo, steps) or steps > 120

            return done

        def offset(obs):
            return obs.proprio["robot0_eef_pos"] - obs.privileged["nut_pos"]

        def over_peg(obs, memo):
            t = obs.privileged["peg_pos"] + offset(obs)
            return np.array([t[0], t[1], obs.privileged["table_z"][0] + 0.20])

        def onto_peg(obs, memo):
            t = obs.privileged["peg_pos"] + offset(obs)
            return np.array([t[0], t[1], obs.privileged["table_z"][0] + 0.02 + offset(obs)[2]])

        def release_hold(obs, memo):
            memo.setdefault("release_at", obs.proprio["robot0_eef_pos"].copy())
            return memo["release_at"]

        def away(obs, memo):
            return memo["release_at"] + [0, 0, 0.12]

        aligned_done = aligned(np.deg2rad(2))
        return [
            Phase("approach", above_handle, OPEN, reached(0.01, 0.02, max_steps=100), yaw=align_to_handle),
            Phase("descend", at_handle, OPEN, reached(0.005, 0.006, max_steps=40), yaw=align_to_handle),
            Phase("close", hold, CLOSE, after(10)),
            Phase("lift", up, CLOSE, reached(0.02, 0.02, max_steps=60)),
            Phase("carry", over_peg, CLOSE, aligned_done, yaw=square_up),
            Phase("lower", onto_peg, CLOSE, reached(0.005, 0.01, max_steps=60), yaw=square_up),
            Phase("release", release_hold, OPEN, after(8)),
            Phase("retreat", away, OPEN, after(10**6)),
        ]

    @staticmethod
    def _pick_and_place_goal() -> List[Phase]:
        """Pick ``goal_object`` and put it on or in ``goal_target`` (LIBERO-Spatial and -Object: one On/In goal).

        Read live from the scene's boxes (``goal_*_min``/``max``): a bowl (wider than the fingers open)
        is taken by its rim where the fingers' closing axis crosses it; anything narrower, from above
        its centre, 2.5 cm below its top. It is carried 15 cm above the higher of the two and let go
        3 cm above the target's top.
        """
        opening_m = 0.07  # what the Panda's fingers span, with a margin

        def grasp_point(obs, memo):
            p = obs.privileged
            low, high = p["goal_object_min"], p["goal_object_max"]
            centre = (low + high) / 2
            axis = quat_xyzw_to_mat(obs.proprio["robot0_eef_quat"])[:, 1]
            axis = np.array([axis[0], axis[1], 0.0]) / max(np.linalg.norm(axis[:2]), 1e-9)
            half = float(np.abs(axis[:2]) @ ((high - low)[:2] / 2))
            point = np.array([centre[0], centre[1], high[2] - min(0.025, 0.4 * (high[2] - low[2]))])
            if 2 * half > opening_m:  # a rim: the near wall along the closing axis
                side = np.sign(axis[:2] @ (obs.proprio["robot0_eef_pos"][:2] - centre[:2])) or 1.0
                point[:2] += side * (half - 0.012) * axis[:2]
                point[2] = high[2] - 0.015
            memo.setdefault("grasp_offset", point - p["goal_object_pos"])
            return p["goal_object_pos"] + memo["grasp_offset"]

        def above(obs, memo):
            return grasp_point(obs, memo) + [0, 0, 0.10]

        def hold(obs, memo):
            memo.setdefault("hold", obs.proprio["robot0_eef_pos"].copy())
            return memo["hold"]

        def carry_z(obs, memo):
            p = obs.privileged
            return memo.setdefault("carry_z", np.array([max(p["goal_object_max"][2], p["goal_target_max"][2]) + 0.15]))[0]

        def up(obs, memo):
            xy = memo["hold"]
            return np.array([xy[0], xy[1], carry_z(obs, memo)])

        def drop_point(obs, memo):
            p = obs.privileged
            # the held object's bottom 3 cm above the target's top, its centre over the target
            lift = p["goal_object_pos"][2] - p["goal_object_min"][2]
            point = np.array([p["goal_target_pos"][0], p["goal_target_pos"][1], p["goal_target_max"][2] + 0.03 + lift])
            return point + (obs.proprio["robot0_eef_pos"] - p["goal_object_pos"])

        def over(obs, memo):
            t = drop_point(obs, memo)
            return np.array([t[0], t[1], carry_z(obs, memo)])

        def release_hold(obs, memo):
            memo.setdefault("release_at", obs.proprio["robot0_eef_pos"].copy())
            return memo["release_at"]

        def away(obs, memo):
            return memo["release_at"] + [0, 0, 0.10]

        return [
            Phase("approach", above, OPEN, reached(0.01, 0.02, max_steps=80)),
            Phase("descend", grasp_point, OPEN, reached(0.006, 0.006, max_steps=40)),
            Phase("close", hold, CLOSE, after(12)),
            Phase("lift", up, CLOSE, reached(0.02, 0.02, max_steps=60)),
            Phase("carry", over, CLOSE, reached(0.01, 0.03, max_steps=100)),
            Phase("lower", drop_point, CLOSE, reached(0.008, 0.008, max_steps=50)),
            Phase("release", release_hold, OPEN, after(10)),
            Phase("retreat", away, OPEN, after(10**6)),
        ]

    # -------------------------------------------------------------- acting

    def act(self, obs: Observation) -> np.ndarray:
        if obs.privileged is None:
            raise ValueError("the expert policy needs privileged state")
        plan = self._plans.get(obs.task) or (self._goal_plan if "goal_object_pos" in obs.privileged else None)
        if plan is None:
            raise ValueError(f"the expert has no plan for task {obs.task!r}; it has plans for: "
                             f"{', '.join(sorted(self._plans))} and for scenes that name a goal object and target "
                             f"(LIBERO's On/In goals)")
        while True:
            phase = plan[self._phase]
            self._memo["target"] = phase.target(obs, self._memo)
            if self._phase + 1 < len(plan) and phase.done(obs, self._memo, self._steps_in_phase):
                self._phase += 1
                self._steps_in_phase = 0
                continue
            break
        self._steps_in_phase += 1
        if phase.drive_base:
            return base_action(obs.proprio, self._memo["target"], phase.grip)[None]
        yaw_rate = phase.yaw(obs, self._memo) if phase.yaw else 0.0
        return arm_action(obs.proprio, self._memo["target"], phase.grip, yaw_rate, obs.action_layout or LAYOUT,
                          level=phase.level)[None]


class RandomPolicy(NumpySeededPolicy):
    """Uniform random arm and gripper actions, in the embodiment's layout; a mobile base stays still.
    A negative control."""

    name = "random"

    def act(self, obs: Observation) -> np.ndarray:
        layout = obs.action_layout or LAYOUT
        action = np.zeros(layout.dim)
        action[list(layout.arm_continuous)] = self.rng.uniform(-1.0, 1.0, len(layout.arm_continuous))
        action[layout.gripper] = self.rng.choice([layout.open, layout.close])
        for index, value in layout.fixed.items():
            action[index] = value
        return action[None]
