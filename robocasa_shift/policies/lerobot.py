"""The ``lerobot`` policy: a LeRobot checkpoint (ACT, diffusion, pi0, SmolVLA, ...) run in this process.

LeRobot 0.4.4 needs torch<2.11 while this project pins torch 2.13.0, so it
lives in its own virtual environment (``make setup-lerobot``; tests: ``make
test-lerobot``).

Loading. ``checkpoint`` is a local directory written by ``save_pretrained``:
``config.json`` (whose ``type`` picks the class through
``lerobot.policies.factory.get_policy_class``), ``model.safetensors`` and, since
LeRobot 0.4, ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with
their state files (normalisation statistics), loaded with
``make_pre_post_processors(config, pretrained_path=checkpoint)``. A checkpoint
without them (LeRobot < 0.4) is refused: run LeRobot's
``lerobot.processor.migrate_policy_normalization`` on it first.

Observation, as LeRobot's RoboCasa env delivers it (``lerobot/envs/robocasa.py``)
and LeRobot's evaluation loop prepares it (``preprocess_observation``, then the
preprocessor): ``observation.images.<camera>`` (float32 (1, 3, H, W) in [0, 1],
top row first), ``observation.state`` (float32 (1, 16): base position (3),
base quaternion (4), end effector position (3) and quaternion (4) relative to
the base, gripper joints (2)), ``task`` (the instruction). Only the image keys
the checkpoint's ``input_features`` list are sent, rendered at their size. The
embedded backend's third-person ``robot0_robotview`` feeds both
``robot0_agentview_left`` and ``robot0_agentview_right``.

On LIBERO (``preset="libero"``, the features of LeRobot's LIBERO env and its
``LiberoProcessorStep``): ``observation.images.image`` (agentview) and
``observation.images.image2`` (wrist), rotated 180 degrees from robosuite's raw
frame, i.e. this harness's upright render mirrored left-right; ``observation.state``
8-D (end effector position, axis-angle, finger joints); 7-D actions. On the testing
backend (``preset="fake"``, what ``train-lerobot`` trains there): ``observation.images.agentview``,
``observation.state`` 3-D (gripper x, y in the base frame, grasping), 3-D planar actions.
The conversion is :func:`raw_observation`, shared with ``train-lerobot`` so that a
checkpoint trained here sees at evaluation exactly the inputs it was trained on.

Actions: 12-D in LeRobot's RoboCasa order (base motion 4, control mode 1, end
effector position 3, rotation 3, gripper 1) -> the PandaOmron action
(``model_io.ACTION_LAYOUTS``). ``mode="step"`` calls ``select_action`` at every
control step, as LeRobot's evaluation loop does (the policy keeps its own
action queue and observation history); ``mode="chunk"`` calls
``predict_action_chunk`` once per ``n_action_steps`` (one render per chunk;
policies that read an observation history, such as diffusion, refuse it).

Seeding. LeRobot's samplers (diffusion's DDPM noise, flow matching in pi0 and
SmolVLA) draw from torch's GLOBAL generator, and ``torch.manual_seed`` would
leak into everything else in the process. Instead ``reset(seed)`` makes a
private generator state (``model_io.TorchSessionRNG``: CPU and the model's
CUDA device); every call into the model runs with that state installed as
the global one, and the state the call left behind is stored back. The actions are a function of
the seed and the observations only, the caller's global RNG is never touched,
and ``rng_fingerprint`` hashes the stored state.

Branching (``get_state`` / ``set_state``). Everything that decides the next
action besides the weights and the observation: the generator states (CPU and the
model's CUDA device), and the episode state the policy class keeps between
``select_action`` calls, read from the attributes its ``reset`` re-creates: the
action queue (``_action_queue``: ACT, pi0, pi0.5, GR00T), the observation and
action queues (``_queues``: diffusion, pi0, SmolVLA, VQ-BeT, TD-MPC), TD-MPC's warm
start (``_prev_mean``) and ACT's temporal ensembler (``ensembled_actions`` and
their counts). Each queued tensor is one array (bfloat16 ones as their int16 bits),
with each queue's length and maxlen; absent entries come back absent. A policy
class whose ``reset`` re-creates anything else, or a pre/post-processor step with
a ``reset`` of its own (episode state, e.g. LeRobot's human-in-the-loop steps), is
refused with the attribute or step named: it could not be restored. The
processors' normalisation statistics are part of the checkpoint, not of the state.

Samples (``sample_actions``): n draws of the action the policy would take if it
planned now, each with a generator seeded from the caller's ``rng``: the state is
restored, the action queue emptied (``select_action`` then plans a fresh chunk on
this observation; observation histories are kept) and the policy asked once; the
policy's state is restored afterwards, byte for byte. ACT without its VAE at
inference is deterministic: its draws agree.
"""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from robocasa_shift.core.policy import Observation, Policy
from robocasa_shift.errors import StateUnsupported, UnknownNameError
from robocasa_shift.policies.model_io import (
    LIBERO_STATE,
    NOT_RESET,
    ROBOCASA_CAMERAS,
    CameraMapLike,
    LayoutLike,
    StateLayoutLike,
    TorchSessionRNG,
    as_camera_map,
    as_state_layout,
    check_layout_fits,
    checked_image,
    flat_to_actions,
    layout_name,
    proprio_vector,
    resolve_layout,
)

IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
# Harness camera -> LeRobot camera names (the part after "observation.images.").
DEFAULT_CAMERA_MAP: Dict[str, Tuple[str, ...]] = dict(ROBOCASA_CAMERAS)
# What a checkpoint's training data looked like, by benchmark (``preset``); explicit options override a preset.
# ``libero`` is LeRobot's LIBERO env and its LiberoProcessorStep (lerobot/envs/libero.py,
# lerobot/processor/env_processor.py): agentview -> ``image``, wrist -> ``image2``, each rotated by 180
# degrees from robosuite's bottom-up frame (the upright frame this harness renders, mirrored left-right);
# the 8-D state (end effector position, axis-angle, finger joints); 7-D actions.
PRESETS: Dict[str, Dict[str, Any]] = {
    "robocasa": {"camera_map": DEFAULT_CAMERA_MAP, "state_layout": None, "action_layout": "robocasa-lerobot",
                 "mirror_images": False},
    "libero": {"camera_map": {"agentview": ("image",), "robot0_eye_in_hand": ("image2",)},
               "state_layout": LIBERO_STATE, "action_layout": "libero", "mirror_images": True},
    # the testing backend (backends/fake.py): its third-person camera, gripper position and grasp, planar actions
    "fake": {"camera_map": {"agentview": ("agentview",)}, "state_layout": (("eef_pos", 2), ("grasping", 1)),
             "action_layout": "fake-planar", "mirror_images": False},
}
# Policies whose predict_action_chunk stacks an observation history kept by select_action.
HISTORY_TYPES = frozenset({"diffusion", "tdmpc", "vqbet"})
# Episode state LeRobot 0.4.4's policy classes keep between select_action calls (re-created by their reset):
# a deque of tensors, a dict of such deques, a tensor or None. ACT's temporal ensembler is handled on its own.
QUEUE_ATTRS = ("_action_queue",)
QUEUES_ATTRS = ("_queues",)
TENSOR_ATTRS = ("_prev_mean",)
ENSEMBLER_ATTR = "temporal_ensembler"
ENSEMBLER_TENSORS = ("ensembled_actions", "ensembled_actions_count")
# The queues whose entries are planned actions: emptied before a sample, so that the sample plans afresh.
ACTION_QUEUE_KEY = "action"


def raw_observation(obs: Observation, image_names: Sequence[str], camera_map: Mapping[str, Tuple[str, ...]],
                    mirror_images: bool, state_layout: Optional[Sequence[Tuple[str, int]]]) -> Dict[str, Any]:
    """What a LeRobot env hands ``preprocess_observation``: ``pixels`` (LeRobot camera name -> uint8 (H, W, 3))
    for ``image_names`` and, when ``state_layout`` is given, ``agent_pos``.

    Raises:
        KeyError: a wanted camera that no rendered camera maps to.
    """
    wanted = set(image_names)
    pixels: Dict[str, np.ndarray] = {}
    for camera, image in obs.images.items():
        for name in camera_map.get(camera, (camera,)):
            if name in wanted:
                image = checked_image(camera, image)
                pixels[name] = np.ascontiguousarray(image[:, ::-1]) if mirror_images else image
    missing = sorted(wanted - set(pixels))
    if missing:
        raise KeyError(f"the checkpoint reads cameras {missing}, which no rendered camera maps to "
                       f"(rendered: {sorted(obs.images)}); set camera_map")
    raw: Dict[str, Any] = {"pixels": pixels}
    if state_layout is not None:
        raw["agent_pos"] = proprio_vector(obs, state_layout)
    return raw


def directory_digest(root: Union[str, Path], block: int = 1 << 20) -> str:
    """sha256 over every file's relative path, size and content (streamed), in sorted order."""
    root = Path(root)
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{file.relative_to(root).as_posix()}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(block), b""):
                h.update(chunk)
    return h.hexdigest()


class LeRobotPolicy(Policy):
    """A local LeRobot checkpoint, in process.

    Args:
        checkpoint: the directory ``save_pretrained`` wrote (config.json, model.safetensors, processors).
        device: torch device ("cpu", "cuda", "cuda:1").
        mode: "step" (``select_action`` each control step) or "chunk" (``predict_action_chunk``).
        n_action_steps: in chunk mode, steps of each chunk run (default: the config's ``n_action_steps``).
        camera_map: harness camera -> LeRobot camera name(s); a dict or its JSON.
        state_layout: (proprio key, dimension) list for ``observation.state`` (default: RoboCasa's 16-D).
        action_layout: a name in ``model_io.ACTION_LAYOUTS`` or a list of slots.
        instruction: replaces the task's instruction (sent as ``task``).
        image_size: render size (default: the size of the checkpoint's image features).
        preset: ``robocasa`` (LeRobot's RoboCasa features), ``libero`` (LeRobot's LIBERO features:
            ``image`` / ``image2``, mirrored images, 8-D state, 7-D actions) or ``fake`` (the testing
            backend's: ``agentview``, 3-D state, planar actions); the options above override it.
        mirror_images: mirror every image left-right before the model sees it (see ``PRESETS``).
    """

    name = "lerobot"
    camera_roles = ("third_person", "wrist")
    deterministic = False

    def __init__(
        self,
        checkpoint: Union[str, Path],
        device: str = "cpu",
        mode: str = "step",
        n_action_steps: Optional[int] = None,
        camera_map: CameraMapLike = None,
        state_layout: StateLayoutLike = None,
        action_layout: LayoutLike = None,
        instruction: Optional[str] = None,
        image_size: Optional[int] = None,
        preset: str = "robocasa",
        mirror_images: Optional[bool] = None,
    ):
        if preset not in PRESETS:
            raise UnknownNameError("lerobot preset", preset, sorted(PRESETS))
        try:
            import lerobot
            import torch
            from lerobot.configs.policies import PreTrainedConfig
            from lerobot.envs.utils import preprocess_observation
            from lerobot.policies.factory import (
                get_policy_class,
                make_pre_post_processors,
            )
        except ImportError as exc:
            raise ImportError(f"lerobot is not importable here ({exc}): it needs its own venv (torch<2.11); build it "
                              "with `make setup-lerobot` and run .venv-lerobot/bin/robocasa-shift") from None
        self.torch, self._preprocess_observation = torch, preprocess_observation
        self.checkpoint = Path(checkpoint)
        for name in ("config.json", "model.safetensors"):
            if not (self.checkpoint / name).is_file():
                raise FileNotFoundError(f"{self.checkpoint} has no {name}: pass the directory a LeRobot "
                                        "policy's save_pretrained wrote (e.g. .../checkpoints/last/pretrained_model)")
        if mode not in ("step", "chunk"):
            raise ValueError(f"mode must be 'step' or 'chunk', got {mode!r}")
        self.mode, self.device = mode, str(device)
        self.lerobot_version, self.torch_version = lerobot.__version__, torch.__version__

        config = PreTrainedConfig.from_pretrained(self.checkpoint, local_files_only=True)
        config.device = self.device
        self.config, self.policy_type = config, config.type
        self.model = get_policy_class(config.type).from_pretrained(self.checkpoint, config=config,
                                                                   local_files_only=True)
        self.model.to(self.device).eval()
        processors = [self.checkpoint / f"policy_{k}processor.json" for k in ("pre", "post")]
        if not all(p.is_file() for p in processors):
            raise FileNotFoundError(
                f"{self.checkpoint} has no {processors[0].name} / {processors[1].name} (a checkpoint from "
                "LeRobot < 0.4, which kept normalisation inside the model): convert it with "
                "`python -m lerobot.processor.migrate_policy_normalization --pretrained-path ...`")
        self.preprocessor, self.postprocessor = make_pre_post_processors(
            config, pretrained_path=str(self.checkpoint),
            preprocessor_overrides={"device_processor": {"device": self.device}})

        if mode == "chunk" and config.type in HISTORY_TYPES:
            raise ValueError(f"a '{config.type}' policy keeps an observation history in select_action; "
                             "run it with mode='step'")
        self.n_action_steps = int(n_action_steps or getattr(config, "n_action_steps", 1))
        chosen = PRESETS[preset]
        self.preset = preset
        self.camera_map = as_camera_map(camera_map, chosen["camera_map"])
        self.state_layout = as_state_layout(state_layout if state_layout is not None else chosen["state_layout"])
        self.layout = resolve_layout(action_layout if action_layout is not None else chosen["action_layout"])
        self.mirror_images = bool(chosen["mirror_images"] if mirror_images is None else mirror_images)
        self.instruction = instruction
        self.image_keys = list(config.image_features)
        bad = [k for k in self.image_keys if not k.startswith(IMAGE_PREFIX)]
        if bad or config.env_state_feature is not None:
            raise ValueError(f"unsupported input features {bad or ['observation.environment_state']}: the adapter "
                             f"feeds '{IMAGE_PREFIX}<camera>' images and '{STATE_KEY}'")
        shapes = {tuple(f.shape) for f in config.image_features.values()}
        if image_size is None:
            if len(shapes) != 1 or next(iter(shapes))[1] != next(iter(shapes))[2]:
                raise ValueError(f"image features of several or non-square sizes {sorted(shapes)}: pass image_size")
            image_size = next(iter(shapes))[1]
        self.image_size = int(image_size)
        self.uses_state = config.robot_state_feature is not None
        if self.uses_state:
            want = tuple(config.robot_state_feature.shape)
            have = (sum(d for _, d in self.state_layout),)
            if want != have:
                raise ValueError(f"the checkpoint's {STATE_KEY} has shape {want}, state_layout gives {have}")
        device_spec = torch.device(self.device)
        # only the model's own CUDA device: its generator is the one the samplers draw from
        self._rng_devices: Tuple[int, ...] = ((device_spec.index or 0),) if device_spec.type == "cuda" else ()
        self.rng: Optional[TorchSessionRNG] = None
        self._digest: Optional[str] = None
        self._state_problem = self._unsupported_state()

    # ------------------------------------------------------------------ protocol

    def reset(self, seed: int) -> None:
        self.rng = TorchSessionRNG(self.torch, seed, self._rng_devices)
        self.model.reset()  # action queues, observation history
        for pipeline in (self.preprocessor, self.postprocessor):
            pipeline.reset()

    def rng_fingerprint(self) -> str:
        return NOT_RESET if self.rng is None else self.rng.fingerprint()

    def batch(self, obs: Observation) -> Dict[str, Any]:
        """The batch LeRobot's evaluation loop would build (before the preprocessor)."""
        raw = raw_observation(obs, [k[len(IMAGE_PREFIX):] for k in self.image_keys], self.camera_map,
                              self.mirror_images, self.state_layout if self.uses_state else None)
        batch = self._preprocess_observation(raw)
        batch["task"] = [str(self.instruction if self.instruction is not None else obs.instruction)]
        return batch

    def act(self, obs: Observation) -> np.ndarray:
        if self.rng is None:
            raise RuntimeError("the lerobot policy was never reset: call reset(seed) before act")
        check_layout_fits(self.layout, obs)
        torch = self.torch

        def infer():
            batch = self.preprocessor(self.batch(obs))
            with torch.inference_mode():
                if self.mode == "step":
                    action = self.model.select_action(batch)
                else:
                    action = self.model.predict_action_chunk(batch)[:, : self.n_action_steps]
            return self.postprocessor(action)

        action = self.rng.run(infer).to("cpu").numpy()
        chunk = action[0] if action.ndim == 3 else action  # (1, T, D) chunk or (1, D) step
        return flat_to_actions(chunk, self.layout, None, f"{self.policy_type} action")

    # ------------------------------------------------------------------ branching and samples

    def _unsupported_state(self) -> Optional[str]:
        """Why this checkpoint's policy state cannot be snapshotted (None: it can); see the module docstring."""
        before = dict(vars(self.model))
        self.model.reset()
        after = vars(self.model)
        known = set(QUEUE_ATTRS) | set(QUEUES_ATTRS) | set(TENSOR_ATTRS)
        unknown = sorted(k for k in after if (k not in before or after[k] is not before[k]) and k not in known)
        if unknown:
            return (f"the '{self.policy_type}' policy class keeps episode state in {unknown}, which this adapter "
                    "does not snapshot, so it cannot be branched")
        from lerobot.processor.pipeline import ProcessorStep

        for name, pipeline in (("preprocessor", self.preprocessor), ("postprocessor", self.postprocessor)):
            stateful = [type(step).__name__ for step in getattr(pipeline, "steps", [])
                        if getattr(type(step), "reset", ProcessorStep.reset) is not ProcessorStep.reset]
            if stateful:
                return (f"its {name} has steps with episode state ({stateful}), which this adapter does not "
                        "snapshot, so it cannot be branched")
        return None

    def instance_state_refusal(self) -> Optional[str]:
        return self._state_problem

    def _tensor_entries(self, name: str, tensor: Any) -> Dict[str, np.ndarray]:
        torch = self.torch
        tensor = tensor.detach().to("cpu")
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
            return {f"{name}@bfloat16": tensor.view(torch.int16).numpy().copy()}
        return {name: tensor.numpy().copy()}

    def _tensor_from(self, state: Mapping[str, np.ndarray], name: str) -> Any:
        torch = self.torch
        if f"{name}@bfloat16" in state:
            return torch.from_numpy(np.array(state[f"{name}@bfloat16"], dtype=np.int16)).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(np.array(state[name])).to(self.device)

    def _has_tensor(self, state: Mapping[str, np.ndarray], name: str) -> bool:
        return name in state or f"{name}@bfloat16" in state

    def _deque_entries(self, prefix: str, queue: collections.deque) -> Dict[str, np.ndarray]:
        out = {f"{prefix}.maxlen": np.array(-1 if queue.maxlen is None else queue.maxlen, dtype=np.int64),
               f"{prefix}.len": np.array(len(queue), dtype=np.int64)}
        for i, item in enumerate(queue):
            out.update(self._tensor_entries(f"{prefix}.{i}", item))
        return out

    def _deque_from(self, state: Mapping[str, np.ndarray], prefix: str) -> collections.deque:
        maxlen = int(state[f"{prefix}.maxlen"])
        return collections.deque([self._tensor_from(state, f"{prefix}.{i}") for i in range(int(state[f"{prefix}.len"]))],
                                 maxlen=None if maxlen < 0 else maxlen)

    def get_state(self) -> Dict[str, np.ndarray]:
        """Generator states and episode state as plain arrays (see the module docstring)."""
        if self._state_problem is not None:
            raise StateUnsupported(f"policy '{self.name}': {self._state_problem}")
        if self.rng is None:
            raise RuntimeError("the lerobot policy was never reset: call reset(seed) before get_state")
        state: Dict[str, np.ndarray] = {"rng.cpu": self.rng.cpu_state.numpy().copy()}
        state.update({f"rng.cuda.{d}": s.numpy().copy() for d, s in zip(self.rng.devices, self.rng.cuda_states)})
        model = vars(self.model)
        for attr in QUEUE_ATTRS:
            if isinstance(model.get(attr), collections.deque):
                state.update(self._deque_entries(f"queue.{attr}", model[attr]))
        for attr in QUEUES_ATTRS:
            queues = model.get(attr)
            if isinstance(queues, dict):
                keys = sorted(queues)
                state[f"queues.{attr}.keys"] = np.frombuffer(json.dumps(keys).encode(), dtype=np.uint8).copy()
                for key in keys:
                    state.update(self._deque_entries(f"queues.{attr}[{key}]", queues[key]))
        for attr in TENSOR_ATTRS:
            if model.get(attr) is not None:
                state.update(self._tensor_entries(f"tensor.{attr}", model[attr]))
        ensembler = getattr(self.model, ENSEMBLER_ATTR, None)
        if ensembler is not None:
            state["ensembler.present"] = np.array(1, dtype=np.int64)
            for name in ENSEMBLER_TENSORS:
                if getattr(ensembler, name) is not None:
                    state.update(self._tensor_entries(f"ensembler.{name}", getattr(ensembler, name)))
        return state

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`get_state`'s arrays after ``reset(seed)``: generators, queues, warm start, ensemble."""
        if self._state_problem is not None:
            raise StateUnsupported(f"policy '{self.name}': {self._state_problem}")
        if self.rng is None:
            raise RuntimeError("the lerobot policy was never reset: call reset(seed) before set_state")
        rng = TorchSessionRNG(self.torch, 0, self._rng_devices)
        rng.cpu_state = self.torch.from_numpy(np.array(state["rng.cpu"], dtype=np.uint8))
        rng.cuda_states = [self.torch.from_numpy(np.array(state[f"rng.cuda.{d}"], dtype=np.uint8))
                           for d in self._rng_devices]
        model = vars(self.model)
        for attr in QUEUE_ATTRS:
            if f"queue.{attr}.len" in state:
                model[attr] = self._deque_from(state, f"queue.{attr}")
        for attr in QUEUES_ATTRS:
            if f"queues.{attr}.keys" in state:
                keys: List[str] = json.loads(np.asarray(state[f"queues.{attr}.keys"], dtype=np.uint8).tobytes().decode())
                model[attr] = {key: self._deque_from(state, f"queues.{attr}[{key}]") for key in keys}
        for attr in TENSOR_ATTRS:
            if attr in model:
                model[attr] = self._tensor_from(state, f"tensor.{attr}") if self._has_tensor(state, f"tensor.{attr}") \
                    else None
        ensembler = getattr(self.model, ENSEMBLER_ATTR, None)
        if ensembler is not None:
            for name in ENSEMBLER_TENSORS:
                key = f"ensembler.{name}"
                setattr(ensembler, name, self._tensor_from(state, key) if self._has_tensor(state, key) else None)
        self.rng = rng

    def sample_actions(self, obs: Observation, n: int, rng: np.random.Generator) -> Optional[np.ndarray]:
        """``n`` draws of the action the policy would take if it planned now, noise from ``rng``; state kept."""
        if self._state_problem is not None or self.rng is None:
            return None
        saved = self.get_state()
        draws = []
        try:
            for _ in range(n):
                self.set_state(saved)
                self.rng = TorchSessionRNG(self.torch, int(rng.integers(0, 2**63)), self._rng_devices)
                model = vars(self.model)
                for attr in QUEUE_ATTRS:
                    if isinstance(model.get(attr), collections.deque):
                        model[attr].clear()
                for attr in QUEUES_ATTRS:
                    queues = model.get(attr)
                    if isinstance(queues, dict) and isinstance(queues.get(ACTION_QUEUE_KEY), collections.deque):
                        queues[ACTION_QUEUE_KEY].clear()
                draws.append(self.act(obs)[0])
        finally:
            self.set_state(saved)
        return np.array(draws, dtype=np.float64)

    def identity(self) -> Dict[str, Any]:
        if self._digest is None:
            self._digest = directory_digest(self.checkpoint)
        return {
            "name": self.name,
            "checkpoint": str(self.checkpoint.resolve()),
            "checkpoint_sha256": self._digest,
            "policy_type": self.policy_type,
            "lerobot_version": self.lerobot_version,
            "torch_version": self.torch_version,
            "device": self.device,
            "mode": self.mode,
            "n_action_steps": self.n_action_steps,
            "image_keys": self.image_keys,
            "image_size": self.image_size,
            "camera_map": {k: list(v) for k, v in sorted(self.camera_map.items())},
            "state_layout": [list(s) for s in self.state_layout] if self.uses_state else None,
            "action_layout": layout_name(self.layout) or [asdict(s) for s in self.layout],
            "instruction": self.instruction,
            "preset": self.preset,
            "mirror_images": self.mirror_images,
        }
