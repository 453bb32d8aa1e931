"""The factor kinds beyond the paper's four: LIBERO-Plus's dimensions, frozen and paired, and deployment shifts.

Each is a :class:`~robocasa_shift.core.factors.FactorKind` (registered lazily in ``core/factors.py``); the numbers
live in ``perturbations/*.yaml`` and, for what was imported from LIBERO-Plus, in ``perturbations/liberoplus/``
(``core/liberoplus.py``). Every kind belongs to a family:

- ``scene`` (what the world looks like): illumination;
- ``sensing`` (how the robot sees it): camera rotation and placement (``camera_pose``), Gaussian blur and the
  ImageNet-C-style sensor noise (``motion_blur``, ``zoom_blur``, ``fog``, ``glass_blur``);
- ``embodiment`` (where the robot starts): base offset, arm joint offset (``arm_init``);
- ``language`` (what it is told): instruction paraphrases, graded by edit distance;
- ``deployment`` (how the policy is run): action latency, observation latency, control rate;
- ``dynamics`` (how the world and the robot respond): joint friction and damping, actuator gain, gripper force,
  object mass and friction, execution noise (``core/dynamics.py``).

Random draws come from each factor's own seed stream (``seeding.draw_rng``: study seed, factor, task, phase,
base episode), shared by every level, never from numpy's global generator; per-frame randomness of a sensor noise
is derived from its episode's draw, the frame's control step and the camera.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.core.factors import (
    FACTOR_KINDS,
    READBACK_ATOL,
    FactorKind,
    _never_rejected,
    in_place_offsets,
    laplacian_variance,
    max_abs_difference,
    moved_third_person_cameras,
)
from robocasa_shift.core.liberoplus import word_edit_distance
from robocasa_shift.core.loop_wrappers import ActionDelay, ActionRepeat, LoopWrapper, ObservationDelay
from robocasa_shift.errors import PerturbationError, SpecError
from robocasa_shift.geometry import axis_angle_quat, quat_to_mat

FAMILIES: Dict[str, str] = {
    "scene": "what the world looks like (lights)",
    "sensing": "how the robot sees it (camera pose and optics, image noise)",
    "embodiment": "where the robot starts (base, arm joints)",
    "language": "what the robot is told (instruction wording)",
    "deployment": "how the policy is run (latency, control rate)",
    "dynamics": "how the world and the robot respond (friction, gains, grip, mass, execution noise)",
}

# --------------------------------------------------------------------------- small geometry


def mat_to_quat(m: np.ndarray) -> np.ndarray:
    """The unit quaternion (w, x, y, z) of a rotation matrix (Shepperd's method; w >= 0)."""
    m = np.asarray(m, dtype=float)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * math.sqrt(trace + 1.0)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    q = q / np.linalg.norm(q)
    return -q if q[0] < 0 else q


def _rot(axis: Sequence[float], degrees: float) -> np.ndarray:
    return quat_to_mat(axis_angle_quat(axis, np.deg2rad(degrees)))


def _wrap_deg(angle: float) -> float:
    return float((angle + 180.0) % 360.0 - 180.0)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _range(spec, key: str, level: str) -> Tuple[float, float]:
    """The frozen ``options.<key>.<level>`` range ``[low, high]`` of a spec.

    Raises:
        SpecError: missing or malformed.
    """
    ranges = spec.options.get(key)
    bounds = ranges.get(level) if isinstance(ranges, dict) else None
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_number(b) for b in bounds) and bounds[0] < bounds[1]):
        raise SpecError(spec.path, f"options.{key}.{level}", f"expected [low, high] with low < high, got {bounds!r}")
    return float(bounds[0]), float(bounds[1])


# --------------------------------------------------------------------------- language


@FACTOR_KINDS.register("instruction_graded")
class InstructionGraded(FactorKind):
    """The instruction the policy receives replaced by a paraphrase whose word edit distance from it lies in the
    level's band (``min_distance`` < d <= ``max_distance``).

    The backend supplies the paraphrases (``instructions`` hook; on LIBERO, LIBERO-Plus's 50 per task); the
    draw u, uniform in [0, 1) and shared by every level, picks the paraphrase at position floor(u * n) among
    the n in the band, in the source's order. Scene, initial state and physics are untouched. The record keeps
    both texts, the delivered one's SHA-256 and its distance, which the audit recomputes from the two texts.
    """

    side = "instruction"
    family = "language"
    draw_kind = "unit_uniform"
    level_params = ("min_distance", "max_distance")
    requires = ("instructions",)

    def draw(self, spec, rng, env=None):
        return {"draw": [float(rng.uniform())], "draws_rejected": 0}

    def replay_draw(self, spec, rng, draws_rejected):
        """The uniform draw (never rejected)."""
        _never_rejected(draws_rejected)
        return self.draw(spec, rng)["draw"]

    @staticmethod
    def band(paraphrases: Sequence[str], instruction: str, params: Mapping[str, float]) -> List[Tuple[int, str, float]]:
        """(position, text, distance) of the paraphrases in the level's band, in the source's order."""
        out = []
        for i, text in enumerate(paraphrases):
            d = word_edit_distance(instruction, text)
            if params["min_distance"] < d <= params["max_distance"]:
                out.append((i, text, d))
        return out

    def apply(self, env, params, draw):
        clean = env.task.instruction
        band = self.band(list(env.instruction_paraphrases()), clean, params)
        if not band:
            raise PerturbationError(f"task '{env.task.name}' has no paraphrase at word edit distance "
                                    f"({params['min_distance']:g}, {params['max_distance']:g}] from its instruction")
        u = float(draw["draw"][0])
        position, text, distance = band[min(int(u * len(band)), len(band) - 1)]
        measured = {**self.measure_instruction(clean, text), "distance": distance, "position": position,
                    "in_band": len(band)}
        return {"applied": {"changed": float(text != clean), "distance": word_edit_distance(clean, text)},
                "expected": {"changed": 1.0, "distance": distance}, "measured": measured}

    @staticmethod
    def measure_instruction(clean: str, delivered: str) -> Dict[str, Any]:
        return {"instruction": delivered, "clean_instruction": clean,
                "instruction_sha256": hashlib.sha256(delivered.encode()).hexdigest()}

    def readback(self, env):
        return {"changed": None, "distance": None}

    def measured_problems(self, spec, level, measured, images_delivered=True):
        """The delivered text: present, not the task's own, the one its hash names, in the level's distance band."""
        if not isinstance(measured, dict) or not isinstance(measured.get("instruction"), str):
            return ["no delivered instruction recorded"]
        text, clean = measured["instruction"], str(measured.get("clean_instruction"))
        problems = []
        if not text.strip() or text == clean:
            problems.append(f"delivered instruction {text!r} is empty or the task's own instruction")
        if measured.get("instruction_sha256") != self.measure_instruction(clean, text)["instruction_sha256"]:
            problems.append("delivered instruction does not match its recorded sha256")
        params = spec.level(level)
        distance = word_edit_distance(clean, text)
        if not params["min_distance"] < distance <= params["max_distance"]:
            problems.append(f"delivered instruction lies at distance {distance:.3f}, outside the level's band "
                            f"({params['min_distance']:g}, {params['max_distance']:g}]")
        if not max_abs_difference(measured.get("distance"), distance) <= READBACK_ATOL:
            problems.append(f"recorded distance {measured.get('distance')!r} is not the texts' {distance:.6f}")
        return problems


# --------------------------------------------------------------------------- camera placement


@FACTOR_KINDS.register("camera_pose")
class CameraPose(FactorKind):
    """Third-person cameras moved as LIBERO-Plus moves its camera, from one draw shared by every level.

    With u = (u_orbit, u_elevation, u_distance, u_yaw, u_pitch, u_fov) drawn once per base episode
    (u_elevation and u_distance uniform in [0, 1], the others in [-1, 1]), a level scales them: the camera turns
    about the vertical through the pivot by ``orbit_max_deg * u_orbit``, rises on the circle through the pivot by
    ``elevation_max_deg * u_elevation`` (first), moves away from the pivot by the factor
    ``1 + (distance_max_factor - 1) * u_distance``, then turns in place by ``yaw_max_deg * u_yaw`` about the
    vertical and ``pitch_max_deg * u_pitch`` about its own horizontal axis, and its vertical field of view
    changes by ``fovy_max_deg * u_fov``. The wrist camera is untouched.

    Read back: each camera's pose and field of view as the model holds them, and the orbit, elevation, distance
    factor, yaw and pitch recovered from the pose the simulator holds (world frame), against what was asked.
    """

    family = "sensing"
    draw_kind = "uniform_6"
    level_params = ("orbit_max_deg", "elevation_max_deg", "distance_max_factor", "yaw_max_deg", "pitch_max_deg",
                    "fovy_max_deg")
    requires = ("camera_poses",)
    conflicts = ("cameras",)  # it turns the cameras the camera factor turns: never combined with it
    min_image_change = 0.5

    def draw(self, spec, rng, env=None):
        u = rng.uniform(-1.0, 1.0, 6)
        u[1], u[2] = (u[1] + 1.0) / 2.0, (u[2] + 1.0) / 2.0  # elevation and distance only ever grow
        return {"draw": [float(x) for x in u], "draws_rejected": 0}

    def replay_draw(self, spec, rng, draws_rejected):
        """The six uniforms (never rejected: any camera placement is a valid state)."""
        _never_rejected(draws_rejected)
        return self.draw(spec, rng)["draw"]

    @staticmethod
    def scaled(params: Mapping[str, float], u: Sequence[float]) -> Dict[str, float]:
        """The level's move for draw u."""
        return {"orbit_deg": params["orbit_max_deg"] * u[0], "elevation_deg": params["elevation_max_deg"] * u[1],
                "distance_factor": 1.0 + (params["distance_max_factor"] - 1.0) * u[2],
                "yaw_deg": params["yaw_max_deg"] * u[3], "pitch_deg": params["pitch_max_deg"] * u[4],
                "fovy_delta_deg": params["fovy_max_deg"] * u[5]}

    @staticmethod
    def world_pose(pose: Mapping[str, Any], parent: Tuple[np.ndarray, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """A camera's world position and rotation from its pose in the parent frame."""
        p, r = np.asarray(parent[0], float), np.asarray(parent[1], float)
        return p + r @ np.asarray(pose["pos"], float), r @ quat_to_mat(np.asarray(pose["quat"], float))

    @staticmethod
    def moved(centre: np.ndarray, rot: np.ndarray, pivot: np.ndarray, move: Mapping[str, float]):
        """The world pose after ``move`` (see the class docstring), from the nominal world pose."""
        up = np.array([0.0, 0.0, 1.0])
        d = centre - pivot
        axis = np.cross(d, up)
        if np.linalg.norm(axis) < 1e-9:  # straight above the pivot: rise towards the camera's own x axis
            axis = rot[:, 0]
        turn = _rot(up, move["orbit_deg"]) @ _rot(axis, move["elevation_deg"])
        centre_new = pivot + move["distance_factor"] * (turn @ d)
        rot_new = _rot(up, move["yaw_deg"]) @ turn @ rot @ _rot([1.0, 0.0, 0.0], move["pitch_deg"])
        return centre_new, rot_new

    @staticmethod
    def recovered(centre0, rot0, centre, rot, pivot) -> Dict[str, float]:
        """Orbit, elevation, distance factor, yaw and pitch of a world pose relative to the nominal one."""
        up = np.array([0.0, 0.0, 1.0])
        d0, d1 = centre0 - pivot, centre - pivot
        elevation = lambda d: math.degrees(math.atan2(d[2], math.hypot(d[0], d[1])))  # noqa: E731
        azimuth = lambda d: math.degrees(math.atan2(d[1], d[0]))  # noqa: E731
        orbit = _wrap_deg(azimuth(d1) - azimuth(d0))
        rise = elevation(d1) - elevation(d0)
        axis = np.cross(d0, up)
        if np.linalg.norm(axis) < 1e-9:
            axis = rot0[:, 0]
        turned = _rot(up, orbit) @ _rot(axis, rise) @ rot0
        yaw, pitch = in_place_offsets(mat_to_quat(turned), mat_to_quat(rot), up)
        return {"orbit_deg": orbit, "elevation_deg": rise,
                "distance_factor": float(np.linalg.norm(d1) / np.linalg.norm(d0)), "yaw_deg": yaw, "pitch_deg": pitch}

    def apply(self, env, params, draw):
        move = self.scaled(params, draw["draw"])
        expected = {}
        for cam in env.third_person_cameras:
            nominal, parent, pivot = env.nominal_camera_placement(cam), env.camera_parent_frame(cam), env.camera_orbit_pivot(cam)
            centre0, rot0 = self.world_pose(nominal, parent)
            centre, rot = self.moved(centre0, rot0, np.asarray(pivot, float), move)
            p, r = np.asarray(parent[0], float), np.asarray(parent[1], float)
            pose = {"pos": (r.T @ (centre - p)).tolist(), "quat": mat_to_quat(r.T @ rot).tolist(),
                    "fovy_deg": float(nominal["fovy_deg"]) + move["fovy_delta_deg"]}
            env.set_camera_placement(cam, pose)
            expected[cam] = {**pose, **{k: move[k] for k in ("orbit_deg", "elevation_deg", "distance_factor",
                                                             "yaw_deg", "pitch_deg")}}
        return {"applied": self.readback(env), "expected": expected}

    def readback(self, env):
        out = {}
        for cam in env.third_person_cameras:
            pose, nominal = env.camera_placement(cam), env.nominal_camera_placement(cam)
            parent, pivot = env.camera_parent_frame(cam), np.asarray(env.camera_orbit_pivot(cam), float)
            centre0, rot0 = self.world_pose(nominal, parent)
            centre, rot = self.world_pose(pose, parent)
            out[cam] = {"pos": np.asarray(pose["pos"], float).tolist(), "quat": np.asarray(pose["quat"], float).tolist(),
                        "fovy_deg": float(pose["fovy_deg"]), **self.recovered(centre0, rot0, centre, rot, pivot)}
        return out

    def audit(self, spec, level, draw, perturbation, context):
        """The moved cameras are the third-person ones, each by the level's scaling of the seed stream's draw."""
        if draw is None:
            return []
        expected, problems = moved_third_person_cameras(perturbation, context, "moved")
        move = self.scaled(spec.level(level), draw)
        keys = ("orbit_deg", "elevation_deg", "distance_factor", "yaw_deg", "pitch_deg")
        for cam in sorted(expected):
            values = expected[cam] if isinstance(expected[cam], dict) else {}
            if not max_abs_difference([values.get(k) for k in keys], [move[k] for k in keys]) <= READBACK_ATOL:
                problems.append(f"{cam} move is not the scaled draw of the seed stream")
        return problems

    def calibration_intended(self, spec, level, view):
        """The pose read back as asked, the third-person images moved, the wrist images did not."""
        return bool(view.readback_ok) and view.third_person_change > self.min_image_change and view.wrist_identical


# --------------------------------------------------------------------------- arm starting joints


@FACTOR_KINDS.register("arm_joint_offset")
class ArmJointOffset(FactorKind):
    """The arm starts from its episode's joint positions plus ``radius_rad`` times a unit direction: one of
    LIBERO-Plus's 500 starting poses' directions (``options.data``), picked per base episode and shared by every
    level. A direction with fewer joints than the poses' seven uses its leading components, renormalised.

    A draw whose offset is invalid at ANY level (a joint limit, the robot in collision) is replaced for every
    level by the next draw of the same stream (``draws_rejected``), at most ``options.max_draws`` times, as the
    base offset's. The offset is applied to the episode's arm after the reset's settle steps (as every factor is
    applied after them), the controller reading the new pose and its null-space reference moved by the offset
    (LIBERO-Plus's poses are new initial joints); read back from the state, exactly.
    """

    family = "embodiment"
    draw_kind = "pose_index"
    level_params = ("radius_rad",)
    requires = ("robot_joints",)
    min_image_change = 0.5

    @staticmethod
    def directions(spec) -> List[Sequence[float]]:
        """The unit directions of the spec's data (LIBERO-Plus's poses).

        Raises:
            SpecError: the spec names no data with poses.
        """
        data = getattr(spec, "data", None)
        if not isinstance(data, dict) or not isinstance(data.get("poses"), list) or not data["poses"]:
            raise SpecError(spec.path, "options.data", "kind arm_joint_offset needs the poses data file")
        return [p["direction"] for p in data["poses"]]

    @staticmethod
    def offset(direction: Sequence[float], n_joints: int, radius: float) -> np.ndarray:
        """``radius`` times the direction's first ``n_joints`` components, renormalised."""
        d = np.asarray(direction, dtype=float)[:n_joints]
        return radius * d / np.linalg.norm(d)

    @staticmethod
    def max_draws(spec) -> int:
        return int(spec.options.get("max_draws", 50))

    def draw(self, spec, rng, env=None):
        directions = self.directions(spec)
        n = len(env.arm_joint_names()) if env is not None else len(directions[0])
        radii = [spec.level(level)["radius_rad"] for level in spec.levels]
        reasons = []
        for rejected in range(self.max_draws(spec)):
            index = int(rng.integers(len(directions)))
            if env is None:
                return {"draw": [index], "direction": list(directions[index]), "draws_rejected": rejected}
            problems = [env.arm_joint_offset_problem(self.offset(directions[index], n, r)) for r in radii]
            if not any(problems):
                return {"draw": [index], "direction": list(directions[index]), "draws_rejected": rejected}
            reasons.append(next(p for p in problems if p))
        raise PerturbationError(f"no valid arm offset in {self.max_draws(spec)} draws (last: {reasons[-1]})")

    def replay_draw(self, spec, rng, draws_rejected):
        """The ``draws_rejected + 1``-th pose index of the stream."""
        if isinstance(draws_rejected, bool) or not isinstance(draws_rejected, int) or not \
                0 <= draws_rejected < self.max_draws(spec):
            raise ValueError(f"expected a count in 0..{self.max_draws(spec) - 1}, got {draws_rejected!r}")
        n = len(self.directions(spec))
        index = None
        for _ in range(draws_rejected + 1):
            index = int(rng.integers(n))
        return [index]

    def apply(self, env, params, draw):
        direction = draw.get("direction")
        if direction is None:
            direction = self.directions(self.spec)[int(draw["draw"][0])]
        names = list(env.arm_joint_names())
        offset = self.offset(direction, len(names), params["radius_rad"])
        env.set_arm_joint_offset(offset)
        return {"applied": self.readback(env), "expected": {"offset_rad": offset.tolist()}, "measured": {"joints": names}}

    def readback(self, env):
        return {"offset_rad": np.asarray(env.arm_joint_offset(), dtype=float).tolist()}

    def audit(self, spec, level, draw, perturbation, context):
        """The asked offset is the level's radius along the direction the seed stream's draw picks."""
        if draw is None:
            return []
        expected = perturbation.get("expected") if isinstance(perturbation.get("expected"), dict) else {}
        asked = expected.get("offset_rad") if isinstance(expected.get("offset_rad"), list) else []
        directions = self.directions(spec)
        if not asked or not 0 <= int(draw[0]) < len(directions):
            return ["no asked offset, or a pose index outside the poses"]
        want = self.offset(directions[int(draw[0])], len(asked), spec.level(level)["radius_rad"])
        if not max_abs_difference(asked, want.tolist()) <= READBACK_ATOL:
            return ["asked offset is not the level's radius along the seed stream's pose direction"]
        return []

    def calibration_intended(self, spec, level, view):
        """The settled joints read back as asked and a camera shows the arm moved (the wrist camera rides on it)."""
        return bool(view.readback_ok) and (not view.wrist_identical or view.third_person_change > self.min_image_change)


# --------------------------------------------------------------------------- sensor noise


def frame_rng(seed: int, frame: int, camera: str) -> np.random.Generator:
    """The generator of one frame's noise: the episode's draw, the frame's control step and the camera."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(int(frame), zlib.crc32(camera.encode()))))


def _grey(image: np.ndarray) -> np.ndarray:
    return np.asarray(image, dtype=float) @ np.array([0.299, 0.587, 0.114])


class ImageNoise(FactorKind):
    """ImageNet-C-style noise of the images the policy receives, LIBERO-Plus's parameters (``core.liberoplus``).

    Applied to the cameras of the roles in ``options.roles`` (LIBERO-Plus: the third-person image only), at the
    delivered resolution, with pixel parameters scaled from LIBERO-Plus's reference size
    (``options.reference_size_px``). A kind with randomness draws one seed per base episode from its factor's
    stream (shared by every level) and derives each frame's generator from it (:func:`frame_rng`). Measured on
    each camera's first delivered image beside its unperturbed render (``options.<measure>_range`` per level,
    frozen from renders); the frame's random parameters are recorded and recomputed by the audit.
    """

    side = "obs"
    family = "sensing"
    draw_kind = "seed"
    measure_name = "sharpness_ratio"
    calibration_trend = "sharpness"

    def draw(self, spec, rng, env=None):
        return {"draw": [int(rng.integers(0, 2 ** 31))], "draws_rejected": 0}

    def replay_draw(self, spec, rng, draws_rejected):
        """The episode's noise seed (never rejected)."""
        _never_rejected(draws_rejected)
        return self.draw(spec, rng)["draw"]

    def apply(self, env, params, draw):
        return {"applied": dict(params), "expected": dict(params)}

    def readback(self, env):
        return {}

    # what a subclass provides: the noise at scale s (delivered size / reference size), and the frame's random
    # parameters (JSON-ready) from the frame's generator
    def noise(self, image: np.ndarray, params: Mapping[str, float], scale: float,
              rng: Optional[np.random.Generator]) -> np.ndarray:
        raise NotImplementedError

    def frame_parameters(self, params: Mapping[str, float], rng: Optional[np.random.Generator],
                         shape: Sequence[int]) -> Dict[str, Any]:
        return {}

    def _options(self) -> Tuple[Tuple[str, ...], float]:
        options = getattr(self.spec, "options", None) or {}
        return tuple(options.get("roles", ("third_person",))), float(options.get("reference_size_px", 224))

    def _rng(self, draw, frame: int, camera: str) -> Optional[np.random.Generator]:
        return None if self.draw_kind == "none" or not draw else frame_rng(int(draw[0]), frame, camera)

    def transform(self, image, params):
        """The noise without randomness (frame 0 of a seed-0 stream): what a transform without a frame gives."""
        _, reference = self._options()
        return self.noise(image, params, image.shape[0] / reference, self._rng([0], 0, ""))

    def transform_frame(self, image, params, draw, frame, camera, role):
        roles, reference = self._options()
        if role not in roles:
            return image
        return self.noise(image, params, image.shape[0] / reference, self._rng(draw, frame, camera))

    def measure_frame(self, delivered, raw, params, draw, camera, role):
        roles, _ = self._options()
        if role not in roles:
            return {"role": role, "applied": False, "identical": bool(np.array_equal(delivered, raw))}
        return {"role": role, "applied": True, "shape": list(delivered.shape), **self.measure_images(delivered, raw),
                "frame0": self.frame_parameters(params, self._rng(draw, 0, camera), delivered.shape)}

    def measure_images(self, delivered: np.ndarray, raw: np.ndarray) -> Dict[str, Any]:
        raw_var, delivered_var = laplacian_variance(raw), laplacian_variance(delivered)
        return {"sharpness_ratio": delivered_var / raw_var if raw_var > 0 else None}

    def audit(self, spec, level, draw, perturbation, context):
        """Each camera of the noised roles measured inside the level's frozen range, its frame-0 random parameters
        those the seed stream gives; a camera of another role delivered untouched."""
        measured = perturbation.get("measured")
        if not isinstance(measured, dict):
            return ["no measurement of the delivered images"]
        cameras = measured.get("cameras")
        if not isinstance(cameras, dict) or (not cameras and context.images_delivered):
            return ["no camera's delivered image was measured"]
        low, high = _range(spec, f"{self.measure_name}_range", level)
        params = spec.level(level)
        problems = []
        for cam, m in sorted(cameras.items()):
            if not isinstance(m, dict):
                problems.append(f"{cam}: no measurement")
                continue
            if not m.get("applied"):
                if m.get("identical") is not True:
                    problems.append(f"{cam}: a camera the noise leaves alone was delivered changed")
                continue
            value = m.get(self.measure_name)
            if not (_number(value) and low <= value <= high):
                problems.append(f"{cam}: {self.measure_name} {value!r} outside the frozen range [{low:g}, {high:g}]")
            shape = m.get("shape") if isinstance(m.get("shape"), list) else [0, 0, 3]
            want = self.frame_parameters(params, self._rng(draw, 0, cam), shape)
            if m.get("frame0") != want:
                problems.append(f"{cam}: frame 0's noise parameters {m.get('frame0')} are not the seed stream's {want}")
        return problems

    def calibration_intended(self, spec, level, view):
        """The noised cameras' measure inside the level's frozen range: every camera's sharpness ratio to its clean
        render, or the third-person images' mean absolute pixel change (the measure the audit checks)."""
        low, high = _range(spec, f"{self.measure_name}_range", level)
        roles, _ = self._options()
        if self.measure_name == "mean_abs_change":
            return low <= view.third_person_change <= high
        return all(low <= x <= high for role, ratios in view.sharpness_ratios.items() if role in roles for x in ratios)


def motion_kernel(radius: float, sigma: float, angle_deg: float) -> np.ndarray:
    """ImageMagick's motion-blur kernel (``MotionBlurImage``): 2 ceil(radius) + 1 one-sided Gaussian taps (sigma)
    along the angle, as a 2-D correlation kernel."""
    width = 2 * int(math.ceil(radius)) + 1
    taps = np.arange(width, dtype=float)
    weights = np.exp(-taps ** 2 / (2.0 * sigma ** 2))
    weights /= weights.sum()
    a = math.radians(angle_deg)
    ox = np.ceil(taps * math.cos(a) - 0.5).astype(int)
    oy = np.ceil(taps * math.sin(a) - 0.5).astype(int)
    half = int(max(np.abs(ox).max(), np.abs(oy).max()))
    kernel = np.zeros((2 * half + 1, 2 * half + 1))
    np.add.at(kernel, (half + oy, half + ox), weights)
    return kernel


@FACTOR_KINDS.register("motion_blur")
class MotionBlur(ImageNoise):
    """Motion blur (ImageMagick's, as LIBERO-Plus calls it): a one-sided Gaussian line kernel of ``radius_px`` and
    ``sigma_px`` at an angle uniform in +-``max_angle_deg``, drawn per frame."""

    level_params = ("radius_px", "sigma_px", "max_angle_deg")

    def frame_parameters(self, params, rng, shape):
        return {"angle_deg": float(rng.uniform(-params["max_angle_deg"], params["max_angle_deg"]))}

    def noise(self, image, params, scale, rng):
        import cv2

        angle = self.frame_parameters(params, rng, image.shape)["angle_deg"]
        kernel = motion_kernel(max(params["radius_px"] * scale, 0.5), max(params["sigma_px"] * scale, 0.25), angle)
        out = cv2.filter2D(np.asarray(image, np.float32), -1, kernel.astype(np.float32), borderType=cv2.BORDER_REPLICATE)
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@FACTOR_KINDS.register("zoom_blur")
class ZoomBlur(ImageNoise):
    """Zoom blur: the image averaged with its centre zoomed by each factor of arange(``zoom_start``, ``zoom_stop``,
    ``zoom_step``) (deterministic)."""

    draw_kind = "none"
    level_params = ("zoom_start", "zoom_stop", "zoom_step")

    def draw(self, spec, rng, env=None):
        return {"draw": None, "draws_rejected": 0}

    def replay_draw(self, spec, rng, draws_rejected):
        _never_rejected(draws_rejected)
        return None

    @staticmethod
    def clipped_zoom(image: np.ndarray, factor: float) -> np.ndarray:
        import cv2

        h, w = image.shape[:2]
        ch, cw = int(math.ceil(h / factor)), int(math.ceil(w / factor))
        top, left = (h - ch) // 2, (w - cw) // 2
        zoomed = cv2.resize(image[top:top + ch, left:left + cw], (int(round(cw * factor)), int(round(ch * factor))),
                            interpolation=cv2.INTER_LINEAR)
        trim_top, trim_left = (zoomed.shape[0] - h) // 2, (zoomed.shape[1] - w) // 2
        return zoomed[trim_top:trim_top + h, trim_left:trim_left + w]

    def noise(self, image, params, scale, rng):
        x = np.asarray(image, np.float32) / 255.0
        factors = np.arange(params["zoom_start"], params["zoom_stop"], params["zoom_step"])
        out = np.zeros_like(x)
        for factor in factors:
            out += self.clipped_zoom(x, float(factor))
        x = (x + out) / (len(factors) + 1)
        return (np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)


def plasma_fractal(rng: np.random.Generator, mapsize: int = 256, wibble_decay: float = 3.0) -> np.ndarray:
    """A diamond-square height map in [0, 1] (ImageNet-C's ``plasma_fractal``), its randomness from ``rng``."""
    field = np.zeros((mapsize, mapsize))
    step, wibble = mapsize, 100.0

    def wibbled(array):
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while step >= 2:
        corner = field[0:mapsize:step, 0:mapsize:step]
        square = corner + np.roll(corner, shift=-1, axis=0)
        square += np.roll(square, shift=-1, axis=1)
        field[step // 2:mapsize:step, step // 2:mapsize:step] = wibbled(square)
        dr = field[step // 2:mapsize:step, step // 2:mapsize:step]
        ul = field[0:mapsize:step, 0:mapsize:step]
        ltsum = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        field[0:mapsize:step, step // 2:mapsize:step] = wibbled(ltsum)
        ttsum = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        field[step // 2:mapsize:step, 0:mapsize:step] = wibbled(ttsum)
        step //= 2
        wibble /= wibble_decay
    field -= field.min()
    return field / field.max()


@FACTOR_KINDS.register("fog")
class Fog(ImageNoise):
    """Fog: a plasma-fractal haze of ``strength`` (roughness ``wibble_decay``) added to the image, contrast scaled
    back; a new haze per frame. Measured by the contrast ratio (grey-level standard deviation over the render's)."""

    level_params = ("strength", "wibble_decay")
    # the haze has structure of its own, so neither sharpness nor contrast orders the levels on every scene: what is
    # audited per camera is how far the image moved (mean absolute pixel change, 0-255), and of the transform itself
    # the strength it applied, measured on a probe (``measure_transform``)
    measure_name = "mean_abs_change"
    calibration_trend = None

    def measure_transform(self, params):
        """The strength the transform applies, measured on two flat probes (grey 100 and 200, one white pixel each, so
        that both keep the maximum 1): the haze cancels in their difference, which the fog scales by 1 / (1 + s)."""
        low, high = np.full((16, 16, 3), 100, np.uint8), np.full((16, 16, 3), 200, np.uint8)
        low[0, 0] = high[0, 0] = 255
        rng = frame_rng(0, 0, "probe")
        state = rng.bit_generator.state
        a = self.noise(low, params, 1.0, rng).astype(float)
        rng.bit_generator.state = state  # the same haze over both probes
        b = self.noise(high, params, 1.0, rng).astype(float)
        ratio = float((b - a)[1:, 1:].mean() / 100.0)
        return {"probe": {"strength": 1.0 / ratio - 1.0 if ratio > 0 else None}}

    def field(self, params, rng) -> np.ndarray:
        _, reference = self._options()
        size = int(reference)
        return plasma_fractal(rng, 1 << max(8, (size - 1).bit_length()), params["wibble_decay"])[:size, :size]

    def frame_parameters(self, params, rng, shape):
        return {"field_sha256": hashlib.sha256(np.ascontiguousarray(self.field(params, rng)).tobytes()).hexdigest()}

    def noise(self, image, params, scale, rng):
        import cv2

        haze = self.field(params, rng)
        h, w = image.shape[:2]
        if haze.shape != (h, w):
            haze = cv2.resize(haze, (w, h), interpolation=cv2.INTER_LINEAR)
        x = np.asarray(image, float) / 255.0
        top = x.max()
        x = x + params["strength"] * haze[..., None]
        return (np.clip(x * top / (top + params["strength"]), 0.0, 1.0) * 255).astype(np.uint8)

    def measure_images(self, delivered, raw):
        raw_std, delivered_std = float(_grey(raw).std()), float(_grey(delivered).std())
        return {"mean_abs_change": float(np.abs(np.asarray(delivered, float) - np.asarray(raw, float)).mean()),
                "contrast_ratio": delivered_std / raw_std if raw_std > 0 else None,
                "brightness_delta": float(_grey(delivered).mean() - _grey(raw).mean())}

    def audit(self, spec, level, draw, perturbation, context):
        """The cameras' checks (:meth:`ImageNoise.audit`), and the strength measured on the probe within
        ``options.strength_rtol`` of the level's."""
        problems = super().audit(spec, level, draw, perturbation, context)
        measured = perturbation.get("measured") if isinstance(perturbation.get("measured"), dict) else {}
        strength = (measured.get("probe") or {}).get("strength") if isinstance(measured.get("probe"), dict) else None
        want, rtol = spec.level(level)["strength"], float(spec.options.get("strength_rtol", 0.05))
        if not max_abs_difference(strength, want) <= rtol * want:
            problems.append(f"measured fog strength {strength!r} is not the frozen {want:g} (tolerance {rtol:g})")
        return problems



@FACTOR_KINDS.register("glass_blur")
class GlassBlur(ImageNoise):
    """Glass blur: Gaussian blur (``sigma_px``), ``iterations`` rounds of local pixel displacement by up to
    ``max_delta_px`` (a random gather; LIBERO-Plus swaps pixels one by one in a Python loop), Gaussian blur again.
    A new displacement field per frame."""

    level_params = ("sigma_px", "max_delta_px", "iterations")
    # the shuffle adds fine detail while the blur removes it, so sharpness does not order the levels: what is
    # audited is how far the image moved, the mean absolute change of its pixels (0-255)
    measure_name = "mean_abs_change"
    calibration_trend = None

    def measure_images(self, delivered, raw):
        return {"mean_abs_change": float(np.abs(np.asarray(delivered, float) - np.asarray(raw, float)).mean()),
                **super().measure_images(delivered, raw)}

    @staticmethod
    def _gauss(x: np.ndarray, sigma: float) -> np.ndarray:
        import cv2

        return cv2.GaussianBlur(x, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REPLICATE)

    def displacements(self, params, rng, shape, scale) -> List[np.ndarray]:
        delta = max(1, int(round(params["max_delta_px"] * scale)))
        h, w = int(shape[0]), int(shape[1])
        return [rng.integers(-delta, delta, size=(2, h, w)) for _ in range(int(params["iterations"]))]

    def frame_parameters(self, params, rng, shape):
        _, reference = self._options()
        fields = self.displacements(params, rng, shape, int(shape[0]) / reference)
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(f, dtype=np.int64).tobytes() for f in fields))
        return {"field_sha256": digest.hexdigest()}

    def noise(self, image, params, scale, rng):
        sigma = max(params["sigma_px"] * scale, 0.25)
        x = (np.clip(self._gauss(np.asarray(image, float) / 255.0, sigma), 0, 1) * 255).astype(np.uint8)
        h, w = x.shape[:2]
        rows, cols = np.arange(h)[:, None], np.arange(w)[None, :]
        for dy, dx in self.displacements(params, rng, x.shape, scale):
            x = x[np.clip(rows + dy, 0, h - 1), np.clip(cols + dx, 0, w - 1)]
        return (np.clip(self._gauss(x.astype(float) / 255.0, sigma), 0.0, 1.0) * 255).astype(np.uint8)


# --------------------------------------------------------------------------- deployment shifts


class LoopKind(FactorKind):
    """A deployment shift: nothing in the simulator or the images changes; the rollout loop does, through the kind's
    ``wrapper`` (``core/loop_wrappers.py``). The wrapper records what it did (``measured``), which the audit checks
    against the level."""

    side = "loop"
    family = "deployment"
    param = ""  # the level's parameter
    wrapper = LoopWrapper  # the wrapper class the rollout composes at the policy/environment boundary
    min_steps = 0

    def loop_wrapper(self, params, draw=None):
        """The level's wrapper, its ``measured`` started with the level's steps."""
        steps = self.steps(params)
        if steps < self.min_steps:
            raise SpecError(getattr(self.spec, "path", "?"), self.param, f"expected at least {self.min_steps} step")
        return self.wrapper(self.param, steps)

    def apply(self, env, params, draw):
        value = {self.param: params[self.param]}
        return {"applied": dict(value), "expected": dict(value)}

    def readback(self, env):
        return {}

    def steps(self, params) -> int:
        value = params[self.param]
        if value != int(value) or value < 0:
            raise SpecError(getattr(self.spec, "path", "?"), self.param, f"expected a whole number of steps, got {value}")
        return int(value)


@FACTOR_KINDS.register("action_latency")
class ActionLatency(LoopKind):
    """The policy's action executed ``delay_steps`` control steps after it was produced."""

    level_params = ("delay_steps",)
    param = "delay_steps"
    wrapper = ActionDelay

    def measured_problems(self, spec, level, measured, images_delivered=True):
        """Every executed policy action lagged exactly the level's steps; the idle actions were the first ones."""
        k = int(spec.level(level)[self.param])
        if not isinstance(measured, dict):
            return ["no measurement of the action delay"]
        problems = []
        steps, idle = measured.get("steps"), measured.get("idle_steps")
        if not (isinstance(steps, int) and isinstance(idle, int)) or idle != min(k, steps):
            problems.append(f"{idle!r} idle steps executed, expected min({k}, {steps!r})")
        if isinstance(steps, int) and steps > k and (measured.get("lag_min") != k or measured.get("lag_max") != k):
            problems.append(f"executed actions lagged {measured.get('lag_min')!r}-{measured.get('lag_max')!r} steps, "
                            f"not {k}")
        return problems


@FACTOR_KINDS.register("observation_latency")
class ObservationLatency(LoopKind):
    """The policy receives the observation (images, proprioception, privileged state) rendered ``delay_steps``
    control steps before it acts (the first observation before then)."""

    level_params = ("delay_steps",)
    param = "delay_steps"
    wrapper = ObservationDelay

    def measured_problems(self, spec, level, measured, images_delivered=True):
        """Every observation the policy received was min(delay, step) steps old."""
        k = int(spec.level(level)[self.param])
        if not isinstance(measured, dict):
            return ["no measurement of the observation delay"]
        n, full, clamped = (measured.get(key) for key in ("boundaries", "full_delay", "clamped"))
        if not all(isinstance(v, int) for v in (n, full, clamped)) or full + clamped != n:
            return [f"of {n!r} observations, {full!r} were {k} steps old and {clamped!r} the first one: others were "
                    "another age"]
        if full and measured.get("age_max") != k:
            return [f"the oldest observation delivered was {measured.get('age_max')!r} steps old, not {k}"]
        return []


@FACTOR_KINDS.register("action_hold")
class ActionHold(LoopKind):
    """A lower control rate: the policy acts every ``hold_steps`` control steps, each of its actions held that long
    (a chunk of n actions lasts n * hold_steps steps)."""

    level_params = ("hold_steps",)
    param = "hold_steps"
    wrapper = ActionRepeat
    min_steps = 1  # an action is held at least one step

    def measured_problems(self, spec, level, measured, images_delivered=True):
        """Every policy action that ran to its end was held exactly the level's steps."""
        k = int(spec.level(level)[self.param])
        if not isinstance(measured, dict) or not isinstance(measured.get("held_actions"), int):
            return ["no measurement of the held actions"]
        if measured["held_actions"] and (measured.get("hold_min") != k or measured.get("hold_max") != k):
            return [f"actions were held {measured.get('hold_min')!r}-{measured.get('hold_max')!r} steps, not {k}"]
        return []


__all__ = ["ActionHold", "ActionLatency", "ArmJointOffset", "CameraPose", "FAMILIES", "Fog", "GlassBlur",
           "ImageNoise", "InstructionGraded", "LoopKind", "MotionBlur", "ObservationLatency", "ZoomBlur",
           "frame_rng", "mat_to_quat", "motion_kernel", "plasma_fractal"]
