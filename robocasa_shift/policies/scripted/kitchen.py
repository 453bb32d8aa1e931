"""Scripted kitchen plans for the ``expert`` policy (privileged state of the robocasa backend).

Written for the stand-in kitchens (``backends/robocasa_standin``), whose sinks have a lever handle
(pushed away from the robot to run the water) and a spout on a vertical hinge; the plans read the
sink's lever, spout and basin from ``sink_*`` entries of the privileged state, and objects from
``{name}_pos`` / ``_quat`` / ``_size``. On RoboCasa's real sinks the handle and spout are other
shapes: these plans are untested there.

- ``WashLettuce``: lever on; grasp the lettuce; hold it under the stream (RoboCasa counts 25 steps).
- ``RinseSinkBasin``: lever on (the spout starts at the centre, which latches); push the spout
  left, then across to the right.
- ``PreSoakPan``: pan into the basin (taken by its rim), sponge into the basin, lever on, back off
  (on the stand-in kit: success on some episodes; on others pan and sponge reach the basin but the
  water never runs).
- ``StackBowlsCabinet``: one bowl into the other (taken by the rim), then the stack towards the open
  cabinet (on the stand-in kit: grasped and stacked, but the stack does not reach the cabinet
  interior); how far each plan gets is in docs/backends.md.
- the other twelve Composite-Seen tasks: no plan; the robot holds still (a valid, failed rollout).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.embodiments.panda_omron import CLOSE, OPEN
from robocasa_shift.geometry import quat_xyzw_to_mat, wrap
from robocasa_shift.policies.scripted.phases import (
    YAW_GAIN,
    Phase,
    after,
    base_reached,
    closing_axis_yaw,
    reached,
    yaw_of_wxyz,
)

# RoboCasa365's Composite-Seen tasks (the robocasa backend's table); those without a plan hold still.
KITCHEN_TASKS = ("DeliverStraw", "GetToastedBread", "KettleBoiling", "LoadDishwasher", "PackIdenticalLunches",
                 "PreSoakPan", "PrepareCoffee", "RinseSinkBasin", "ScrubCuttingBoard", "SearingMeat",
                 "SetUpCuttingStation", "StackBowlsCabinet", "SteamInMicrowave", "StirVegetables",
                 "StoreLeftoversInBowl", "WashLettuce")
LEVER_ON_RAD = 0.47  # the lever's angle pushed to: water runs above 0.40 (Sink.get_handle_state), the stop is 0.52
SPOUT_SIDE_RAD = 0.75  # left / right read beyond pi/6 (0.52); pushed a margin past it
SPOUT_LEAD_RAD = 0.3  # the push target leads the spout by this angle
OPENING_M = 0.07  # what the Panda's fingers span, with a margin


def _p(obs: Observation, key: str) -> np.ndarray:
    return np.asarray(obs.privileged[key], dtype=float)


def _back(obs: Observation) -> np.ndarray:
    """The sink's direction away from the robot (its fixture frame's +y), in the world."""
    yaw = float(_p(obs, "sink_yaw")[0])
    return np.array([-np.sin(yaw), np.cos(yaw), 0.0])


def _rot_z(v: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1], 0.0])


def _spout_frame(obs: Observation):
    """(pivot, unit vector pivot -> tip, unit normal towards increasing angle, contact radius)."""
    pivot, tip = _p(obs, "sink_spout_pivot"), _p(obs, "sink_spout_tip")
    u = np.array([tip[0] - pivot[0], tip[1] - pivot[1], 0.0])
    length = float(np.linalg.norm(u))
    u /= max(length, 1e-9)
    return pivot, u, np.array([-u[1], u[0], 0.0]), 0.8 * length


def _hold(key: str):
    def target(obs, memo):
        memo.setdefault(key, obs.proprio["robot0_eef_pos"].copy())
        return memo[key]

    return target


def _until(predicate, max_steps: int):
    return lambda obs, memo, steps: bool(predicate(obs)) or steps >= max_steps


def _never(obs, memo, steps) -> bool:
    return False


def clear_point(obs: Observation) -> np.ndarray:
    """A waypoint in front of the sink, high above the counter: the arm passes there between the faucet and the
    counter, never through the spout's swing."""
    centre, size = _p(obs, "sink_basin_center"), _p(obs, "sink_basin_size")
    top = centre[2] + size[2] / 2
    return centre - (0.5 * float(max(size[0], size[1])) + 0.05) * _back(obs) * 0.6 + [0, 0, top + 0.30 - centre[2]]


def base_facing(point, name: str, grip: float = CLOSE) -> Phase:
    """Drive the mobile base sideways (along its own lateral axis, keeping its distance to the counter) until
    ``point(obs)`` is straight ahead of it; the arm rides along. The target is fixed when the phase starts."""

    def target(obs, memo):
        if f"{name}_to" not in memo:
            base = obs.proprio["robot0_base_pos"]
            lateral = quat_xyzw_to_mat(obs.proprio["robot0_base_quat"])[:, 1]
            lateral = np.array([lateral[0], lateral[1], 0.0])
            memo[f"{name}_to"] = base + (lateral @ (point(obs) - base)) * lateral
        return memo[f"{name}_to"]

    return Phase(name, target, grip, base_reached(0.01, max_steps=200), drive_base=True)


def to_clear_point(name: str) -> Phase:
    return Phase(name, lambda obs, memo: clear_point(obs), CLOSE, reached(0.03, 0.03, max_steps=150))


# ---------------------------------------------------------------------------- the sink's lever and spout


def lever_on_phases() -> List[Phase]:
    """Push the sink's lever away from the robot with the closed fingers until the water runs, then back off."""

    def above(obs, memo):
        return _p(obs, "sink_handle_tip") - 0.07 * _back(obs) + [0, 0, 0.10]

    def front(obs, memo):
        return _p(obs, "sink_handle_tip") - 0.06 * _back(obs) + [0, 0, -0.02]

    def push(obs, memo):
        start = memo.setdefault("lever_start", _p(obs, "sink_handle_tip"))
        return start + 0.10 * _back(obs) + [0, 0, -0.02]

    def off(obs, memo):
        at = memo.setdefault("lever_off", obs.proprio["robot0_eef_pos"].copy())
        return at - 0.08 * _back(obs) + [0, 0, 0.06]

    return [
        Phase("lever_above", above, CLOSE, reached(0.02, 0.03, max_steps=120)),
        Phase("lever_front", front, CLOSE, reached(0.01, 0.01, max_steps=60)),
        Phase("lever_push", push, CLOSE, _until(lambda o: _p(o, "sink_handle_q")[0] >= LEVER_ON_RAD, 80)),
        Phase("lever_off", off, CLOSE, reached(0.02, 0.02, max_steps=40)),
        to_clear_point("lever_clear"),
    ]


def spout_push_phases(direction: int, name: str) -> List[Phase]:
    """Swing the spout to one side: ``direction`` -1 pushes it left (angle down), +1 right (angle up)."""

    def side_point(obs, lift):
        pivot, u, n, r = _spout_frame(obs)
        # start on the side the push comes from: the +n side to push towards -n (left), and vice versa
        return pivot + r * u - direction * 0.055 * n + [0, 0, lift - 0.005]

    def above(obs, memo):
        return side_point(obs, 0.07)

    def down(obs, memo):
        return side_point(obs, 0.0)

    def push(obs, memo):
        pivot, u, n, r = _spout_frame(obs)
        lead = _rot_z(u, direction * SPOUT_LEAD_RAD)
        return pivot + r * lead + [0, 0, -0.005]

    def lift(obs, memo):
        at = memo.setdefault(f"{name}_done", obs.proprio["robot0_eef_pos"].copy())
        return at + [0, 0, 0.10]

    def swung(obs) -> bool:
        q = float(_p(obs, "sink_spout_q")[0])
        return q <= -SPOUT_SIDE_RAD if direction < 0 else q >= SPOUT_SIDE_RAD

    return [
        Phase(f"{name}_above", above, CLOSE, reached(0.015, 0.03, max_steps=120)),
        Phase(f"{name}_down", down, CLOSE, reached(0.012, 0.012, max_steps=60)),
        Phase(f"{name}_push", push, CLOSE, _until(swung, 150)),
        Phase(f"{name}_lift", lift, CLOSE, reached(0.02, 0.02, max_steps=40)),
    ]


# ---------------------------------------------------------------------------- grasping, carrying, placing


def _object_yaw(obs: Observation, obj: str) -> float:
    return yaw_of_wxyz(_p(obs, f"{obj}_quat"))


def _grasp_point(obs: Observation, memo: dict, obj: str) -> np.ndarray:
    """Where the fingers close on ``obj``: its centre when it fits between them, else its rim where the
    closing axis crosses it (read once, then followed as the object moves)."""
    if f"{obj}_grasp_offset" not in memo:
        pos, size = _p(obs, f"{obj}_pos"), _p(obs, f"{obj}_size")
        point = pos.copy()
        if min(size[:2]) > OPENING_M:  # a rim: the near wall along the closing axis
            axis = quat_xyzw_to_mat(obs.proprio["robot0_eef_quat"])[:, 1]
            axis = np.array([axis[0], axis[1], 0.0]) / max(np.linalg.norm(axis[:2]), 1e-9)
            side = np.sign(axis[:2] @ (obs.proprio["robot0_eef_pos"][:2] - pos[:2])) or 1.0
            point[:2] += side * (min(size[:2]) / 2 - 0.012) * axis[:2]
            point[2] = pos[2] + size[2] / 2 - 0.015
        memo[f"{obj}_grasp_offset"] = point - pos
    return _p(obs, f"{obj}_pos") + memo[f"{obj}_grasp_offset"]


def pick_phases(obj: str, lift_m: float = 0.25) -> List[Phase]:
    """Approach ``obj`` from above (fingers across a face of a box-like object), descend, close, lift."""

    def yaw(obs, memo) -> float:
        size = _p(obs, f"{obj}_size")
        if min(size[:2]) > OPENING_M:
            return 0.0  # a rim grasp: the closing axis crosses the rim wherever it points
        # close across the narrower side: the closing axis along the object's shorter horizontal axis
        want = _object_yaw(obs, obj) + (0.0 if size[0] <= size[1] else np.pi / 2)
        return YAW_GAIN * wrap(want - closing_axis_yaw(obs.proprio["robot0_eef_quat"]), np.pi)

    def above(obs, memo):
        return _grasp_point(obs, memo, obj) + [0, 0, 0.12]

    def at(obs, memo):
        return _grasp_point(obs, memo, obj)

    def up(obs, memo):
        held = memo.setdefault(f"{obj}_lift_from", obs.proprio["robot0_eef_pos"].copy())
        return held + [0, 0, lift_m]

    # the hand is turned to point straight down for the grasp (the kitchen's robot starts with it tilted)
    return [
        Phase(f"{obj}_approach", above, OPEN, reached(0.01, 0.02, max_steps=150), yaw=yaw, level=True),
        Phase(f"{obj}_descend", at, OPEN, reached(0.006, 0.008, max_steps=60), yaw=yaw, level=True),
        Phase(f"{obj}_close", _hold(f"{obj}_close_at"), CLOSE, after(12), level=True),
        Phase(f"{obj}_lift", up, CLOSE, reached(0.02, 0.02, max_steps=80), level=True),
    ]


def carry_phases(obj: str, goal, clearance_m: float, release: bool = True, name: str = "",
                 slide_from=None) -> List[Phase]:
    """Carry the held ``obj`` so that its centre reaches ``goal(obs)``: over it at ``clearance_m`` above, down,
    then let go and rise (``release``) or hold it there. ``slide_from(obs)``: come in sideways instead, from that
    direction (a unit vector; under the spout), at the goal's height."""
    name = name or obj

    def offset(obs):
        return obs.proprio["robot0_eef_pos"] - _p(obs, f"{obj}_pos")  # re-read live: a slipping grasp is followed

    def over(obs, memo):
        if slide_from is not None:
            return goal(obs) + offset(obs) + 0.18 * slide_from(obs)
        return goal(obs) + offset(obs) + [0, 0, clearance_m]

    def down(obs, memo):
        return goal(obs) + offset(obs)

    def away(obs, memo):
        return memo[f"{name}_release_at"] + [0, 0, 0.15]

    phases = [
        Phase(f"{name}_carry", over, CLOSE, reached(0.01, 0.03, max_steps=150)),
        Phase(f"{name}_lower", down, CLOSE, reached(0.008, 0.008, max_steps=80) if release else _never),
    ]
    if release:
        phases += [Phase(f"{name}_release", _hold(f"{name}_release_at"), OPEN, after(10)),
                   Phase(f"{name}_rise", away, OPEN, reached(0.02, 0.02, max_steps=40))]
    return phases


# ---------------------------------------------------------------------------- the plans


def wash_lettuce() -> List[Phase]:
    """Water on; the lettuce out of its colander and under the stream, held there (25 steps wash it)."""

    def under_stream(obs):
        water, tip = _p(obs, "sink_water_pos"), _p(obs, "sink_spout_tip")
        return np.array([water[0], water[1], tip[2] - 0.18])

    return (lever_on_phases() + [base_facing(lambda obs: _p(obs, "lettuce_pos"), "base_to_lettuce", OPEN)]
            + pick_phases("lettuce", lift_m=0.25) + [base_facing(lambda obs: _p(obs, "sink_water_pos"), "base_to_sink")]
            + carry_phases("lettuce", under_stream, clearance_m=0.0, release=False, slide_from=lambda obs: -_back(obs)))


def rinse_sink_basin() -> List[Phase]:
    """Water on (the spout starts at the centre), spout to the left, then across to the right."""
    return lever_on_phases() + spout_push_phases(-1, "spout_left") + spout_push_phases(+1, "spout_right") + [
        Phase("rest", _hold("rest_at"), CLOSE, _never)]


def pre_soak_pan() -> List[Phase]:
    """The pan into the basin by its rim, the sponge into the basin beside it, water on, back off."""

    def basin(dx: float):
        def goal(obs):
            centre, size = _p(obs, "sink_basin_center"), _p(obs, "sink_basin_size")
            lateral = _rot_z(_back(obs), -np.pi / 2)  # the sink's +x in the world
            floor = centre[2] - size[2] / 2
            return np.array([centre[0], centre[1], floor + 0.06]) + dx * lateral

        return goal

    def retreat(obs, memo):
        at = memo.setdefault("retreat_from", obs.proprio["robot0_eef_pos"].copy())
        return at - 0.30 * _back(obs) + [0, 0, 0.10]

    return (pick_phases("obj1", lift_m=0.25) + carry_phases("obj1", basin(-0.04), clearance_m=0.20)
            + pick_phases("obj2", lift_m=0.25) + carry_phases("obj2", basin(+0.12), clearance_m=0.15)
            + lever_on_phases() + [Phase("retreat", retreat, CLOSE, _never)])


def stack_bowls_cabinet() -> List[Phase]:
    """One bowl into the other (by the rim), then the stack by the outer bowl's rim into the cabinet and let go."""

    def onto_bowl2(obs):
        return _p(obs, "bowl2_pos") + [0, 0, 0.02]

    def into_cabinet(obs):
        centre, size = _p(obs, "cabinet_interior_center"), _p(obs, "cabinet_interior_size")
        return np.array([centre[0], centre[1], centre[2] - size[2] / 2 + 0.05])

    def retreat(obs, memo):
        at = memo.setdefault("retreat_from", obs.proprio["robot0_eef_pos"].copy())
        return at + [0, 0, -0.05] + 0.3 * (obs.proprio["robot0_base_pos"] - at) * np.array([1.0, 1.0, 0.0])

    return (pick_phases("bowl1", lift_m=0.20) + carry_phases("bowl1", onto_bowl2, clearance_m=0.15)
            + pick_phases("bowl2", lift_m=0.30) + carry_phases("bowl2", into_cabinet, clearance_m=0.08)
            + [Phase("retreat", retreat, OPEN, _never)])


def hold_still() -> List[Phase]:
    """No plan: the arm holds where it is, the gripper open (a valid rollout that fails)."""
    return [Phase("no_plan_hold", _hold("idle_at"), OPEN, _never)]


def kitchen_plans() -> Dict[str, List[Phase]]:
    """The expert's plan for every Composite-Seen kitchen task (those without a script hold still)."""
    plans = {task: hold_still() for task in KITCHEN_TASKS}
    plans.update(WashLettuce=wash_lettuce(), RinseSinkBasin=rinse_sink_basin(), PreSoakPan=pre_soak_pan(),
                 StackBowlsCabinet=stack_bowls_cabinet())
    return plans


__all__ = ["KITCHEN_TASKS", "kitchen_plans", "lever_on_phases", "pick_phases", "spout_push_phases"]
