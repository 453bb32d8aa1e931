"""Factor kinds: the code that applies a frozen perturbation level.

The numbers live in ``perturbations/*.yaml`` (see :mod:`robocasa_shift.core.specs`);
a kind says how to draw, apply and read back. Environment-side kinds act on the
simulator after reset and after the pre-perturbation fingerprint; observation-
side kinds transform every RGB image the policy receives. Every application
returns a runtime record of what the simulator holds afterwards, read back
from the model and state, beside what the spec and the draw asked for; the
audit compares the two.

Kinds never stack: an environment restores its nominal model values before
every reset, and kinds compute from those nominal values, not from the
current ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.core.conditions import Condition
from robocasa_shift.errors import PerturbationError
from robocasa_shift.geometry import axis_angle_quat, quat_mul, quat_to_mat
from robocasa_shift.registry import Registry

# The kinds of the paper's four factors are registered below; LIBERO-Plus's dimensions and the deployment shifts
# where they are written (core/shifts.py), imported when the registry is first read.
FACTOR_KINDS: Registry[type] = Registry("factor kind", "robocasa_shift.factors", modules=("robocasa_shift.core.shifts", "robocasa_shift.core.dynamics"))

# Read-back values equal what was asked up to float64 round-off of the
# rotations; anything larger is a perturbation that did not land. A kind whose
# values the simulator holds less exactly declares its own ``readback_atol``.
READBACK_ATOL = 1e-9
# MuJoCo holds light colours (mjModel.light_* and vis.headlight.*) as float32: a colour in [0, 1] written
# from a float64 product reads back within half a float32 ulp of 1.0, 2**-24.
FLOAT32_COLOUR_ATOL = 2.0 ** -24
# A base offset is read back after the simulator settles the scene with the base placed (RoboCasa's
# kitchens: 10 control steps of physics at a zero velocity command). The base joints are float64 and
# the placement itself is exact, but the clean and the offset placement settle differently: the base
# joints' velocity controller holds zero against contact and arm reaction forces, and the two drift
# apart by up to 1e-8 m and 4e-6 deg (measured on the stand-in kitchens). 1e-5 (metres and degrees)
# bounds that with a margin and stays 2000 times below the smallest frozen level (2 cm, 2 deg).
SETTLED_BASE_ATOL = 1e-5


def rotate_in_place(quat: np.ndarray, vertical: np.ndarray, yaw_deg: float, pitch_deg: float) -> np.ndarray:
    """A camera orientation yawed about the vertical through its centre and pitched about its own x axis.

    ``quat`` is the camera's orientation in its parent body's frame and
    ``vertical`` the world vertical expressed in that frame. MuJoCo cameras
    look along their -z axis with x to the right, so pitch is a rotation about
    the camera's x axis (applied in the camera frame) and yaw one about the
    vertical (applied in the parent frame).
    """
    q_yaw = axis_angle_quat(vertical, np.deg2rad(yaw_deg))
    q_pitch = axis_angle_quat([1.0, 0.0, 0.0], np.deg2rad(pitch_deg))
    q = quat_mul(quat_mul(q_yaw, quat), q_pitch)
    return q / np.linalg.norm(q)


def in_place_offsets(nominal: np.ndarray, current: np.ndarray, vertical: np.ndarray) -> tuple:
    """Recover (yaw_deg, pitch_deg) with ``current == rotate_in_place(nominal, vertical, yaw, pitch)``."""
    r0, r1 = quat_to_mat(nominal), quat_to_mat(current)
    v = np.asarray(vertical, float) / np.linalg.norm(vertical)
    # Pitch about the camera's x axis leaves x fixed, so the yaw is the angle
    # between the x axes, measured about the vertical.
    x0, x1 = r0[:, 0] - v * (r0[:, 0] @ v), r1[:, 0] - v * (r1[:, 0] @ v)
    yaw = np.arctan2(np.cross(x0, x1) @ v, x0 @ x1)
    m = r0.T @ quat_to_mat(axis_angle_quat(v, -yaw)) @ r1  # the pure pitch left over
    pitch = np.arctan2(m[2, 1], m[1, 1])
    return float(np.rad2deg(yaw)), float(np.rad2deg(pitch))


# --------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class AuditContext:
    """What the audit knows of a record beyond its perturbation: the run's third-person cameras (None when the
    manifest does not say) and whether the rollout rendered any image for its policy."""

    third_person_cameras: Optional[Sequence[str]] = None
    images_delivered: bool = True


@dataclass(frozen=True)
class CalibrationView:
    """One condition's model-free renders measured against the clean ones (``checks.calibration``), per camera role.

    Attributes:
        brightness, clean_brightness: mean grey level of the role's images, perturbed and clean.
        sharpness_ratios: per role, each camera's Laplacian variance over its clean render's.
        third_person_change: mean absolute pixel change of the third-person images.
        wrist_identical: every wrist image equals its clean render.
        readback_ok: the perturbation's read-back matched what was asked (None when nothing was applied).
    """

    brightness: Mapping[str, float] = field(default_factory=dict)
    clean_brightness: Mapping[str, float] = field(default_factory=dict)
    sharpness_ratios: Mapping[str, Sequence[float]] = field(default_factory=dict)
    third_person_change: float = 0.0
    wrist_identical: bool = True
    readback_ok: Optional[bool] = None


class FactorKind:
    """How one kind of factor is drawn, applied and read back."""

    side = "env"  # "env": edits the simulator; "obs": transforms images; "instruction": replaces the words;
    # "loop": changes the rollout loop itself (when actions apply, which observation the policy sees, how often it acts)
    family: Optional[str] = None  # scene, sensing, embodiment, language, deployment or dynamics (core.shifts.FAMILIES)
    spec = None  # the factor spec this instance serves (set by ``factor_kind``)
    draw_kind = "none"
    readback_atol = READBACK_ATOL  # read back vs asked: what the simulator can hold of this kind's values
    level_params: tuple = ()
    requires: tuple = ()  # backend hooks the kind calls (names in ``core.backend.HOOKS``)

    def draw(self, spec, rng: np.random.Generator, env=None) -> Dict[str, Any]:
        """The episode's random draw, shared by every level of the factor."""
        return {"draw": None, "draws_rejected": 0}

    def apply(self, env, params: Dict[str, float], draw: Dict[str, Any]) -> Dict[str, Any]:
        """Apply a level; return ``{"applied": read back, "expected": asked for}``."""
        raise NotImplementedError

    def readback(self, env) -> Dict[str, Any]:
        """What the simulator holds now, in the shape of ``apply``'s ``expected``."""
        raise NotImplementedError

    def transform(self, image: np.ndarray, params: Dict[str, float]) -> np.ndarray:
        """An observation-side kind's transform of one RGB image (identity for env-side kinds)."""
        return image

    def transform_frame(self, image: np.ndarray, params: Dict[str, float], draw: Optional[Dict[str, Any]],
                        frame: int, camera: str, role: str) -> np.ndarray:
        """The transform of one delivered image: ``frame`` (the control step it was rendered at), ``camera`` and its
        ``role`` let a kind draw per-frame randomness from its episode's draw and leave a role alone; by default
        :meth:`transform`."""
        return self.transform(image, params)

    def measure_frame(self, delivered: np.ndarray, raw: np.ndarray, params: Dict[str, float],
                      draw: Optional[Dict[str, Any]], camera: str, role: str) -> Dict[str, Any]:
        """What is measured on a camera's first delivered image beside its unperturbed render; by default
        :meth:`measure`."""
        return self.measure(delivered, raw, params)

    def loop_wrapper(self, params: Dict[str, float], draw: Optional[List[float]] = None) -> Any:
        """A loop-side kind's wrapper of the rollout loop for a level and the episode's draw
        (``core/loop_wrappers.py``); only loop-side kinds have one."""
        raise NotImplementedError(f"{type(self).__name__} is not a loop-side kind")

    def replay_draw(self, spec, rng: np.random.Generator, draws_rejected: int) -> Optional[List[float]]:
        """The draw a record must carry, recomputed from the episode's draw stream (the audit calls it).

        Args:
            spec: the factor spec.
            rng: a fresh generator of the episode's draw stream (``seeding.draw_rng``).
            draws_rejected: how many draws the record says were rejected before the accepted one.

        Returns:
            The accepted draw, or None for a kind without a random draw.

        Raises:
            ValueError: ``draws_rejected`` is not what this kind can reject (0 unless it rejects draws).
        """
        _never_rejected(draws_rejected)
        return None

    def measure_transform(self, params: Dict[str, float]) -> Dict[str, Any]:
        """What an observation-side kind measures of its transform itself, once per rollout ({} by default)."""
        return {}

    def measure(self, delivered: np.ndarray, raw: np.ndarray, params: Dict[str, float]) -> Dict[str, Any]:
        """What an observation-side kind measures on one delivered image beside its unperturbed render."""
        return {}

    def measured_problems(self, spec, level: str, measured: Any, images_delivered: bool = True) -> List[str]:
        """Problems with a record's ``measured`` entry against the frozen spec ([] for kinds that measure nothing);
        ``images_delivered``: whether the rollout rendered any image for its policy."""
        return []

    def audit(self, spec, level: str, draw: Optional[List[float]], perturbation: Mapping[str, Any],
              context: AuditContext) -> List[str]:
        """This kind's own checks of a record's perturbation, beyond the audit's generic ones (factor, level and
        parameters, read-back, the draw recomputed from its seed stream).

        Args:
            spec: the factor spec; level: the record's level.
            draw: the draw recomputed from the episode's seed stream (None for a kind without one).
            perturbation: the record's perturbation runtime record.
            context: what the audit knows beyond it.

        Returns:
            Problems, [] when there are none: by default those of :meth:`measured_problems`.
        """
        return self.measured_problems(spec, level, perturbation.get("measured"), context.images_delivered)

    # The calibration measure this kind lowers, level by level (``brightness`` or ``sharpness``; None: none):
    # the calibration warns where a higher level does not lower it.
    calibration_trend: Optional[str] = None

    def calibration_intended(self, spec, level: str, view: CalibrationView) -> bool:
        """Whether the level changed the renders as this kind intends (the calibration's check): by default,
        whether what was applied reads back."""
        return bool(view.readback_ok)


def _never_rejected(draws_rejected: Any) -> None:
    """Refuse a rejected-draw count other than 0 from a kind that never rejects a draw."""
    if draws_rejected != 0 or isinstance(draws_rejected, bool):
        raise ValueError(f"this kind never rejects a draw, but the record says {draws_rejected!r} were rejected")


def moved_third_person_cameras(perturbation: Dict[str, Any], context, verb: str) -> Tuple[Dict[str, Any], List[str]]:
    """A camera factor's expected values per camera, and a problem unless those cameras are the third-person ones."""
    expected = perturbation.get("expected") if isinstance(perturbation.get("expected"), dict) else {}
    cameras, wanted = sorted(expected), context.third_person_cameras
    if not cameras or (wanted is not None and cameras != sorted(wanted)):
        return expected, [f"{verb} cameras {cameras} are not the third-person cameras "
                          f"{wanted if wanted is not None else '(any)'}"]
    return expected, []


def max_abs_difference(applied: Any, expected: Any) -> float:
    """Largest absolute difference between two nested structures of numbers.

    NaN-safe: a shape or key mismatch, a missing value (None), a non-number or a NaN on either
    side is ``inf``, never NaN, so ``difference > tol`` and ``not difference <= tol`` agree.
    """
    if isinstance(expected, dict) or isinstance(applied, dict):
        if not (isinstance(applied, dict) and isinstance(expected, dict)) or set(applied) != set(expected):
            return float("inf")
        return max([max_abs_difference(applied[k], expected[k]) for k in expected] or [0.0])
    try:
        a, e = np.asarray(applied, dtype=float), np.asarray(expected, dtype=float)
    except (TypeError, ValueError):
        return float("inf")
    if a.shape != e.shape:
        return float("inf")
    if not a.size:
        return 0.0
    diff = np.abs(a - e)
    # None reads as NaN; NaN - NaN is NaN and inf - inf too: each is a value that cannot be checked
    return float("inf") if np.isnan(diff).any() else float(np.max(diff))


@FACTOR_KINDS.register("light_scale")
class LightScale(FactorKind):
    """Every scene light's diffuse, ambient and specular colour, and the headlight's, times alpha."""

    family = "scene"
    level_params = ("alpha",)
    requires = ("lights",)
    calibration_trend = "brightness"
    readback_atol = FLOAT32_COLOUR_ATOL  # light colours are float32 in the model

    def calibration_intended(self, spec, level, view):
        """Every camera role darker than clean."""
        return all(view.brightness[r] < view.clean_brightness[r] for r in view.brightness)

    def apply(self, env, params, draw):
        nominal = env.nominal_lights()
        scaled = {k: (np.asarray(v) * params["alpha"]).tolist() for k, v in nominal.items()}
        env.set_lights(scaled)
        return {"applied": self.readback(env), "expected": scaled}

    def readback(self, env):
        return {k: np.asarray(v).tolist() for k, v in env.lights().items()}


@FACTOR_KINDS.register("camera_rotation")
class CameraRotation(FactorKind):
    """Third-person cameras rotated in place by (yaw, pitch) = theta_max * u, u uniform in the unit disk."""

    family = "sensing"
    draw_kind = "unit_disk"
    level_params = ("theta_max_deg",)
    requires = ("cameras",)
    min_image_change = 0.5  # mean absolute pixel change (0-255) of the third-person images that counts as "it moved"

    def audit(self, spec, level, draw, perturbation, context):
        """The rotated cameras are the third-person ones, each by the scaled draw of the seed stream."""
        if draw is None:
            return []
        expected, problems = moved_third_person_cameras(perturbation, context, "rotated")
        scaled = [spec.level(level)["theta_max_deg"] * u for u in draw]
        for cam in sorted(expected):
            values = expected[cam] if isinstance(expected[cam], dict) else {}
            if not max_abs_difference([values.get("yaw_deg"), values.get("pitch_deg")], scaled) <= READBACK_ATOL:
                problems.append(f"{cam} offset is not the scaled draw of the seed stream")
        return problems

    def calibration_intended(self, spec, level, view):
        """The third-person images moved; the wrist images did not."""
        return view.third_person_change > self.min_image_change and view.wrist_identical

    def draw(self, spec, rng, env=None):
        radius, angle = np.sqrt(rng.uniform()), rng.uniform(0.0, 2.0 * np.pi)
        return {"draw": [float(radius * np.cos(angle)), float(radius * np.sin(angle))], "draws_rejected": 0}

    def replay_draw(self, spec, rng, draws_rejected):
        """The unit-disk draw (never rejected: any rotation of the camera is a valid state)."""
        _never_rejected(draws_rejected)
        return self.draw(spec, rng)["draw"]

    def apply(self, env, params, draw):
        yaw, pitch = (params["theta_max_deg"] * u for u in draw["draw"])
        expected = {}
        for cam in env.third_person_cameras:
            quat = rotate_in_place(env.nominal_camera_quat(cam), env.camera_vertical(cam), yaw, pitch)
            env.set_camera_quat(cam, quat)
            expected[cam] = {"quat": quat.tolist(), "yaw_deg": yaw, "pitch_deg": pitch}
        return {"applied": self.readback(env), "expected": expected}

    def readback(self, env):
        out = {}
        for cam in env.third_person_cameras:
            quat = np.asarray(env.camera_quat(cam), dtype=float)
            yaw, pitch = in_place_offsets(env.nominal_camera_quat(cam), quat, env.camera_vertical(cam))
            out[cam] = {"quat": quat.tolist(), "yaw_deg": yaw, "pitch_deg": pitch}
        return out


@FACTOR_KINDS.register("base_offset")
class BaseOffset(FactorKind):
    """Mobile-base (forward, side) offset sigma_xy_m * z[:2] and yaw sigma_psi_deg * z[2], z standard normal.

    The draw is valid only if the scaled offset gives a valid initial state at
    every level; otherwise the next draw of the same stream replaces it for all
    levels (never a per-level redraw).
    """

    family = "embodiment"
    draw_kind = "standard_normal_3"
    level_params = ("sigma_xy_m", "sigma_psi_deg")
    requires = ("base",)
    readback_atol = SETTLED_BASE_ATOL  # read back after the scene settles with the base placed

    @staticmethod
    def offset(params, z) -> Dict[str, float]:
        return {
            "forward_m": params["sigma_xy_m"] * z[0],
            "side_m": params["sigma_xy_m"] * z[1],
            "yaw_deg": params["sigma_psi_deg"] * z[2],
        }

    def draw(self, spec, rng, env=None):
        max_draws = int(spec.options.get("max_draws", 50))
        reasons: List[str] = []
        for attempt in range(max_draws):
            z = rng.standard_normal(3).tolist()
            problems = [] if env is None else [env.base_offset_problem(self.offset(spec.level(lv), z)) for lv in spec.levels]
            problems = [p for p in problems if p]
            if not problems:
                return {"draw": z, "draws_rejected": attempt, "rejection_reasons": reasons}
            reasons.append(problems[0])
        raise PerturbationError(f"no valid base draw in {max_draws} draws; last problem: {reasons[-1]}")

    def replay_draw(self, spec, rng, draws_rejected):
        """The ``draws_rejected + 1``-th standard-normal triple of the stream: the rejected ones come first.

        Raises:
            ValueError: ``draws_rejected`` is not an integer in ``[0, max_draws)``.
        """
        max_draws = int(spec.options.get("max_draws", 50))
        is_int = isinstance(draws_rejected, int) and not isinstance(draws_rejected, bool)
        if not (is_int and 0 <= draws_rejected < max_draws):
            raise ValueError(f"draws_rejected must be an integer in [0, {max_draws}), got {draws_rejected!r}")
        for _ in range(draws_rejected + 1):
            z = rng.standard_normal(3).tolist()  # exactly as draw() takes them, so the stream lines up
        return z

    def audit(self, spec, level, draw, perturbation, context):
        """The base offset is the level's scaling of the seed stream's draw."""
        if draw is None or max_abs_difference(perturbation.get("expected"), self.offset(spec.level(level), draw)) <= READBACK_ATOL:
            return []
        return ["base offset is not the scaled draw of the seed stream"]

    def apply(self, env, params, draw):
        expected = self.offset(params, draw["draw"])
        env.set_base_offset(expected)
        return {"applied": self.readback(env), "expected": expected}

    def readback(self, env):
        return {k: float(v) for k, v in env.base_offset().items()}


def laplacian_variance(image: np.ndarray) -> float:
    """Sharpness of an RGB uint8 image: the variance of the Laplacian of its grey levels."""
    import cv2

    return float(cv2.Laplacian(cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY), cv2.CV_64F).var())


# The step-edge probe the blur kernel is measured on: 0 | 255 across the middle of a small RGB image.
# 129 columns hold the widest kernel of any frozen level (4 px: 25 taps) far from the borders.
_EDGE_PROBE_SHAPE = (9, 129, 3)


@FACTOR_KINDS.register("gaussian_blur")
class GaussianBlur(FactorKind):
    """cv2.GaussianBlur(img, (0, 0), sigmaX=s, sigmaY=s), default border, uint8 in and out.

    The read-back of an observation-side kind equals what it asked for by construction, so a blur
    rollout also records what was measured (:meth:`measure`): the kernel the transform actually
    applies, measured through the transform on a step edge, and per camera the sharpness ratio of
    the delivered image (variance of the Laplacian of the delivered image over that of the same
    render unblurred). The spec freezes the expected ratio range per level
    (``options.sharpness_ratio_range``) and the tolerance on the measured kernel width
    (``options.kernel_sigma_rtol``); :meth:`measured_problems` checks a record against them.
    """

    side = "obs"
    family = "sensing"
    level_params = ("sigma_px",)
    calibration_trend = "sharpness"

    def calibration_intended(self, spec, level, view):
        """Every camera's sharpness ratio to its clean render inside the level's frozen range (the one the audit checks)."""
        (low, high), _ = self.frozen_checks(spec, level)
        return all(low <= x <= high for ratios in view.sharpness_ratios.values() for x in ratios)

    def apply(self, env, params, draw):
        return {"applied": {"sigma_px": params["sigma_px"]}, "expected": {"sigma_px": params["sigma_px"]}}

    def transform(self, image, params):
        import cv2

        s = params["sigma_px"]
        return cv2.GaussianBlur(image, (0, 0), sigmaX=s, sigmaY=s)

    def measured_kernel(self, params: Dict[str, float]) -> Dict[str, float]:
        """The kernel :meth:`transform` applies, measured on a step edge (0 | 255) passed through it.

        Returns:
            ``sigma_px``: the standard deviation of the line spread function (the derivative of the
            blurred edge), ``support_px``: how many pixels of it are non-zero after uint8 rounding.
        """
        probe = np.zeros(_EDGE_PROBE_SHAPE, np.uint8)
        probe[:, _EDGE_PROBE_SHAPE[1] // 2:] = 255
        edge = np.asarray(self.transform(probe, params), dtype=float)[_EDGE_PROBE_SHAPE[0] // 2, :, 0] / 255.0
        spread = np.diff(edge)
        total = spread.sum()
        if total <= 0:  # the edge vanished or inverted: no kernel to speak of
            return {"sigma_px": float("nan"), "support_px": int(np.count_nonzero(spread))}
        x = np.arange(len(spread), dtype=float)
        mean = float((spread * x).sum() / total)
        sigma = float(np.sqrt(max(0.0, (spread * (x - mean) ** 2).sum() / total)))
        return {"sigma_px": sigma, "support_px": int(np.count_nonzero(spread))}

    def measure_transform(self, params):
        """``{"kernel": measured_kernel(params)}``."""
        return {"kernel": self.measured_kernel(params)}

    def measure(self, delivered, raw, params):
        """Sharpness of the delivered image over the same render unblurred (None when the render is flat)."""
        raw_var, delivered_var = laplacian_variance(raw), laplacian_variance(delivered)
        ratio = delivered_var / raw_var if raw_var > 0 else None
        return {"sharpness_ratio": ratio, "laplacian_var_raw": raw_var, "laplacian_var_delivered": delivered_var,
                "shape": list(delivered.shape)}

    @staticmethod
    def frozen_checks(spec, level: str) -> Tuple[Tuple[float, float], float]:
        """The level's frozen sharpness-ratio range and the kernel-width tolerance.

        Raises:
            SpecError: the spec lacks them or they are malformed (a range is ``[low, high]``, 0 <= low < high).
        """
        from robocasa_shift.errors import SpecError

        ranges = spec.options.get("sharpness_ratio_range")
        bounds = ranges.get(level) if isinstance(ranges, dict) else None
        rtol = spec.options.get("kernel_sigma_rtol")
        ok_bounds = (isinstance(bounds, list) and len(bounds) == 2
                     and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
                     and 0 <= bounds[0] < bounds[1])
        if not ok_bounds:
            raise SpecError(spec.path, f"options.sharpness_ratio_range.{level}",
                            f"expected [low, high] with 0 <= low < high, got {bounds!r}")
        if not (isinstance(rtol, (int, float)) and not isinstance(rtol, bool) and 0 < rtol < 1):
            raise SpecError(spec.path, "options.kernel_sigma_rtol", f"expected a number in (0, 1), got {rtol!r}")
        return (float(bounds[0]), float(bounds[1])), float(rtol)

    def measured_problems(self, spec, level, measured, images_delivered: bool = True):
        """Kernel width within the frozen tolerance of ``sigma_px``; every camera's ratio inside the frozen range.

        A rollout that rendered no image (its policy reads no camera: ``expert``, ``random``) delivered
        nothing to blur, so it has no camera to measure; one that rendered images must have them measured.
        """
        (low, high), rtol = self.frozen_checks(spec, level)
        if not isinstance(measured, dict):
            return ["no measurement of the delivered images"]
        problems = []
        sigma = spec.level(level)["sigma_px"]
        kernel = measured.get("kernel") if isinstance(measured.get("kernel"), dict) else {}
        if not max_abs_difference(kernel.get("sigma_px"), sigma) <= rtol * sigma:
            problems.append(f"measured kernel sigma {kernel.get('sigma_px')!r} px is not the frozen "
                            f"{sigma:g} px (tolerance {rtol:g})")
        cameras = measured.get("cameras")
        if not isinstance(cameras, dict) or (not cameras and images_delivered):
            problems.append("no camera's delivered image was measured")
            cameras = {}
        for cam, m in sorted(cameras.items()):
            ratio = m.get("sharpness_ratio") if isinstance(m, dict) else None
            ok = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and low <= ratio <= high
            if not ok:
                problems.append(f"{cam}: sharpness ratio {ratio!r} outside the frozen range [{low:g}, {high:g}]")
        return problems


@FACTOR_KINDS.register("instruction_paraphrase")
class InstructionParaphrase(FactorKind):
    """The instruction the policy receives replaced by the task's ``paraphrase``-th paraphrase.

    Nothing in the simulator changes, so the pair shares scene, initial state and physics and
    differs only in words. The backend supplies the paraphrases (``instructions`` hook); the read-back
    is whether the delivered text differs from the task's instruction (1) or not (0), and the
    record keeps both texts (``measured``), which the audit checks.
    """

    side = "instruction"
    family = "language"
    level_params = ("paraphrase",)
    requires = ("instructions",)

    def apply(self, env, params, draw):
        n = params["paraphrase"]
        paraphrases = list(env.instruction_paraphrases())
        if n != int(n) or not 1 <= n <= len(paraphrases):
            raise PerturbationError(f"paraphrase {n:g} asked for, but task '{env.task.name}' has "
                                    f"{len(paraphrases)} paraphrase(s) of its instruction")
        text = paraphrases[int(n) - 1]
        return {"applied": {"changed": float(text != env.task.instruction)}, "expected": {"changed": 1.0},
                "measured": self.measure_instruction(env.task.instruction, text)}

    @staticmethod
    def measure_instruction(clean: str, delivered: str) -> Dict[str, Any]:
        import hashlib

        return {"instruction": delivered, "clean_instruction": clean,
                "instruction_sha256": hashlib.sha256(delivered.encode()).hexdigest()}

    def readback(self, env):
        return {"changed": None}

    def measured_problems(self, spec, level, measured, images_delivered: bool = True):
        """The delivered text: present, other than the task's instruction, and the one its hash names."""
        if not isinstance(measured, dict) or not isinstance(measured.get("instruction"), str):
            return ["no delivered instruction recorded"]
        problems = []
        text = measured["instruction"]
        if not text.strip() or text == measured.get("clean_instruction"):
            problems.append(f"delivered instruction {text!r} is empty or the task's own instruction")
        if measured != self.measure_instruction(str(measured.get("clean_instruction")), text):
            problems.append("delivered instruction does not match its recorded sha256")
        return problems


def delivered_instruction(instruction: str, perturbation: Optional[Dict[str, Any]]) -> str:
    """The instruction a rollout's policy received: the task's own, or the one an instruction-side factor delivered."""
    for entry in perturbation_entries(perturbation):
        measured = entry.get("measured")
        if isinstance(measured, dict) and isinstance(measured.get("instruction"), str):
            return measured["instruction"]
    return instruction


def perturbation_entries(perturbation: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The per-factor runtime records of a rollout's perturbation: [] for clean, the record itself for one factor,
    ``entries`` (one per factor, in the condition's order) for a combined condition."""
    if not isinstance(perturbation, Mapping):
        return []
    if "entries" in perturbation:
        entries = perturbation.get("entries")
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    return [dict(perturbation)] if not isinstance(perturbation, dict) else [perturbation]


def combined_perturbation(condition: str, entries: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The runtime record of a combined condition: one entry per factor (each as a single factor's record), ``ok``
    when every entry read back, and the largest read-back error."""
    return {"condition": condition, "entries": list(entries), "ok": all(bool(e.get("ok")) for e in entries),
            "max_abs_error": max([float(e.get("max_abs_error", 0.0)) for e in entries] or [0.0])}


def factor_kind(spec) -> FactorKind:
    """An instance of the kind a factor spec names, bound to the spec (``kind.spec``)."""
    kind = FACTOR_KINDS.get(spec.kind)()
    kind.spec = spec
    return kind


def required_hooks(protocol, factors: Optional[Iterable[str]] = None) -> Dict[str, Tuple[str, ...]]:
    """Factor name -> the backend hooks its kind requires, for ``factors`` (default: the matrix's)."""
    names = [f for f in protocol.factors if f not in protocol.optional_factors] if factors is None else factors
    return {name: tuple(FACTOR_KINDS.get(protocol.factor(name).kind).requires) for name in names}


def family_conditions(protocol) -> Dict[str, List[str]]:
    """Family -> the conditions of its factors, in the protocol's order (combinations left out)."""
    out: Dict[str, List[str]] = {}
    for name in protocol.factor_order:
        family = FACTOR_KINDS.get(protocol.factor(name).kind).family or "other"
        out.setdefault(family, []).extend(protocol.factor_conditions(name))
    return out


def describe_conditions(protocol) -> List[Dict[str, Any]]:
    """The conditions with their frozen parameters, for listings (optional factors last, marked; then the
    predeclared combinations, each with its parts)."""
    rows: List[Dict[str, Any]] = [{"condition": "clean", "factor": None, "level": None, "params": {}}]
    for condition in protocol.known_conditions[1:]:
        parsed = Condition.parse(condition)
        if parsed.is_combined:
            rows.append({"condition": condition, "factor": None, "level": None, "params": {},
                         "combination": [str(s) for s in parsed.shifts], "optional": True,
                         "families": [FACTOR_KINDS.get(protocol.factor(s.factor).kind).family for s in parsed.shifts]})
            continue
        name, level = parsed.factor, parsed.level
        spec = protocol.factor(name)
        kind = FACTOR_KINDS.get(spec.kind)
        rows.append(
            {
                "condition": condition,
                "factor": name,
                "level": level,
                "params": spec.level(level),
                "kind": spec.kind,
                "side": kind.side,
                "family": kind.family,
                "draw": spec.draw,
                "optional": name in protocol.optional_factors,
                "spec_version": spec.version,
                "spec_sha256": spec.content_hash,
            }
        )
    return rows


def applied_perturbation(
    spec, level: str, env, draw: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    """Apply ``spec`` at ``level`` and return the runtime record stored on the rollout."""
    kind = factor_kind(spec)
    params = spec.level(level)
    result = kind.apply(env, params, draw or {"draw": None, "draws_rejected": 0})
    error = max_abs_difference(result["applied"], result["expected"])
    extra = {"measured": result["measured"]} if "measured" in result else {}
    return {
        "factor": spec.factor,
        "level": level,
        "kind": spec.kind,
        "params": params,
        "draw": (draw or {}).get("draw"),
        "draws_rejected": (draw or {}).get("draws_rejected", 0),
        "applied": result["applied"],
        "expected": result["expected"],
        "max_abs_error": error,
        "ok": bool(error <= kind.readback_atol),
        **extra,
    }

