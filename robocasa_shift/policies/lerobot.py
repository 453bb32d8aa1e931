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
8-D (end effector position, axis-angle, finger joints); 7-D actions.

Actions: 12-D in LeRobot's RoboCasa order (base motion 4, control mode 1, end
effector position 3, rotation 3, gripper 1) -> the PandaOmron action
(``remote.ACTION_LAYOUTS``). ``mode="step"`` calls ``select_action`` at every
control step, as LeRobot's evaluation loop does (the policy keeps its own
action queue and observation history); ``mode="chunk"`` calls
``predict_action_chunk`` once per ``n_action_steps`` (one render per chunk;
policies that read an observation history, such as diffusion, refuse it).

Seeding. LeRobot's samplers (diffusion's DDPM noise, flow matching in pi0 and
SmolVLA) draw from torch's GLOBAL generator, and ``torch.manual_seed`` would
leak into everything else in the process. Instead ``reset(seed)`` makes a
private generator state (``remote.TorchSessionRNG``: CPU and the model's
CUDA device); every call into the model runs with that state installed as
the global one, and the state the call left behind is stored back. The actions are a function of
the seed and the observations only, the caller's global RNG is never touched,
and ``rng_fingerprint`` hashes the stored state.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from robocasa_shift.errors import UnknownNameError
from robocasa_shift.policies.base import Observation, Policy
from robocasa_shift.policies.remote import (
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
}
# Policies whose predict_action_chunk stacks an observation history kept by select_action.
HISTORY_TYPES = frozenset({"diffusion", "tdmpc", "vqbet"})


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
        action_layout: a name in ``remote.ACTION_LAYOUTS`` or a list of slots.
        instruction: replaces the task's instruction (sent as ``task``).
        image_size: render size (default: the size of the checkpoint's image features).
        preset: ``robocasa`` (LeRobot's RoboCasa features) or ``libero`` (LeRobot's LIBERO features:
            ``image`` / ``image2``, mirrored images, 8-D state, 7-D actions); the options above override it.
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
            from lerobot.policies.factory import get_policy_class, make_pre_post_processors
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
        wanted = {k[len(IMAGE_PREFIX):] for k in self.image_keys}
        pixels: Dict[str, np.ndarray] = {}
        for camera, image in obs.images.items():
            for name in self.camera_map.get(camera, (camera,)):
                if name in wanted:
                    image = checked_image(camera, image)
                    pixels[name] = np.ascontiguousarray(image[:, ::-1]) if self.mirror_images else image
        missing = sorted(wanted - set(pixels))
        if missing:
            raise KeyError(f"the checkpoint reads cameras {missing}, which no rendered camera maps to "
                           f"(rendered: {sorted(obs.images)}); set camera_map")
        raw: Dict[str, Any] = {"pixels": pixels}
        if self.uses_state:
            raw["agent_pos"] = proprio_vector(obs, self.state_layout)
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
