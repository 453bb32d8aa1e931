"""The ``robocasa`` backend: RoboCasa365 kitchens, created as RoboCasa creates them.

Environments come from ``robocasa.utils.env_utils.create_env``: robot
``PandaOmron``, split ``"target"`` (kitchens 1-10 and the target object
instances), cameras ``robot0_agentview_left/right`` (third-person, on the
mobile base) and ``robot0_eye_in_hand`` (wrist), 20 Hz control, each task's
own ``_check_success`` and its horizon from RoboCasa's dataset registry.

It needs RoboCasa's code on a robosuite newer than PyPI's 1.5.2 and the
kitchen assets, so it lives in a virtual environment of its own
(``make setup-robocasa``); everything missing raises ``BackendUnavailable``
with what to install. The task table, the stage predicates and this module
import without robocasa, so listings and spec checks work anywhere.

How the environment is driven, and why:

- Kitchens always hard-reset (the model is rebuilt on every ``reset``), so
  every perturbation edit disappears with the next reset, and nominal model
  values are read after each clean reset.
- ``reset(seed)`` replaces ``env.rng`` (which feeds layout, fixtures, objects,
  placements and the robot's spawn) and seeds the global ``np.random`` around
  the reset, which RoboCasa also draws from (eye-in-hand camera jitter when
  ``randomize_cameras`` is on, counter geoms' colours); the caller's global
  state is restored afterwards.
- ``step`` calls RoboCasa's ``env.step`` once; that step computes the success
  (``reward`` = ``_check_success``) and then ``update_state`` (task counters
  such as WashLettuce's ``washed_time``), each once. ``is_success`` returns the
  success that step computed: calling ``_check_success`` again would be an
  extra call (RinseSinkBasin latches ``washed_loc`` inside it).
- Task counters and fixture state kept in Python (outside MuJoCo's state) are
  part of fingerprints and snapshots.
- The base offset goes through RoboCasa's own placement at reset: RoboCasa's
  ``set_robot_base`` places the robot as in the clean reset (same draws, same
  collision search), the base joints are then moved by the offset in the
  base's frame, before the settling steps; a placement that collides, that
  disturbs an object, or that settles off the offset (beyond
  ``BaseOffset.readback_atol``) rejects the draw (``base_offset_problem``).
- Actions use the harness's PandaOmron layout (the embedded backend's: arm
  0:6, torso 6, base 7:10, gripper 10, base mode 11) and are reordered into the
  kitchen controller's order (RoboCasa puts gripper 6, base 7:10, torso 10).
- No image observables (``use_camera_obs`` off from the first reset on): the
  harness renders only the cameras a policy reads, at its size, through the
  environment's own offscreen context (rendering reads the state, so
  trajectories are unchanged), and robosuite, which rebuilds its observables
  at every reset, no longer renders each camera twice there to set them up.
- Reproducible resets: RoboCasa's ``Counter.get_reset_regions`` removes
  duplicate counter tops with ``list(set(...))`` over XML elements, so the
  order of the regions it returns - and which one the seeded draw then picks -
  follows memory addresses and differs from process to process (objects land
  left or right of the sink). The backend returns those regions in a stable
  order (:func:`stable_counter_regions`), and parses RoboCasa's fixture
  registries once per process (the same content, without re-reading them on
  every reset).
- Asset kits: when ``ROBOCASA_ASSETS_PATH`` names a generated stand-in kit
  (``robocasa_standin``), it is verified file by file and refused unless the
  study opted in (``--asset-kit standin``); the kit (kind, version, content
  hash) is recorded in the environment configuration, the manifest and every
  record, and the results are labelled "STAND-IN KIT - not RoboCasa results".
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.backends.mujoco_env import (
    BASE_JOINTS,
    RENDER_PROFILES,
    MujocoEnv,
    check_render_profile,
)
from robocasa_shift.backends.mujoco_render import defer_collected_frees, free, free_collected, make_current
from robocasa_shift.core.backend import TaskInfo, TaskTable, installed_versions
from robocasa_shift.core.factors import BaseOffset
from robocasa_shift.core.stages import predicate
from robocasa_shift.embodiments.panda_omron import ACTION_DIM, MODE
from robocasa_shift.embodiments.panda_omron import PART_RANGES as HARNESS_ACTION_LAYOUT
from robocasa_shift.backends import robocasa_standin as standin
from robocasa_shift.backends import robosuite_fastpath
from robocasa_shift.config import ASSET_KITS  # the kinds a study may opt into; None: RoboCasa's own assets
from robocasa_shift.errors import BackendUnavailable, BadInput, UnknownNameError

ROBOT = "PandaOmron"
SPLIT = "target"
CONTROL_FREQ_HZ = 20
# RoboCasa365 release whose dataset registry the horizons below come from.
ROBOCASA_RELEASE = "1.0.1"
THIRD_PERSON_CAMERAS = ("robot0_agentview_left", "robot0_agentview_right")
WRIST_CAMERAS = ("robot0_eye_in_hand",)
# Seed of the construction (kitchens draw nothing until the first reset, which reseeds).
MAKE_SEED = 0

# Asset folders (under robocasa.models.assets_root) every target kitchen task needs, with the
# download_kitchen_assets --type that provides each.
REQUIRED_ASSETS = {
    "textures": "tex",
    "fixtures/sinks": "fixtures_lw",
    "objects/objaverse": "objs_objaverse",
    "objects/lightwheel": "objs_lw",
}
# A base offset is invalid when it moves an object by more than this during RoboCasa's settling steps.
OBJECT_DISTURBANCE_TOL_M = 0.005

INSTALL_HINT = (
    "the robocasa backend needs RoboCasa365's code (rpent-robocasa365==1.0.1 from PyPI, or robocasa 1.0.1 "
    "from github.com/robocasa/robocasa) on a robosuite newer than PyPI's 1.5.2, one whose "
    "MujocoEnv takes load_model_on_init (praxis-robosuite==1.5.2.post1 from PyPI, or robosuite's git master), "
    "in a virtual environment of its own because both robosuites import as `robosuite`: run "
    "`make setup-robocasa` and use .venv-robocasa/bin/robocasa-shift"
)


# Every kitchen task draws its scene the same way: RoboCasa's samplers, fed by the episode's seed.
KITCHEN_RANDOMIZATION = ("Kitchen layout and style, fixture and object instances, object placements and the "
                         "robot's spawn deviation, drawn by RoboCasa from the episode seed (split 'target').")


@dataclass(frozen=True)
class RobocasaTask:
    """One RoboCasa365 kitchen task as the harness runs it (its subgoals: ``stage_specs/robocasa/``)."""

    name: str
    horizon: int  # RoboCasa365 v1.0.1 dataset registry (COMPOSITE_TASK_DATASETS[name]["horizon"])
    instruction: str  # RoboCasa's language; {braces} are filled per episode from ep_meta["lang"]
    description: str
    # attributes of the task that live in Python, outside MuJoCo's state
    counters: Tuple[str, ...] = ()

    def info(self) -> TaskInfo:
        """The backend-neutral view of the task."""
        return TaskInfo(self.name, self.horizon, self.instruction, self.description, KITCHEN_RANDOMIZATION)


# RoboCasa365's 16 Composite-Seen target tasks (TARGET_TASKS["composite_seen"]), in its order.
TASKS: Dict[str, RobocasaTask] = {
    t.name: t
    for t in [
        RobocasaTask("DeliverStraw", 2550,
                     "Take a straw from the drawer in front and place it inside the glass cup on the dining counter.",
                     "Take a straw from the drawer and put it in the glass cup on the dining counter."),
        RobocasaTask("GetToastedBread", 3000,
                     "Start the toaster. Once the lever pops up, take the bread to the plate on the dining counter.",
                     "Toast the bread, then put it on the plate; success latches the toaster having run.",
                     counters=("toaster_on",)),
        RobocasaTask("KettleBoiling", 1500,
                     "Pick the kettle from the counter and place it on a stove burner. Then turn the burner on.",
                     "Put the kettle on a burner and turn that burner on."),
        RobocasaTask("LoadDishwasher", 1800,
                     "Pick up the {dish0} and {dish1} from the counter, place them in the dishwasher, "
                     "and close the dishwasher door.",
                     "Put two dishes on the dishwasher's rack and close the dishwasher."),
        RobocasaTask("PackIdenticalLunches", 3900,
                     "Place one {vegetable} and one {meat} in each tupperware on the nearby counter, "
                     "to pack two identical lunches.",
                     "One vegetable and one meat into each of two tupperwares."),
        RobocasaTask("PreSoakPan", 2400,
                     "Pick the pan and sponge and place them into the sink. Then turn on the water.",
                     "Pan (obj1) and sponge (obj2) inside the sink, water running, gripper far from both."),
        RobocasaTask("PrepareCoffee", 1800,
                     "Pick the {mug} from the cabinet, place it under the coffee machine dispenser, "
                     "and press the start button.",
                     "Mug from the cabinet under the coffee machine's dispenser, machine started."),
        RobocasaTask("RinseSinkBasin", 1350,
                     "Turn on the sink and manuever the spout to wash all locations of the sink basin.",
                     "Water on, spout turned to the left, center and right of the basin (latched in washed_loc).",
                     counters=("washed_loc",)),
        RobocasaTask("ScrubCuttingBoard", 1200,
                     "Pick up the sponge from the counter and clean the cutting board by briefly scrubbing or "
                     "pressing down on the cutting board. Once finished, release the sponge.",
                     "Scrub the cutting board with the held sponge over at least 10 cm, then let go of it.",
                     counters=("board_contact_positions", "board_contact_timer", "sponge_contact_height")),
        RobocasaTask("SearingMeat", 4350,
                     "Grab the pan from the cabinet and place it on the {knob} burner on the stove. "
                     "Then place the {meat} on the stove and turn the burner on.",
                     "Pan from the cabinet onto the given burner, meat in the pan, that burner on."),
        RobocasaTask("SetUpCuttingStation", 2400,
                     "Pick up the knife from the drawer and place it on the cutting board. "
                     "Then place the meat from the plate to the cutting board.",
                     "Knife from the drawer and meat from the plate onto the cutting board."),
        RobocasaTask("StackBowlsCabinet", 2100,
                     "Pick up the bowls on the counter and stack them on top of one another in the open cabinet. "
                     "Place the smaller bowl on top of the larger bowl.",
                     "Both bowls inside the open cabinet, stacked (either order), gripper far from both."),
        RobocasaTask("SteamInMicrowave", 2100,
                     "Pick the {vegetable} from the sink and place it in the bowl. Then pick the bowl and place it "
                     "in the microwave. Then close the microwave door and press the start button.",
                     "Vegetable into the bowl, bowl into the microwave, door closed, microwave started."),
        RobocasaTask("StirVegetables", 2400,
                     "Put the {veg1} and {veg2} in the pot. Retrieve the spatula and lightly stir the vegetables "
                     "in the pot.",
                     "Both vegetables in the pot on the burner, stirred with the held spatula for 5 steps.",
                     counters=("success_time",)),
        RobocasaTask("StoreLeftoversInBowl", 2550,
                     "Pick the chicken drumstick and {vegetable} from their plates and place them in the bowl. "
                     "Then put the bowl in the fridge.",
                     "Drumstick and vegetable into the bowl, bowl into the fridge."),
        RobocasaTask("WashLettuce", 1650,
                     "Wash the lettuce in the sink by running water over it.",
                     "Lettuce under running water for 25 control steps (RoboCasa's washed_time counter).",
                     counters=("washed_time",)),
    ]
}


# ---------------------------------------------------------------------- availability


def _assets_problem(root: str) -> Optional[str]:
    missing = [p for p in REQUIRED_ASSETS if not (os.path.isdir(os.path.join(root, p)) and os.listdir(os.path.join(root, p)))]
    if not missing:
        return None
    env_note = (
        f" (ROBOCASA_ASSETS_PATH is {os.environ['ROBOCASA_ASSETS_PATH']!r})" if os.environ.get("ROBOCASA_ASSETS_PATH")
        else " (ROBOCASA_ASSETS_PATH is not set)"
    )
    return (
        f"RoboCasa's kitchen assets are missing under {root}{env_note}: {', '.join(missing)}. "
        f"Download them (~10 GB from box.com) with `python -m robocasa.scripts.download_kitchen_assets "
        f"--type {' '.join(REQUIRED_ASSETS[p] for p in missing)}` in that environment (it writes into the "
        f"robocasa package's models/assets), or set ROBOCASA_ASSETS_PATH to a complete copy of "
        f"robocasa/models/assets that holds them (rpent-robocasa365 reads it; upstream robocasa 1.0.1 "
        f"only reads its package folder)"
    )


_KITS: Dict[str, Optional[Dict[str, Any]]] = {}


def installed_asset_kit(root: str) -> Optional[Dict[str, Any]]:
    """The generated kit at the assets root (kind, version, RoboCasa version, content hash), None for RoboCasa's own.

    A kit is verified file by file against its manifest once per process.

    Raises:
        KitError: the root holds a kit manifest but the kit is incomplete or altered.
    """
    if root not in _KITS:
        manifest = standin.kit_manifest(root)
        _KITS[root] = None if manifest is None else standin.describe(standin.verify_kit(root))
    return _KITS[root]


def check_asset_kit(root: str, asset_kit: Optional[str]) -> Optional[Dict[str, Any]]:
    """The kit at ``root`` if the study opted into its kind (``asset_kit``); refuse any other combination.

    Raises:
        BackendUnavailable: a stand-in kit without the opt-in (its results are not RoboCasa's).
        BadInput: an unknown kit kind, or the opt-in with RoboCasa's own assets in place.
    """
    if asset_kit is not None and asset_kit not in ASSET_KITS:
        raise BadInput(f"unknown asset kit {asset_kit!r}; known: {', '.join(ASSET_KITS)} (or none: RoboCasa's own assets)")
    kit = installed_asset_kit(root)
    if kit is not None and asset_kit != kit["kind"]:
        raise BackendUnavailable(
            f"the kitchen assets at {root} are a generated stand-in kit (version {kit['version']}, sha256 "
            f"{kit['sha256'][:12]}), not RoboCasa's: what runs on it is not a RoboCasa result. Pass --asset-kit "
            f"{kit['kind']} to run on it knowingly (every record, manifest and report is then labelled "
            f"'{standin.BANNER}'), or point ROBOCASA_ASSETS_PATH at RoboCasa's downloaded assets")
    if kit is None and asset_kit is not None:
        raise BadInput(f"--asset-kit {asset_kit} asked for, but {root} holds no {asset_kit} kit ({standin.MANIFEST} "
                       f"missing): build one with `robocasa-shift standin-kit build DIR` and set "
                       f"ROBOCASA_ASSETS_PATH=DIR, or drop --asset-kit to run on RoboCasa's own assets")
    return kit


def check_available(asset_kit: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Raise BackendUnavailable saying what is missing (packages, robosuite version, assets); return the asset kit.

    Cheap enough to run before a study starts, so a missing piece stops it
    before any rollout instead of turning every rollout into an error record.

    Args:
        asset_kit: the kind of generated asset kit the study opted into (``standin``), or None.

    Returns:
        The generated kit in use (see :func:`installed_asset_kit`), None with RoboCasa's own assets.
    """

    missing = []
    try:
        import mujoco  # noqa: F401
        import robosuite
        from robosuite.environments.base import MujocoEnv
    except ImportError as exc:
        missing.append(f"robosuite/mujoco do not import ({exc})")
    else:
        if "load_model_on_init" not in inspect.signature(MujocoEnv.__init__).parameters:
            missing.append(f"robosuite {robosuite.__version__} ({os.path.dirname(robosuite.__file__)}) is too old "
                           f"for RoboCasa (its MujocoEnv has no load_model_on_init)")
    if importlib.util.find_spec("robocasa") is None:
        missing.append("robocasa is not installed")
    if missing:
        raise BackendUnavailable(f"{'; '.join(missing)} in {sys.executable}. Fix: {INSTALL_HINT}")
    _quiet_robosuite()
    try:
        import robocasa
        import robocasa.models
    except ImportError as exc:
        raise BackendUnavailable(f"robocasa does not import in {sys.executable} ({exc}). Fix: {INSTALL_HINT}") from None
    except AssertionError as exc:  # robocasa asserts minimum mujoco/numpy/robosuite versions on import
        raise BackendUnavailable(f"robocasa refused this environment ({exc}). Fix: {INSTALL_HINT}") from None
    problem = _assets_problem(robocasa.models.assets_root)
    if problem:
        raise BackendUnavailable(problem)
    return check_asset_kit(robocasa.models.assets_root, asset_kit)


def _quiet_robosuite() -> None:
    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)


# ---------------------------------------------------------------------- what the backend fixes in RoboCasa


def region_order_key(region: Mapping[str, Any]) -> tuple:
    """Sort key of a counter reset region: its offset, then its size (numbers; the same in every process)."""
    return tuple(float(x) for x in region["offset"]) + tuple(float(x) for x in region["size"])


def stable_counter_regions(get_reset_regions):
    """``Counter.get_reset_regions`` returning its regions in a stable order.

    RoboCasa builds the candidate counter tops with ``list(set(valid_geoms))``
    over XML elements, whose order follows memory addresses; the regions it
    returns (``geom_0``, ``geom_1``, ...) come in that order, and the seeded
    ``rng.choice`` over them picks a different region in another process. The
    wrapped method returns the same regions sorted by position and size,
    renumbered, so one seed picks one region everywhere.
    """

    def wrapped(self, *args, **kwargs):
        regions = get_reset_regions(self, *args, **kwargs)
        ordered = sorted(regions.values(), key=region_order_key)
        return {f"geom_{i}": region for i, region in enumerate(ordered)}

    wrapped.__wrapped__ = get_reset_regions
    wrapped.__doc__ = get_reset_regions.__doc__
    wrapped.robocasa_shift_stable = True
    return wrapped


class _CachedYaml:
    """``yaml`` for RoboCasa's scene modules: each file is parsed once per process, every caller gets a fresh copy.

    RoboCasa re-reads its fixture registries for every fixture of every reset (about 100 parses, ~13 s of
    pure-Python YAML per reset); the content never changes within a process. libyaml's loader is used where
    PyYAML has it (it gives the same data; ``tests/test_robocasa.py`` compares them on every registry).
    """

    def __init__(self):
        import yaml

        self._yaml = yaml
        self._loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        self._parsed: Dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._yaml, name)

    def safe_load(self, stream):
        import copy

        name = getattr(stream, "name", None)
        if not isinstance(name, str):
            return self._yaml.load(stream, Loader=self._loader)
        if name not in self._parsed:
            self._parsed[name] = self._yaml.load(stream, Loader=self._loader)
        return copy.deepcopy(self._parsed[name])


_CACHED_YAML: Optional[_CachedYaml] = None


def patch_robocasa() -> None:
    """Apply the backend's fixes to RoboCasa (idempotent): stable counter regions, registries parsed once, and
    render contexts (one per reset) freed in their own GL context (``mujoco_render.defer_collected_frees``)."""
    global _CACHED_YAML
    defer_collected_frees()
    from robocasa.models.fixtures.counter import Counter
    from robocasa.models.scenes import kitchen_arena, scene_utils
    from robocasa.utils import env_utils

    if not getattr(Counter.get_reset_regions, "robocasa_shift_stable", False):
        Counter.get_reset_regions = stable_counter_regions(Counter.get_reset_regions)
    if _CACHED_YAML is None:
        _CACHED_YAML = _CachedYaml()
    for module in (scene_utils, kitchen_arena, env_utils):
        module.yaml = _CACHED_YAML


# ---------------------------------------------------------------------- seeding and base placement


@contextlib.contextmanager
def seeded_global_random(seed: int) -> Iterator[None]:
    """Seed the global ``np.random`` from ``seed`` inside the block; restore the caller's state after.

    RoboCasa draws from the global generator during resets (camera jitter with
    ``randomize_cameras``, counter geoms' colours), so without this two resets
    with one seed could differ, and the harness's own users of ``np.random``
    would see their stream moved by a reset.
    """
    saved = np.random.get_state()
    np.random.seed(int(np.random.SeedSequence([int(seed), 1]).generate_state(1)[0]))
    try:
        yield
    finally:
        np.random.set_state(saved)


def reset_seeded(raw, seed: int):
    """RoboCasa's ``reset`` with every random source it uses seeded from ``seed``; returns its observation.

    ``env.rng`` is replaced (as RoboCasa's own gym wrapper does); kitchens
    rebuild fixtures, objects and samplers on every reset, all from ``env.rng``.
    """
    raw.rng = np.random.default_rng(int(seed))
    with seeded_global_random(seed):
        return raw.reset()


def base_frame_shift(anchor_ori: Sequence[float], forward_m: float, side_m: float) -> np.ndarray:
    """World displacement of a (forward, side) offset in the frame RoboCasa places the base in.

    ``set_robot_to_position`` maps a world position into the base joints with
    ``euler2mat(init_robot_base_ori_anchor)``; shifting the anchor by this
    vector moves the forward and side joints by exactly (forward_m, side_m).
    """
    import robosuite.utils.transform_utils as T

    return T.euler2mat(np.asarray(anchor_ori, dtype=float)) @ np.array([forward_m, side_m, 0.0])


@contextlib.contextmanager
def base_offset_at_placement(offset: Optional[Mapping[str, float]]) -> Iterator[None]:
    """Within the block, RoboCasa's ``set_robot_base`` places the robot at ``offset`` from the clean placement.

    RoboCasa itself places the robot first, exactly as in the clean reset (same
    spawn-deviation draws, same collision search, so the rest of the reset
    draws the same numbers); the base joints are then moved by the offset, in
    the base's frame, before RoboCasa's settling steps. Shifting the anchor
    instead would let RoboCasa's collision search end on another sample than
    the clean reset's whenever the clean spawn had to be re-drawn, and no
    offset of that episode could ever be placed. ``Kitchen._reset_internal``
    looks the function up on the module at call time, so the shift is active
    for exactly the resets inside this block.
    """
    if offset is None:
        yield
        return
    import robocasa.utils.env_utils as EnvUtils

    original = EnvUtils.set_robot_base

    def set_robot_base(env, anchor_pos, anchor_ori, rot_dev, pos_dev_x, pos_dev_y):
        robot_pos = original(env=env, anchor_pos=anchor_pos, anchor_ori=anchor_ori, rot_dev=rot_dev,
                             pos_dev_x=pos_dev_x, pos_dev_y=pos_dev_y)
        shifted = np.asarray(robot_pos, dtype=float) + base_frame_shift(anchor_ori, offset["forward_m"], offset["side_m"])
        EnvUtils.set_robot_to_position(env, shifted)
        adr = env.sim.model.get_joint_qpos_addr(BASE_JOINTS[2])
        env.sim.data.qpos[adr] += np.deg2rad(offset["yaw_deg"])
        env.sim.forward()
        # as placed, before the settling steps push a robot out of a collision
        env.robocasa_shift_placed_in_collision = bool(EnvUtils.detect_robot_collision(env))
        return shifted

    EnvUtils.set_robot_base = set_robot_base
    try:
        yield
    finally:
        EnvUtils.set_robot_base = original


def harness_to_env_action_index(split_indexes: Mapping[str, Tuple[int, int]], action_dim: int) -> np.ndarray:
    """Index ``ix`` with ``env_action = harness_action[ix]`` for a composite controller's part layout."""
    ix = np.full(action_dim, -1)
    for part, (start, end) in split_indexes.items():
        if part not in HARNESS_ACTION_LAYOUT:
            raise ValueError(f"controller part '{part}' has no place in the harness's PandaOmron action")
        h_start, h_end = HARNESS_ACTION_LAYOUT[part]
        if end - start != h_end - h_start:
            raise ValueError(f"controller part '{part}' has {end - start} dims, the harness's action {h_end - h_start}")
        ix[start:end] = np.arange(h_start, h_end)
    ix[action_dim - 1] = MODE  # HybridMobileBase reads the base mode from the last entry
    if sorted(ix) != list(range(action_dim)):
        raise ValueError(f"controller layout {dict(split_indexes)} does not cover the {action_dim}-D action")
    return ix


# ---------------------------------------------------------------------- Python-side state


_SKIP = object()


def _plain(value: Any, arrays: bool) -> Any:
    """``value`` as JSON-able data, or _SKIP when it is not plain data (models, XML, generators)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist() if arrays else _SKIP
    if isinstance(value, (list, tuple)):
        items = [_plain(v, arrays) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: _plain(v, arrays) for k, v in value.items()}
        return _SKIP if any(v is _SKIP for v in items.values()) else items
    return _SKIP


@dataclass
class _KeptKitchen:
    """The last kitchen a worker compiled (see ``RobocasaEnv._initialize_sim``)."""

    xml: str
    model: Any  # a copy of the MjModel as compiled
    context: Any = None  # its render context, once robosuite built one


class RobocasaEnv(MujocoEnv):
    """A live RoboCasa kitchen environment of one task, reused across rollouts.

    Lights, cameras, bit-exact physics and controller snapshots work as in the
    embedded backend (``MujocoEnv``); what differs is creation, reset, step,
    rendering through RoboCasa's own context, Python-side task state and the
    base offset.
    """

    third_person_cameras = THIRD_PERSON_CAMERAS
    wrist_cameras = WRIST_CAMERAS

    def __init__(self, task: RobocasaTask, render_profile: str = "fast", stock_simulator: bool = False,
                 asset_kit: Optional[str] = None):
        check_render_profile(render_profile)
        # the generated kit in use (kind, version, content hash), None on RoboCasa's own assets; records carry it
        self.asset_kit = check_available(asset_kit)
        _check_horizon(task)
        patch_robocasa()
        from robocasa.environments.kitchen.kitchen import Kitchen
        from robocasa.utils.env_utils import create_env

        self.spec = task
        self.task = task.info()
        self.render_profile = render_profile
        self.stock_simulator = bool(stock_simulator)
        self.raw = create_env(
            task.name,
            robots=ROBOT,
            camera_names=list(THIRD_PERSON_CAMERAS + WRIST_CAMERAS),
            seed=MAKE_SEED,
            render_onscreen=False,
            split=SPLIT,
            randomize_cameras=False,
            control_freq=CONTROL_FREQ_HZ,
            horizon=task.horizon,
        )
        # step() reads the success from the reward, which is Kitchen's float(_check_success()).
        if type(self.raw).reward is not Kitchen.reward:
            raise BackendUnavailable(f"{task.name} overrides Kitchen.reward; this backend reads success from it")
        if RENDER_PROFILES[render_profile]["offsamples"] is not None:
            self.raw.set_xml_processor(_quality_processor(RENDER_PROFILES[render_profile]["offsamples"]))
        self.raw.use_camera_obs = False  # read when observables are built, at every reset (module docstring)
        self.action_dim = ACTION_DIM
        self.fastpath = {"enabled": False, "reason": "applied at every reset (kitchens rebuild the robot)"}
        self._context = None
        # the last kitchen compiled: its XML, a copy of its model as compiled, its render context (see _initialize_sim)
        self._kept: Optional[_KeptKitchen] = None
        self.kitchens_reused = 0
        self.raw._initialize_sim = self._initialize_sim  # an instance attribute: the class's own is untouched
        self._seed: Optional[int] = None
        self._success = False
        self._problems: Dict[tuple, Optional[str]] = {}
        self.steps = 0

    # ------------------------------------------------------------------ reset, step, success

    def reset(self, seed: int, episode=None) -> None:
        """Reset to the initial state of ``seed`` (bit-identical for one seed, in any process)."""
        self._seed = int(seed)
        self._reset(None)
        self._nominal = self.model_values()
        self._nominal_base = self.data.qpos[self._base_qpos_adr].copy()
        self._nominal_collision = self._robot_collides()
        self._nominal_objects = self._object_positions()

    def _reset(self, base_offset: Optional[Mapping[str, float]]) -> None:
        self.raw.robocasa_shift_placed_in_collision = False
        with base_offset_at_placement(base_offset):
            try:
                obs = reset_seeded(self.raw, self._seed)
            except FileNotFoundError as exc:  # an incomplete asset download shows up here
                import robocasa.models

                if str(exc.filename or "").startswith(robocasa.models.assets_root):
                    raise BackendUnavailable(
                        f"RoboCasa's kitchen asset {exc.filename} is missing: the asset download is incomplete; run "
                        f"`python -m robocasa.scripts.download_kitchen_assets --type all` (or fix ROBOCASA_ASSETS_PATH)"
                    ) from None
                raise
        free_collected()  # the render contexts of earlier kitchens, garbage by now, whether or not anything renders
        if self._kept is not None:  # the render context robosuite built (or was handed) for this kitchen
            self._kept.context = self.raw.sim._render_context_offscreen
        # kitchens rebuild their robot and controllers on every reset: the fast path is applied again (it checks the
        # stack at every step too)
        self.set_stock_simulator(self.stock_simulator)
        self.bind()
        self._obs = obs
        self._success = False
        self.steps = 0
        cc = self.robot.composite_controller
        self._action_index = harness_to_env_action_index(cc._action_split_indexes, int(self.raw.action_spec[0].shape[0]))
        profile = RENDER_PROFILES[self.render_profile]
        flags = self._render_context().scn.flags
        flags[self._mujoco.mjtRndFlag.mjRND_SHADOW] = int(profile["shadows"])
        flags[self._mujoco.mjtRndFlag.mjRND_REFLECTION] = int(profile["reflections"])
        lang = self.raw.get_ep_meta().get("lang")
        self.task = replace(self.spec.info(), instruction=lang or self.spec.instruction)

    def _initialize_sim(self, xml_string: Optional[str] = None) -> None:
        """robosuite's ``MujocoEnv._initialize_sim`` (the XML through its processors, ``MjSim.from_xml_string``, a
        forward pass, the control clock), reusing the last kitchen where this reset wrote the very same XML.

        RoboCasa writes a kitchen's XML from the reset's draws and compiles it again at every reset; the conditions
        of one base episode share its seed, so their kitchens are the same. Compiling the same XML gives the same
        model, so a copy of the model as it was compiled (before any perturbation or reset wrote into it) is that
        compile; its render context, built for an identical model, draws the same pixels, and is moved to the new
        simulator (with the forward pass building a context would run). ``--stock-simulator`` turns it off; the
        kitchen golden run (two conditions of each base episode) proves the records unchanged."""
        import copy

        from robosuite.utils.binding_utils import MjSim

        raw = self.raw
        xml = xml_string if xml_string else raw.model.get_xml()
        for processor in raw._xml_processors:
            xml = processor(xml)
        kept = self._kept
        if kept is not None and kept.xml == xml and not self.stock_simulator:
            sim = MjSim(copy.copy(kept.model))
            if kept.context is not None:
                ctx = kept.context
                make_current(ctx)  # as building a context does: robosuite's own renders (observables) go to it
                sim.forward()  # MjRenderContext's own first step
                ctx.sim, ctx.model, ctx.data = sim, sim.model, sim.data
                sim.add_render_context(ctx)
            self.kitchens_reused += 1
        else:
            self._forget_kept()
            sim = MjSim.from_xml_string(xml)
            self._kept = _KeptKitchen(xml, copy.copy(sim.model._model))
        raw.sim = sim
        raw.sim.forward()
        raw.initialize_time(raw.control_freq)

    def _forget_kept(self) -> None:
        """Drop the kept kitchen, freeing its render context in its own GL context unless the simulator still uses it."""
        kept, self._kept = self._kept, None
        if kept is not None and kept.context is not None and getattr(self.raw.sim, "_render_context_offscreen",
                                                                     None) is not kept.context:
            free(kept.context)

    def close(self) -> None:
        self._forget_kept()
        super().close()
        free_collected()  # the render context robosuite's close just dropped

    def step(self, action: np.ndarray) -> None:
        """One control step of RoboCasa's ``env.step``; ``action`` in the harness's PandaOmron layout."""
        self._obs, reward, _, _ = self._raw_step(self.raw_action(action))
        self._success = bool(reward > 0)
        self.steps += 1

    def raw_action(self, action: np.ndarray) -> np.ndarray:
        """The harness's PandaOmron action in the kitchen controller's layout (a new array)."""
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.action_dim,):
            raise ValueError(f"expected a {self.action_dim}-D action, got shape {action.shape}")
        return action[self._action_index]

    def is_success(self) -> bool:
        """The task's ``_check_success`` as RoboCasa's step computed it (no extra call)."""
        return self._success

    def replay_step(self, integration: np.ndarray) -> None:
        """Restore a recorded post-step physics state, then do the bookkeeping ``env.step`` does after its physics.

        That is ``reward`` (= ``_check_success``) and then ``update_state``, once
        each, so replaying an episode's states in order rebuilds the counters
        (``washed_time``, ``washed_loc``) that predicates read. ``validate-stages``
        (``checks.validation.replay_states``) replays every recorded state through
        it whenever an environment has it.
        """
        self.set_physics_state(integration)
        self._success = bool(self.raw.reward() > 0)
        self.raw.update_state()

    def _enable_fastpath(self) -> Dict[str, Any]:
        return {**robosuite_fastpath.enable(self.raw), "kitchen_reuse": True}  # see _initialize_sim

    def _disable_fastpath(self) -> None:
        robosuite_fastpath.disable(self.raw)

    # ------------------------------------------------------------------ observations

    def _render_context(self):
        """RoboCasa's own offscreen context (rebuilt with the model on every reset)."""
        return self.sim._render_context_offscreen

    def proprio(self) -> Dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self._obs.items() if k.startswith("robot0_") and not k.endswith(("_image", "_depth"))}

    def privileged_state(self) -> Dict[str, np.ndarray]:
        """Object poses (quaternions w, x, y, z) and sizes, and where the task's sink is, read from the simulator.

        Objects: ``{name}_pos``, ``{name}_quat``, ``{name}_size`` (its bounding box, metres). A task with a sink
        adds ``sink_*`` (:meth:`sink_state`); one with a cabinet ``cabinet_*`` (its interior's centre and size).
        """
        out: Dict[str, np.ndarray] = {}
        for name in sorted(self.raw.objects):
            body = self.raw.obj_body_id[name]
            out[f"{name}_pos"] = self.data.xpos[body].copy()
            out[f"{name}_quat"] = self.data.xquat[body].copy()
            out[f"{name}_size"] = np.asarray(self.raw.objects[name].size, dtype=float)
        if self._fixture_or_none("sink") is not None:
            out.update(self.sink_state())
        cabinet = self._fixture_or_none("cabinet")
        if cabinet is not None:
            for region, points in sorted(cabinet.get_int_sites(relative=False).items())[:1]:
                lo, hi = np.min(points, axis=0), np.max(points, axis=0)
                out["cabinet_interior_center"], out["cabinet_interior_size"] = (lo + hi) / 2, hi - lo
        return out

    def point(self, name: str) -> np.ndarray:
        """World position of a task object (``objects`` of the kitchen's episode), a live view."""
        if name not in self.raw.obj_body_id:
            raise UnknownNameError("robocasa object", name, sorted(self.raw.obj_body_id))
        return self.data.xpos[self.raw.obj_body_id[name]]

    def target_contact(self) -> Optional[bool]:
        """None: RoboCasa's composite tasks have no single object-target pair; their subgoals say where things are."""
        return None

    def _fixture_or_none(self, name: str):
        try:
            return self.fixture(name)
        except KeyError:
            return None

    def sink_state(self) -> Dict[str, np.ndarray]:
        """The sink as a scripted expert needs it (world frame): basin centre and size, the water stream, the handle
        lever (pivot, tip, angle) and the spout (pivot, tip, angle), and the sink's yaw.

        Lever and spout tips are read from the geometry of the joints' bodies (the point of their geoms farthest
        from the pivot), so they follow the fixture as it is built.
        """
        sink = self.fixture("sink")
        m, d = self.raw.sim.model, self.raw.sim.data  # robosuite's bindings (they look names up)
        out: Dict[str, np.ndarray] = {"sink_yaw": np.array([float(sink.rot)])}
        points = np.concatenate([np.asarray(p) for p in sink.get_int_sites(relative=False).values()])
        lo, hi = points.min(axis=0), points.max(axis=0)
        out["sink_basin_center"], out["sink_basin_size"] = (lo + hi) / 2, hi - lo
        out["sink_water_pos"] = d.site_xpos[m.site_name2id(f"{sink.naming_prefix}water")].copy()
        for part, joint in (("handle", "handle_joint"), ("spout", "spout_joint")):
            jid = m.joint_name2id(f"{sink.naming_prefix}{joint}")
            body = m.jnt_bodyid[jid]
            pivot = d.xpos[body].copy()
            # candidate points: each colliding geom's centre and the centres of its faces (a capsule: its ends)
            tips = []
            for g in (g for g in range(m.ngeom) if m.geom_bodyid[g] == body and m.geom_contype[g]):
                axes, size = d.geom_xmat[g].reshape(3, 3), m.geom_size[g]
                half = (size[0], size[0], size[1] + size[0]) if m.geom_type[g] == 3 else size  # 3: capsule
                tips.append(d.geom_xpos[g].copy())
                tips += [d.geom_xpos[g] + s * half[k] * axes[:, k] for k in range(3) for s in (-1, 1)]
            far = max(tips, key=lambda p: float(np.linalg.norm(p - pivot))) if tips else pivot
            out[f"sink_{part}_pivot"], out[f"sink_{part}_tip"] = pivot, far.copy()
            out[f"sink_{part}_q"] = np.array([float(d.qpos[m.jnt_qposadr[jid]])])
        return out

    def fixture(self, name: str):
        """A fixture of the task by the name the task gives it (``sink``, ``cabinet``, ...)."""
        from robocasa.models.fixtures import Fixture

        found = getattr(self.raw, name, None)
        if not isinstance(found, Fixture):
            found = (getattr(self.raw, "fixture_refs", None) or {}).get(name)
        if not isinstance(found, Fixture):
            refs = sorted(k for k, v in vars(self.raw).items() if isinstance(v, Fixture))
            raise KeyError(f"{self.spec.name} has no fixture '{name}'; it has: {', '.join(refs)}")
        return found

    # ------------------------------------------------------------------ state outside MuJoCo

    def _python_state(self) -> Dict[str, Any]:
        """Task counters and fixture state kept in Python: plain data only, as JSON-able values."""
        out: Dict[str, Any] = {"task": {}}
        for name in self.spec.counters:
            value = _plain(getattr(self.raw, name, None), arrays=True)
            out["task"][name] = None if value is _SKIP else value
        for fname, fixture in sorted(self.raw.fixtures.items()):
            attrs = {k: _plain(v, arrays=False) for k, v in vars(fixture).items()}
            out[f"fixture.{fname}"] = {k: v for k, v in attrs.items() if v is not _SKIP}
        return out

    def _set_python_state(self, state: Mapping[str, Any]) -> None:
        for name, value in state["task"].items():
            setattr(self.raw, name, value)
        current = self._python_state()
        for fname, fixture in self.raw.fixtures.items():
            for k, v in state.get(f"fixture.{fname}", {}).items():
                if current[f"fixture.{fname}"].get(k) != v:  # static attributes stay untouched
                    setattr(fixture, k, v)

    def get_state(self, full: bool = True, observations: bool = False) -> Dict[str, Any]:
        """Bit-exact snapshot: physics, controllers, clocks, the step's success and the Python-side state."""
        state = super().get_state(full, observations)
        state["success"] = np.array(self._success)
        state["python_state"] = json.dumps(self._python_state(), sort_keys=True)
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self._success = bool(state["success"])
        self._set_python_state(json.loads(str(state["python_state"])))

    def fingerprint(self) -> str:
        """Hash of the integration state, controller state, perturbable model values and Python-side state."""
        import robocasa.models

        arrays = self.physics_fingerprint()
        # Fixtures keep their asset files' absolute paths: hashed relative to the asset root, so one kit gives one
        # fingerprint wherever it is installed (a golden run reproduces from any checkout).
        python = json.dumps(self._python_state(), sort_keys=True).replace(robocasa.models.assets_root, "<assets>")
        return hashlib.sha256(f"{arrays}\n{python}".encode()).hexdigest()

    # ------------------------------------------------------------------ base offset (through RoboCasa's placement)

    def base_offset(self) -> Dict[str, float]:
        """(forward, side, yaw) of the base joints relative to this episode's clean placement."""
        q = self.data.qpos[self._base_qpos_adr] - self._nominal_base
        return {"forward_m": float(q[0]), "side_m": float(q[1]), "yaw_deg": float(np.rad2deg(q[2]))}

    def set_base_offset(self, offset: Mapping[str, float]) -> None:
        """Reset the episode again with the base placed at ``offset`` by RoboCasa's own placement."""
        self._reset(offset)

    def base_offset_problem(self, offset: Mapping[str, float]) -> Optional[str]:
        """Why ``offset`` gives an invalid initial state, or None; leaves the clean initial state in place."""
        key = (self._seed, *(float(offset[k]) for k in ("forward_m", "side_m", "yaw_deg")))
        if key not in self._problems:
            self._reset(offset)
            try:
                self._problems[key] = self._placement_problem(offset)
            finally:
                self._reset(None)
        return self._problems[key]

    def _placement_problem(self, offset: Mapping[str, float]) -> Optional[str]:
        if getattr(self.raw, "robocasa_shift_placed_in_collision", False) and not self._nominal_collision:
            return "robot in collision with the kitchen at the offset placement"
        measured = self.base_offset()
        error = max(abs(measured[k] - offset[k]) for k in measured)
        if not error <= BaseOffset.readback_atol:
            return (f"the base settled off the offset by {error:.3g} (tolerance {BaseOffset.readback_atol:g}): "
                    f"measured {measured}, asked {dict(offset)}")
        if self._robot_collides() and not self._nominal_collision:
            return "robot in collision with the kitchen after placement"
        moved = {name: float(np.linalg.norm(pos - self._nominal_objects[name])) for name, pos in self._object_positions().items()}
        worst = max(moved, key=moved.get, default=None)
        if worst is not None and moved[worst] > OBJECT_DISTURBANCE_TOL_M:
            return f"object {worst} disturbed: moved {moved[worst] * 1000:.1f} mm during RoboCasa's settling steps"
        return None

    def _robot_collides(self) -> bool:
        from robocasa.utils.env_utils import detect_robot_collision

        return bool(detect_robot_collision(self.raw))

    def _object_positions(self) -> Dict[str, np.ndarray]:
        return {name: self.data.xpos[self.raw.obj_body_id[name]].copy() for name in self.raw.objects}


def _quality_processor(offsamples: int):
    """An XML processor setting the offscreen multisampling (read when RoboCasa builds its render context)."""

    def process(xml: str) -> str:
        root = ET.fromstring(xml)
        visual = root.find("visual")
        if visual is None:
            visual = ET.SubElement(root, "visual")
        quality = visual.find("quality")
        if quality is None:
            quality = ET.SubElement(visual, "quality")
        quality.set("offsamples", str(offsamples))
        return ET.tostring(root, encoding="unicode")

    return process


def _check_horizon(task: RobocasaTask) -> None:
    """The installed RoboCasa's registry horizon must be the one this table (and the study) uses."""
    from robocasa.utils.dataset_registry import COMPOSITE_TASK_DATASETS

    horizon = COMPOSITE_TASK_DATASETS[task.name]["horizon"]
    if horizon != task.horizon:
        import robocasa

        raise BackendUnavailable(
            f"robocasa {robocasa.__version__} gives {task.name} a horizon of {horizon}; this backend's table is "
            f"RoboCasa365 {ROBOCASA_RELEASE}'s ({task.horizon}); {INSTALL_HINT}"
        )


class RobocasaBackend(TaskTable):
    """RoboCasa365's 16 Composite-Seen target tasks on PandaOmron."""

    name = "robocasa"

    tasks = TASKS
    demo_policy = "expert"  # the scripted kitchen expert (privileged state): WashLettuce, RinseSinkBasin, ...

    # The kind of generated asset kit this study opted into (StudyConfig.asset_kit); None: RoboCasa's own assets.
    asset_kit: Optional[str] = None

    def accept_asset_kit(self, kind: Optional[str]) -> None:
        """Opt into a generated asset kit (``standin``) for this backend's environments, or out (None).

        Raises:
            BadInput: an unknown kind.
        """
        if kind is not None and kind not in ASSET_KITS:
            raise BadInput(f"unknown asset kit {kind!r}; known: {', '.join(ASSET_KITS)}")
        self.asset_kit = kind

    def check_available(self) -> None:
        check_available(self.asset_kit)

    def asset_kit_record(self) -> Optional[Dict[str, Any]]:
        """The generated kit the environments load (kind, version, content hash), None on RoboCasa's own assets."""
        return check_available(self.asset_kit)

    def make(self, task: str, render_profile: str = "fast", stock_simulator: bool = False) -> RobocasaEnv:
        self.task(task)
        return RobocasaEnv(TASKS[task], render_profile, stock_simulator, asset_kit=self.asset_kit)

    def config(self) -> Dict[str, Any]:
        """The frozen environment configuration recorded in manifests (``asset_kit``: None on RoboCasa's own assets)."""
        import robocasa
        import robocasa.models
        import robosuite.macros as macros

        return {
            "robocasa_version": robocasa.__version__,
            "assets_root": robocasa.models.assets_root,
            "asset_kit": self.asset_kit_record(),
            "reset_fixes": ["Counter.get_reset_regions: regions in a stable order (position, size)",
                            "fixture registries parsed once per process"],
            "create_env": {"robots": ROBOT, "split": SPLIT, "randomize_cameras": False,
                           "camera_names": list(THIRD_PERSON_CAMERAS + WRIST_CAMERAS), "control_freq": CONTROL_FREQ_HZ},
            "macros": {name: getattr(macros, name, None) for name in ("SIMULATION_TIMESTEP", "ENABLE_NUMBA", "IMAGE_CONVENTION")},
            "hard_reset": True,
            "third_person_cameras": list(THIRD_PERSON_CAMERAS),
            "wrist_cameras": list(WRIST_CAMERAS),
            "horizons": {t.name: t.horizon for t in TASKS.values()},
            "base_offset": "RoboCasa's set_robot_base places the robot as in the clean reset; the base joints are then "
                           "moved by the offset (base frame), before RoboCasa's settling steps",
            "success": "reward of RoboCasa's env.step (Kitchen.reward = _check_success), one call per step",
        }

    def versions(self) -> Dict[str, str]:
        return installed_versions(("robocasa", "rpent-robocasa365", "robosuite", "praxis-robosuite", "mujoco", "numpy",
                                   "opencv-python"))


# ---------------------------------------------------------------------- stage predicates
# Side-effect free, wired to RoboCasa's own helpers. They never call _check_success or
# update_state: the counters they read were updated by the environment's own step.


def _names(objects) -> List[str]:
    return [objects] if isinstance(objects, str) else list(objects)


@predicate("robocasa", "inside")
def inside(env: RobocasaEnv, object: str, fixture: str, partial: bool = False) -> bool:
    """The object is inside the fixture's interior (OU.obj_inside_of; whole bounding box unless ``partial``)."""
    from robocasa.utils import object_utils as OU

    return bool(OU.obj_inside_of(env.raw, object, env.fixture(fixture), partial_check=partial))


@predicate("robocasa", "in_receptacle")
def in_receptacle(env: RobocasaEnv, object: str, receptacle: str) -> bool:
    """The object touches the receptacle object and is centred over it (OU.check_obj_in_receptacle)."""
    from robocasa.utils import object_utils as OU

    return bool(OU.check_obj_in_receptacle(env.raw, object, receptacle))


@predicate("robocasa", "stacked")
def stacked(env: RobocasaEnv, objects: Sequence[str]) -> bool:
    """One of two objects rests in the other, either order (OU.check_obj_in_receptacle both ways)."""
    a, b = objects
    return in_receptacle(env, a, b) or in_receptacle(env, b, a)


@predicate("robocasa", "stacked_inside")
def stacked_inside(env: RobocasaEnv, objects: Sequence[str], fixture: str, gripper_far_m: Optional[float] = None) -> bool:
    """Both objects inside the fixture and stacked; with ``gripper_far_m``, the gripper also that far from each."""
    if not (all(inside(env, o, fixture) for o in objects) and stacked(env, objects)):
        return False
    return gripper_far_m is None or all(gripper_far(env, o, gripper_far_m) for o in objects)


@predicate("robocasa", "grasped")
def grasped(env: RobocasaEnv, objects) -> bool:
    """The gripper holds the object, or one of the objects (OU.check_obj_grasped: contact and fingers closed)."""
    from robocasa.utils import object_utils as OU

    return any(bool(OU.check_obj_grasped(env.raw, o)) for o in _names(objects))


@predicate("robocasa", "gripper_far")
def gripper_far(env: RobocasaEnv, object: str, th_m: float = 0.25) -> bool:
    """The gripper is more than ``th_m`` from the object (OU.gripper_obj_far; 0.25 m is RoboCasa's default)."""
    from robocasa.utils import object_utils as OU

    return bool(OU.gripper_obj_far(env.raw, object, th=th_m))


@predicate("robocasa", "water_on")
def water_on(env: RobocasaEnv, fixture: str = "sink") -> bool:
    """The sink's handle lets water run (Sink.get_handle_state()["water_on"])."""
    return bool(env.fixture(fixture).get_handle_state(env=env.raw)["water_on"])


@predicate("robocasa", "spout_at")
def spout_at(env: RobocasaEnv, side: str, fixture: str = "sink") -> bool:
    """The sink's spout points ``left``, ``center`` or ``right`` (Sink.get_handle_state()["spout_ori"])."""
    return env.fixture(fixture).get_handle_state(env=env.raw)["spout_ori"] == side


@predicate("robocasa", "under_water")
def under_water(env: RobocasaEnv, object: str, fixture: str = "sink") -> bool:
    """The object is under the running water now (Sink.check_obj_under_water)."""
    return bool(env.fixture(fixture).check_obj_under_water(env.raw, object))


@predicate("robocasa", "washed")
def washed(env: RobocasaEnv, at_least: int) -> bool:
    """WashLettuce's ``washed_time`` (steps the lettuce spent under running water) is at least ``at_least``."""
    return int(env.raw.washed_time) >= at_least


@predicate("robocasa", "rinsed")
def rinsed(env: RobocasaEnv, at_least: int) -> bool:
    """RinseSinkBasin's ``washed_loc`` latch holds at least ``at_least`` of left, center and right."""
    return sum(bool(v) for v in env.raw.washed_loc) >= at_least


@predicate("robocasa", "official_success")
def official_success(env: RobocasaEnv) -> bool:
    """The task's own success check held on this step (as the step computed it; no extra call)."""
    return env.is_success()
