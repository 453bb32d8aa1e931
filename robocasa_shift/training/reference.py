"""Regenerate the reference policy's weights from fixed seeds: data, then training, then a manifest.

Bit-reproducible on a machine of the same kind: every generator is seeded,
schedules count epochs (never wall time), each training process uses one
thread with deterministic algorithms, and the images are rendered by the
deterministic software renderer.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from robocasa_shift.core.specs import canonical_hash
from robocasa_shift.policies.reference.perception import NET_IMAGE_SIZE, PERCEPTION
from robocasa_shift.policies.reference.weights import MANIFEST, WEIGHTS_DIR
from robocasa_shift.training.reference_data import generate, generate_on_policy

MIN_LABEL_STD_M = 0.01  # a near-constant label (a resting cube's height) must not blow up the loss


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 14
    batch: int = 64
    lr: float = 2e-3
    weight_decay: float = 1e-5
    val_fraction: float = 0.1
    seed: int = 0


def array_hash(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def train_net(images: np.ndarray, targets: np.ndarray, episodes: np.ndarray, config: TrainConfig) -> Dict:
    """Train one KeypointNet; return its state dict and validation metrics (held-out episodes)."""
    import torch

    from robocasa_shift.policies.reference.nets import KeypointNet

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)

    cut = np.quantile(np.unique(episodes), 1.0 - config.val_fraction)
    train_idx, val_idx = np.flatnonzero(episodes < cut), np.flatnonzero(episodes >= cut)
    x = torch.from_numpy(images)
    y = torch.from_numpy(targets.astype(np.float32))
    mean = y[train_idx].mean(0)
    std = torch.clamp(y[train_idx].std(0), min=MIN_LABEL_STD_M)
    net = KeypointNet(targets.shape[1])
    net.label_mean.copy_(mean)
    net.label_std.copy_(std)
    opt = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = int(np.ceil(len(train_idx) / config.batch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.epochs * steps_per_epoch)
    train_t = torch.from_numpy(train_idx)
    for _ in range(config.epochs):
        net.train()
        order = train_t[torch.randperm(len(train_t), generator=gen)]
        for i in range(steps_per_epoch):
            batch = order[i * config.batch : (i + 1) * config.batch]
            pred = net.forward_normalized(x[batch])
            loss = torch.nn.functional.smooth_l1_loss(pred, (y[batch] - mean) / std, beta=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    net.eval()
    with torch.no_grad():
        pred = torch.cat([net(x[val_idx[i : i + 256]]) for i in range(0, len(val_idx), 256)])
    err = (pred - y[val_idx]).reshape(len(val_idx), -1, 3).norm(dim=-1)  # per 3-D point, metres
    baseline = (mean - y[val_idx]).reshape(len(val_idx), -1, 3).norm(dim=-1)
    return {
        "state": {k: v.clone() for k, v in net.state_dict().items()},
        "val_mean_error_mm": [round(float(v) * 1000, 2) for v in err.mean(0)],
        "val_median_error_mm": [round(float(v) * 1000, 2) for v in err.median(0).values],
        "predict_mean_error_mm": [round(float(v) * 1000, 2) for v in baseline.mean(0)],
        "n_train": int(len(train_idx)),
        "n_val": int(len(val_idx)),
    }


def load_training_set(paths: Sequence[str], camera: str):
    """Images, targets and episode ids of one camera, concatenated over data files (episode ids kept apart)."""
    images, targets, episodes, offset = [], [], [], 0
    for path in paths:
        data = np.load(path)
        images.append(data[camera])
        targets.append(data[f"{camera}_y"])
        episodes.append(data["episode"] + offset)
        offset = int(episodes[-1].max()) + 1
    return np.concatenate(images), np.concatenate(targets), np.concatenate(episodes)


def _train_job(args) -> Dict:
    import torch

    from robocasa_shift.policies.reference.nets import (
        KeypointNet,
        param_count,
        state_hash,
    )

    task, camera, data_paths, out_dir, config = args
    images, targets, episodes = load_training_set(data_paths, camera)
    t0 = time.perf_counter()
    result = train_net(images, targets, episodes, config)
    name = f"{task}_{camera}.pt"
    torch.save(result.pop("state"), Path(out_dir) / name)
    state = torch.load(Path(out_dir) / name)
    net = KeypointNet(targets.shape[1])
    net.load_state_dict(state)
    points = PERCEPTION[task].third_points if camera == "third" else PERCEPTION[task].wrist_points
    return {
        "task": task,
        "camera": camera,
        "file": name,
        "sha256": state_hash(state),
        "points": list(points),
        "n_out": int(targets.shape[1]),
        "params": param_count(net),
        "data": [Path(p).name for p in data_paths],
        "dataset_sha256": array_hash(images, targets),
        "train_s": round(time.perf_counter() - t0, 1),
        **result,
    }


def _data_job(args) -> str:
    task, path, frames, progress, weights_dir = args
    if weights_dir is None:
        generate(task, Path(path), frames=frames, progress=progress)
    else:
        generate_on_policy(task, Path(path), Path(weights_dir), frames=frames, progress=progress)
    return str(path)


def priors(data_path: Path, task: str) -> Dict[str, List[float]]:
    """Mean base-frame position of each wrist point at the start of the training episodes."""
    data = np.load(data_path)
    first = np.flatnonzero(np.r_[True, np.diff(data["episode"]) != 0])
    points = PERCEPTION[task].wrist_points
    start = data["prior_y"][first].reshape(len(first), len(points), 3).mean(0)
    return {p: [round(float(v), 6) for v in start[i]] for i, p in enumerate(points)}


def train_reference(
    tasks: Sequence[str] = tuple(PERCEPTION),
    data_dir: Path = Path("build/reference-data"),
    out_dir: Path = WEIGHTS_DIR,
    workers: int = 2,
    config: TrainConfig = TrainConfig(),
    frames: Optional[int] = None,
    progress: bool = True,
) -> Dict:
    """Generate data (reused if present) and train every net; write ``manifest.json`` beside the weights.

    Round 1 trains on expert data. Tasks with ``on_policy_frames`` then get a second round: the
    round-1 policy drives its own rollouts, their frames join the expert data, and the nets are
    retrained from scratch on both (one DAgger round). On-policy data is cached under the hash of
    the round-1 weights that produced it.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    suffix = "" if frames is None else f"-{frames}"
    data = {t: [str(data_dir / f"{t}{suffix}.npz")] for t in tasks}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_data_job, [(t, p[0], frames, progress, None) for t, p in data.items() if not Path(p[0]).exists()]))
        nets = _train_round(pool, tasks, data, out_dir, config)
        manifest = _write_manifest(out_dir, tasks, data, nets, config, t0)
        second = [t for t in tasks if PERCEPTION[t].on_policy_frames]
        if second:
            for t in second:
                round1 = canonical_hash({k: n["sha256"] for k, n in nets.items() if n["task"] == t})[:12]
                data[t].append(str(data_dir / f"{t}{suffix}-on-policy-{round1}.npz"))
            jobs = [(t, data[t][1], frames, progress, str(out_dir)) for t in second if not Path(data[t][1]).exists()]
            list(pool.map(_data_job, jobs))
            nets.update(_train_round(pool, second, data, out_dir, config))
            manifest = _write_manifest(out_dir, tasks, data, nets, config, t0)
    return manifest


def _train_round(pool, tasks, data, out_dir, config) -> Dict[str, Dict]:
    jobs = [
        (t, cam, data[t], str(out_dir), config)
        for t in tasks
        for cam in ("third", "wrist")
        if (PERCEPTION[t].third_points if cam == "third" else PERCEPTION[t].wrist_points)
    ]
    return {f"{n['task']}_{n['camera']}": n for n in pool.map(_train_job, jobs)}


def _write_manifest(out_dir: Path, tasks, data, nets, config, t0) -> Dict:
    # Training a subset of the tasks keeps the other tasks' nets.
    previous = json.loads((out_dir / MANIFEST).read_text()) if (out_dir / MANIFEST).exists() else {}
    keep = lambda d: {k: v for k, v in d.items() if k.split("_")[0] not in tasks}  # noqa: E731
    elapsed = round(time.perf_counter() - t0, 1)
    manifest = {
        "image_size": NET_IMAGE_SIZE,
        "config": config.__dict__,
        "tasks": {**keep(previous.get("tasks", {})), **{t: {"priors": priors(Path(data[t][0]), t)} for t in tasks}},
        "nets": {**keep(previous.get("nets", {})), **nets},
        "timing_s": {**previous.get("timing_s", {}), **{t: {"total": elapsed} for t in tasks}},
    }
    manifest["weights_sha256"] = canonical_hash({k: n["sha256"] for k, n in manifest["nets"].items()})
    from robocasa_shift.rundir.files import atomic_write_text

    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
