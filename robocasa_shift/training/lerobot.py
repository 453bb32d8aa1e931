"""Train a small LeRobot policy from the harness's own expert demonstrations (``train-lerobot``).

An untrained checkpoint never succeeds, so what needs successes (``monitors`` wants clean validation
successes in every task) cannot be run on one; this trains one on a CPU in minutes.

- Data: the backend's demonstration policy (``fake-expert`` on the fake backend) drives clean episodes
  drawn from their own seed stream (``lerobot-demos``: never a study's screening, formal or validation
  episodes). Seeded Gaussian noise is added to the executed arm action while the label stays the expert's,
  so the data also shows how to come back to the expert's path (DART). Only successful episodes are kept.
  ``hold_steps`` records the expert past the first success, where a rollout stops: a policy that never
  saw the goal's neighbourhood may run past it (on Reach, every failed diagnostic rollout of the default
  checkpoint ran on to the arm's reach limit; in a smaller run with 10 hold steps none did, but no more
  episodes succeeded).
- Inputs: every step is rendered as a rollout renders it for the ``lerobot`` policy (clean, at the
  checkpoint's image size) and converted by the adapter's own ``raw_observation`` under the adapter's
  preset for the backend, then by LeRobot's ``preprocess_observation``: training sees exactly what
  evaluation sends (image orientation, state layout). Labels are the expert's actions in the preset's flat
  layout (``actions_to_flat``, the inverse of what the adapter executes).
- Normalisation: statistics of these frames and labels go into the pre/post-processors saved with the
  weights; training batches pass through that same preprocessor, as observations do at evaluation.
- Training: LeRobot's own loss (``policy.forward``), optimiser and scheduler presets, observation and
  action windows from the config's delta indices, clamped and padded at episode ends as LeRobotDataset
  does; seeded torch inside ``fork_rng`` (the caller's generator is untouched), a fixed number of epochs
  (or optimiser steps), never wall time.
- Output: ``save_pretrained`` of the policy and both processors (what the ``lerobot`` policy loads) and
  ``train_manifest.json`` (config, seeds, data episodes, loss per epoch, wall times, versions).

lerobot and torch are imported inside the functions: the main venv has neither, and imports this module.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.core.backend import cameras_for_roles, installed_versions
from robocasa_shift.core.policy import Observation
from robocasa_shift.errors import BadInput, Unavailable, UnknownNameError
from robocasa_shift.policies import make_policy
from robocasa_shift.policies.lerobot import (
    IMAGE_PREFIX,
    PRESETS,
    STATE_KEY,
    LeRobotPolicy,
    directory_digest,
    raw_observation,
)
from robocasa_shift.policies.model_io import (
    actions_to_flat,
    as_camera_map,
    resolve_layout,
)
from robocasa_shift.seeding import derive_seed

MANIFEST = "train_manifest.json"
DEMO_STREAM = "lerobot-demos"  # the training episodes' seed stream (a study's episodes use "env")
NOISE_STREAM = "lerobot-demo-noise"
BATCH_STREAM = "lerobot-batches"
# The adapter's preset for a backend's observations and actions (the embedded backend: RoboCasa's features).
BACKEND_PRESETS = {"fake": "fake", "libero": "libero"}
# Small models that train on two CPU cores. Diffusion's spatial softmax needs a feature map wider than one
# cell: its ResNet-18 divides the image by 32, so 32-pixel images would leave it blind (80 px: a 3 x 3 map).
# DDIM with 10 steps keeps each plan, and the monitors' 8 samples per decision, cheap.
MODEL_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "diffusion": dict(n_obs_steps=1, horizon=8, n_action_steps=4, down_dims=(64, 128), kernel_size=3, n_groups=8,
                      diffusion_step_embed_dim=32, spatial_softmax_num_keypoints=32, crop_shape=None,
                      noise_scheduler_type="DDIM", num_inference_steps=10, optimizer_lr=1e-3,
                      scheduler_warmup_steps=50),
    "act": dict(chunk_size=8, n_action_steps=4, dim_model=64, n_heads=2, dim_feedforward=128, n_encoder_layers=2,
                n_decoder_layers=1, use_vae=False, optimizer_lr=1e-3, optimizer_lr_backbone=1e-3),
}


@dataclass(frozen=True)
class LeRobotTrainConfig:
    """What ``train-lerobot`` trains: data (backend, task, episodes, noise), model and schedule."""

    backend: str = "fake"
    task: str = "Reach"
    policy_type: str = "diffusion"
    episodes: int = 400
    epochs: int = 25
    steps: Optional[int] = None  # stop after this many optimiser steps (quick checks); None: every epoch
    batch_size: int = 64
    image_size: int = 80
    action_noise: float = 0.3  # std of the noise on the executed arm action, in action units
    hold_steps: int = 0  # expert steps recorded after the first success (at most to the horizon)
    seed: int = 0
    preset: Optional[str] = None  # the lerobot adapter's preset (default: the backend's, BACKEND_PRESETS)
    model: Dict[str, Any] = field(default_factory=dict)  # LeRobot config fields over MODEL_DEFAULTS

    def preset_name(self) -> str:
        return self.preset or BACKEND_PRESETS.get(self.backend, "robocasa")


@dataclass
class Demos:
    """Frames of the kept demonstrations: raw pixels per LeRobot camera, state, flat action labels."""

    pixels: Dict[str, np.ndarray]  # LeRobot camera name -> uint8 (N, H, W, 3)
    state: np.ndarray  # float32 (N, S)
    action: np.ndarray  # float32 (N, D)
    episode: np.ndarray  # int64 (N,): index into ``episodes``
    episodes: List[Dict[str, Any]]  # kept episodes: number, seed, frames, start

    def __len__(self) -> int:
        return len(self.state)


# --------------------------------------------------------------------------- data


def render_demos(config: LeRobotTrainConfig, progress: bool = False) -> Tuple[Demos, Dict[str, Any]]:
    """Run the backend's expert on ``config.episodes`` training episodes; (kept frames, data summary)."""
    preset = PRESETS[config.preset_name()]
    camera_map = as_camera_map(None, preset["camera_map"])
    layout = resolve_layout(preset["action_layout"])
    state_layout = preset["state_layout"]
    backend = get_backend(config.backend)
    env = backend.make(config.task)
    cameras = [c for c in cameras_for_roles(env, LeRobotPolicy.camera_roles) if c in camera_map]
    names = sorted({n for c in cameras for n in camera_map[c]})
    roles = {c: ("wrist" if c in env.wrist_cameras else "third_person") for c in cameras}
    expert = make_policy(backend.demo_policy)
    arm = list(env.action_layout.arm_continuous)
    columns: Dict[str, List[Any]] = {"pixels": [], "state": [], "action": [], "episode": []}
    kept: List[Dict[str, Any]] = []
    failed = 0
    for number in _bar(range(config.episodes), progress, "demos"):
        seed = derive_seed(config.seed, stream=DEMO_STREAM, backend=config.backend, task=config.task, episode=number)
        noise = np.random.default_rng(derive_seed(config.seed, stream=NOISE_STREAM, backend=config.backend,
                                                  task=config.task, episode=number))
        env.reset(seed)
        expert.reset(seed)
        frames: Dict[str, List[Any]] = {k: [] for k in columns if k != "episode"}
        success_at = None
        for step in range(env.task.horizon):
            obs = Observation({c: env.render(c, config.image_size) for c in cameras}, roles, env.proprio(),
                              env.task.instruction, step, env.privileged_state(), task=config.task,
                              action_layout=env.action_layout)
            raw = raw_observation(obs, names, camera_map, preset["mirror_images"], state_layout)
            action = np.asarray(expert.act(obs), dtype=np.float64)[0]
            frames["pixels"].append(raw["pixels"])
            frames["state"].append(raw.get("agent_pos", np.zeros(0, np.float32)))
            frames["action"].append(actions_to_flat(action, layout)[0])
            executed = action.copy()
            executed[arm] += noise.normal(0.0, config.action_noise, len(arm))
            env.step(executed)
            if success_at is None and env.is_success():
                success_at = step + 1
            if success_at is not None and step + 1 >= success_at + config.hold_steps:
                break
        if success_at is None:
            failed += 1
            continue
        kept.append({"episode": number, "seed": seed, "frames": len(frames["state"]), "success_step": success_at,
                     "start": len(columns["state"])})
        for key in frames:
            columns[key] += frames[key]
        columns["episode"] += [len(kept) - 1] * len(frames["state"])
    env.close()
    if not kept:
        raise RuntimeError(f"the {backend.demo_policy} policy succeeded in none of {config.episodes} {config.task} "
                           f"episodes (action noise {config.action_noise}): nothing to train on")
    demos = Demos(pixels={n: np.stack([p[n] for p in columns["pixels"]]) for n in names},
                  state=np.asarray(columns["state"], dtype=np.float32),
                  action=np.asarray(columns["action"], dtype=np.float32),
                  episode=np.asarray(columns["episode"], dtype=np.int64), episodes=kept)
    summary = {"backend": config.backend, "task": config.task, "demo_policy": backend.demo_policy,
               "seed_stream": DEMO_STREAM, "noise_stream": NOISE_STREAM, "training_seed": config.seed,
               "episodes_run": config.episodes, "episodes_kept": [e["episode"] for e in kept],
               "episodes_failed": failed, "frames": len(demos), "preset": config.preset_name(),
               "cameras": {n: [c for c in cameras if n in camera_map[c]] for n in names},
               "state_layout": [list(s) for s in state_layout] if state_layout else None,
               "action_layout": preset["action_layout"], "image_size": config.image_size,
               "sha256": _arrays_sha256(demos)}
    return demos, summary


def _arrays_sha256(demos: Demos) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(demos.pixels):
        h.update(name.encode())
        h.update(np.ascontiguousarray(demos.pixels[name]).tobytes())
    for array in (demos.state, demos.action, demos.episode):
        h.update(str(array.shape).encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def dataset_stats(demos: Demos) -> Dict[str, Dict[str, np.ndarray]]:
    """LeRobot's normalisation statistics (mean, std, min, max) of the frames: images per channel in [0, 1]."""
    stats: Dict[str, Dict[str, np.ndarray]] = {}
    for name, images in demos.pixels.items():
        per = [images[..., c] for c in range(images.shape[-1])]
        stats[f"{IMAGE_PREFIX}{name}"] = {
            "mean": _per_channel(per, lambda v: v.mean(dtype=np.float64)),
            "std": _per_channel(per, lambda v: v.std(dtype=np.float64)),
            "min": _per_channel(per, np.min), "max": _per_channel(per, np.max)}
    for key, values in ((STATE_KEY, demos.state), ("action", demos.action)):
        if values.shape[1]:
            v = values.astype(np.float64)
            stats[key] = {"mean": v.mean(0), "std": v.std(0), "min": v.min(0), "max": v.max(0)}
    return stats


def _per_channel(channels: List[np.ndarray], statistic) -> np.ndarray:
    """A statistic of each uint8 channel, in [0, 1], shaped (C, 1, 1) as LeRobot's image statistics are."""
    return np.array([statistic(v) for v in channels], dtype=np.float64).reshape(-1, 1, 1) / 255.0


# --------------------------------------------------------------------------- model


def policy_config(config: LeRobotTrainConfig, demos: Demos):
    """The LeRobot config: the demos' features, the small defaults of ``MODEL_DEFAULTS``, ``config.model``."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_policy_config

    if config.policy_type not in MODEL_DEFAULTS and not config.model:
        raise BadInput(f"policy type {config.policy_type!r} has no small defaults here ({', '.join(MODEL_DEFAULTS)} "
                       "have): give its LeRobot config fields as model options")
    inputs = {f"{IMAGE_PREFIX}{n}": PolicyFeature(FeatureType.VISUAL, (3, *images.shape[1:3]))
              for n, images in demos.pixels.items()}
    if demos.state.shape[1]:
        inputs[STATE_KEY] = PolicyFeature(FeatureType.STATE, (demos.state.shape[1],))
    options = {**MODEL_DEFAULTS.get(config.policy_type, {}), **config.model}
    try:
        return make_policy_config(config.policy_type, input_features=inputs, device="cpu",
                                  output_features={"action": PolicyFeature(FeatureType.ACTION,
                                                                           (demos.action.shape[1],))},
                                  pretrained_backbone_weights=None, **options)
    except (TypeError, ValueError) as exc:  # an unknown type or field, a value LeRobot's config refuses
        raise BadInput(f"LeRobot {config.policy_type} config: {exc}") from None


def windows(demos: Demos, frames: np.ndarray, deltas) -> Tuple[np.ndarray, np.ndarray]:
    """(indices, is_pad) of each frame's window ``deltas``, clamped to its episode as LeRobotDataset clamps."""
    deltas = np.asarray(list(deltas), dtype=np.int64)
    start = np.array([e["start"] for e in demos.episodes])[demos.episode[frames]]
    end = start + np.array([e["frames"] for e in demos.episodes])[demos.episode[frames]] - 1
    wanted = frames[:, None] + deltas[None]
    return np.clip(wanted, start[:, None], end[:, None]), (wanted < start[:, None]) | (wanted > end[:, None])


def make_batch(demos: Demos, frames: np.ndarray, config) -> Dict[str, Any]:
    """One training batch as LeRobot's data loader gives it (before the preprocessor)."""
    import torch
    from lerobot.envs.utils import preprocess_observation

    obs_deltas = config.observation_delta_indices
    index, _ = windows(demos, frames, obs_deltas if obs_deltas is not None else [0])
    raw: Dict[str, Any] = {"pixels": {n: images[index.reshape(-1)] for n, images in demos.pixels.items()}}
    if demos.state.shape[1]:
        raw["agent_pos"] = demos.state[index.reshape(-1)]
    batch = preprocess_observation(raw)
    for key, value in batch.items():
        batch[key] = value.reshape(len(frames), index.shape[1], *value.shape[1:]) if obs_deltas is not None \
            else value
    action_index, pad = windows(demos, frames, config.action_delta_indices)
    batch["action"] = torch.from_numpy(demos.action[action_index])
    batch["action_is_pad"] = torch.from_numpy(pad)
    return batch


# --------------------------------------------------------------------------- training


def train_lerobot(config: LeRobotTrainConfig, out_dir: Path, progress: bool = False) -> Dict[str, Any]:
    """Render the demonstrations, train, save the checkpoint and its manifest into ``out_dir``; the manifest."""
    try:
        import lerobot
        import torch
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    except ImportError as exc:
        raise Unavailable(f"lerobot is not importable here ({exc}): it needs its own venv (torch<2.11); build it "
                          "with `make setup-lerobot` and run .venv-lerobot/bin/robocasa-shift") from None
    from robocasa_shift.rundir.files import atomic_write_text

    if config.preset_name() not in PRESETS:
        raise UnknownNameError("lerobot preset", config.preset_name(), sorted(PRESETS))
    t0 = time.perf_counter()
    demos, data = render_demos(config, progress)
    t_data = time.perf_counter() - t0
    policy_cfg = policy_config(config, demos)
    stats = {key: {name: torch.as_tensor(value, dtype=torch.float32) for name, value in entry.items()}
             for key, entry in dataset_stats(demos).items()}
    order = np.random.default_rng(derive_seed(config.seed, stream=BATCH_STREAM))
    per_epoch = -(-len(demos) // config.batch_size)
    total = min(config.epochs * per_epoch, config.steps or config.epochs * per_epoch)
    losses: List[float] = []
    first_batch_loss = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy = get_policy_class(config.policy_type)(policy_cfg)
        preprocessor, postprocessor = make_pre_post_processors(policy_cfg, dataset_stats=stats)
        optim = policy_cfg.get_optimizer_preset()
        optimizer = optim.build(policy.get_optim_params())
        schedule = policy_cfg.get_scheduler_preset()
        scheduler = schedule.build(optimizer, total) if schedule is not None else None
        policy.train()
        step = 0
        for _ in _bar(range(config.epochs), progress, "epochs"):
            seen, summed = 0, 0.0
            permutation = order.permutation(len(demos))
            for first in range(0, len(demos), config.batch_size):
                if step >= total:
                    break
                frames = permutation[first:first + config.batch_size]
                loss, _ = policy.forward(preprocessor(make_batch(demos, frames, policy_cfg)))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), optim.grad_clip_norm)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                value = loss.item()
                first_batch_loss = value if first_batch_loss is None else first_batch_loss
                seen, summed = seen + len(frames), summed + value * len(frames)
            if seen:
                losses.append(summed / seen)
            if step >= total:
                break
        policy.eval()
    t_train = time.perf_counter() - t0 - t_data
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out_dir)
    for processor in (preprocessor, postprocessor):
        processor.save_pretrained(out_dir)
    manifest = {
        "config": asdict(config),
        "policy_type": config.policy_type,
        "policy_config": json.loads((out_dir / "config.json").read_text()),
        "seeds": {"training_seed": config.seed, "torch_manual_seed": config.seed, "demo_stream": DEMO_STREAM,
                  "noise_stream": NOISE_STREAM, "batch_stream": BATCH_STREAM},
        "data": data,
        "optimizer_steps": step,
        "epochs_run": len(losses),
        "loss": {"first_batch": first_batch_loss, "per_epoch": losses, "final": losses[-1] if losses else None},
        "wall_s": {"data": round(t_data, 1), "training": round(t_train, 1),
                   "total": round(time.perf_counter() - t0, 1)},
        "versions": {"lerobot": lerobot.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     **installed_versions(["robocasa-shift"]), **get_backend(config.backend).versions()},
        "weights_sha256": directory_digest(out_dir),
    }
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True, default=_jsonable) + "\n")
    return manifest


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)


def _bar(iterable, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, disable=not enabled, dynamic_ncols=True)


__all__ = ["LeRobotTrainConfig", "MANIFEST", "MODEL_DEFAULTS", "dataset_stats", "render_demos", "train_lerobot"]
