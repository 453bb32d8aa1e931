"""``end-state``: a small learned success judge that runs here (torch, CPU), a baseline for the pipeline.

One convolutional classifier per task reads the end frame of every camera of a
sample (downsampled to ``INPUT_SIZE``, stacked as channels) and outputs
P(success). It learns from judge sets exported from clean rollouts of the
``reference``, ``expert`` and ``random`` policies on the ``judge-training``
seed stream (never screened, calibrated or evaluated), so both outcomes are
represented. Positives are the end frames of successes; negatives are the end
frames of failures and the first half of every clip (states before the task
was done). No augmentation touches colour, blur or viewpoint: the classifier
never sees a shift before it is evaluated under one.

``make train-judge`` regenerates the weights from fixed seeds (the rollouts,
the export, the training order); ``weights/manifest.json`` records the training
sets' hashes, the held-out balanced accuracy and the wall time.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.errors import BadInput, WeightsMissing
from robocasa_shift.extras import require
from robocasa_shift.judging.judges import Judge, Verdict
from robocasa_shift.rundir.files import atomic_write_text
from robocasa_shift.judging.judgeset import (
    JudgeSample,
    JudgeSet,
    camera_order,
    decode_png,
)

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST = "manifest.json"
INPUT_SIZE = 64
THRESHOLD = 0.5
# Clip frames before this fraction of a successful attempt are negatives (the task was not done yet).
NEGATIVE_FRACTION = 0.5


def resize(image: np.ndarray, size: int = INPUT_SIZE) -> np.ndarray:
    """A uint8 (H, W, 3) image as float32 (3, size, size) in [0, 1] (antialiased, deterministic)."""
    from PIL import Image

    small = Image.fromarray(image).resize((size, size), Image.BILINEAR, reducing_gap=None)
    return np.asarray(small, dtype=np.float32).transpose(2, 0, 1) / 255.0


def stack(frames: Sequence[np.ndarray]) -> np.ndarray:
    """The classifier's input: every camera's frame, resized, stacked as channels (third-person first)."""
    return np.concatenate([resize(f) for f in frames], axis=0)


def build_net(channels: int):
    """The classifier: four strided convolutions, then one linear layer over the whole 4 x 4 feature map
    (about 21k weights). Not pooled: where things are is the outcome (a cube on a cube, not beside it);
    with global pooling the Stack classifier never left chance."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(channels, 16, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(16 * (INPUT_SIZE // 16) ** 2, 1),
    )


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 60
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.2
    shift_px: int = 4  # random translation (pad and crop): the only augmentation
    seed: int = 0


def training_examples(sets: Sequence[JudgeSet], task: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, labels, episode keys) of ``task`` from judge sets: end frames labelled by the official
    outcome, plus the first half of each success's clip as negatives."""
    xs, ys, groups = [], [], []
    for judge_set in sets:
        for row in judge_set.rows:
            if row["task"] != task or row["condition"] != "clean":
                continue
            cameras = camera_order(row["cameras"])
            clips = {c: row["clip"][c] for c in cameras}
            group = f"{row['episode_key']}"
            xs.append(stack([decode_png(judge_set.image_bytes(row, clips[c][-1])) for c in cameras]))
            ys.append(float(row["success"]))
            groups.append(group)
            if row["success"]:
                n = len(row["frame_steps"]) - 1
                for k in range(int(n * NEGATIVE_FRACTION)):
                    xs.append(stack([decode_png(judge_set.image_bytes(row, clips[c][k])) for c in cameras]))
                    ys.append(0.0)
                    groups.append(group)
    if not xs:
        raise ValueError(f"no clean {task} samples in the training judge sets")
    return np.stack(xs), np.asarray(ys, dtype=np.float32), np.asarray(groups)


def balanced_accuracy(labels: np.ndarray, predicted: np.ndarray) -> Optional[float]:
    """Mean of the two recalls; None unless both classes are present."""
    labels, predicted = np.asarray(labels, bool), np.asarray(predicted, bool)
    if labels.all() or not labels.any():
        return None
    return float((predicted[labels].mean() + (~predicted[~labels]).mean()) / 2)


def train_task(x: np.ndarray, y: np.ndarray, groups: np.ndarray, config: TrainConfig) -> Dict[str, Any]:
    """Train one task's classifier (held-out episodes for validation); its state dict and metrics."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    unique = np.unique(groups)
    held = set(np.random.default_rng(config.seed).permutation(unique)[: max(1, int(len(unique) * config.val_fraction))])
    val = np.array([g in held for g in groups])
    net = build_net(x.shape[1])
    opt = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    train_idx = torch.from_numpy(np.flatnonzero(~val))
    positives = float(y[~val].sum())
    pos_weight = torch.tensor((len(train_idx) - positives) / max(positives, 1.0))
    pad = config.shift_px
    for _ in range(config.epochs):
        net.train()
        order = train_idx[torch.randperm(len(train_idx), generator=gen)]
        for i in range(0, len(order), config.batch):
            batch = order[i : i + config.batch]
            images = torch.nn.functional.pad(xt[batch], (pad, pad, pad, pad), mode="replicate")
            dx, dy = torch.randint(0, 2 * pad + 1, (2,), generator=gen).tolist()
            images = images[:, :, dy : dy + x.shape[2], dx : dx + x.shape[3]]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(net(images).squeeze(1), yt[batch],
                                                                        pos_weight=pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        prob = torch.sigmoid(net(xt).squeeze(1)).numpy()
    predicted = prob >= THRESHOLD
    return {"state_dict": net.state_dict(), "channels": int(x.shape[1]),
            "metrics": {"examples": int(len(y)), "positives": int(y.sum()), "held_out_examples": int(val.sum()),
                        "held_out_episodes": len(held),
                        "train_balanced_accuracy": balanced_accuracy(y[~val], predicted[~val]),
                        "held_out_balanced_accuracy": balanced_accuracy(y[val], predicted[val])}}


def train(sets: Sequence[Path | str], out: Path | str = WEIGHTS_DIR, config: TrainConfig = TrainConfig(),
          tasks: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Train the classifier of every task found in the training judge sets; write weights and a manifest."""
    import torch

    started = time.perf_counter()
    judge_sets = [JudgeSet(s) for s in sets]
    found = sorted({row["task"] for js in judge_sets for row in js.rows})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries: Dict[str, Any] = {}
    for task in tasks or found:
        x, y, groups = training_examples(judge_sets, task)
        t0 = time.perf_counter()
        result = train_task(x, y, groups, config)
        path = out / f"{task}.pt"
        torch.save(result["state_dict"], path)
        entries[task] = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                         "channels": result["channels"], **result["metrics"],
                         "train_s": round(time.perf_counter() - t0, 1)}
    manifest = {"judge": "end-state", "input_size": INPUT_SIZE, "threshold": THRESHOLD,
                "negative_fraction": NEGATIVE_FRACTION, "config": asdict(config),
                "training_sets": [{"path": str(js.root), "export_hash": js.export_hash, "samples": len(js.rows)}
                                  for js in judge_sets],
                "tasks": entries, "wall_s": round(time.perf_counter() - started, 1)}
    manifest["weights_sha256"] = hashlib.sha256(json.dumps(
        {t: e["sha256"] for t, e in sorted(entries.items())}, sort_keys=True).encode()).hexdigest()
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


# Training rollouts: clean, on the judge-training seed stream; base episodes per policy.
TRAINING_TASKS = ("Lift", "Stack", "PickPlaceCan")
TRAINING_EPISODES = {"reference": range(16), "expert": range(8), "random": range(8)}


def make_training_sets(root: Path | str, execution=None, tasks: Sequence[str] = TRAINING_TASKS) -> List[Path]:
    """Record the training rollouts (one run per policy, with step logs) and export each as a judge set
    (default export settings); resumable. The judge sets' paths."""
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.judging.export import export_judge
    from robocasa_shift.study.runner import run

    execution = execution or ExecutionConfig()
    sets = []
    for policy, episodes in TRAINING_EPISODES.items():
        run_dir = Path(root) / policy
        run(run_dir, list(tasks), ["clean"], list(episodes), StudyConfig(policy=policy, log_steps=True), execution,
            phase="judge-training")
        export_judge(run_dir, run_dir / "judge-set", execution=execution)
        sets.append(run_dir / "judge-set")
    return sets


class EndStateJudge(Judge):
    """The learned end-state classifier (see the module docstring); ``weights_dir`` to load others."""

    name = "end-state"
    inputs = "end"

    def __init__(self, weights_dir: Optional[str] = None, threshold: float = THRESHOLD):
        require("torch", "policy", "the end-state judge", load=False)
        self.weights_dir = Path(weights_dir or WEIGHTS_DIR)
        path = self.weights_dir / MANIFEST
        if not path.exists():
            raise WeightsMissing(f"no end-state judge weights at {path}; run `make train-judge`")
        self.manifest = json.loads(path.read_text())
        self.threshold = float(threshold)
        self._nets: Dict[str, Any] = {}

    def _net(self, task: str):
        import torch

        if task not in self._nets:
            entry = self.manifest["tasks"].get(task)
            if entry is None:
                raise WeightsMissing(f"the end-state judge has no classifier for task {task!r} "
                                     f"(it has {', '.join(sorted(self.manifest['tasks']))})")
            net = build_net(entry["channels"])
            # weights_only: a weights file is data; never let one run code
            net.load_state_dict(torch.load(self.weights_dir / entry["file"], map_location="cpu", weights_only=True))
            net.eval()
            self._nets[task] = net
        return self._nets[task]

    def probabilities(self, samples: Sequence[JudgeSample]) -> np.ndarray:
        import torch

        out = np.zeros(len(samples))
        for task in sorted({s.task for s in samples}):
            index = [i for i, s in enumerate(samples) if s.task == task]
            x = np.stack([stack([samples[i].frame("end", c) for c in samples[i].cameras]) for i in index])
            channels = self.manifest["tasks"].get(task, {}).get("channels")
            if channels is not None and x.shape[1] != channels:
                raise BadInput(f"the end-state judge reads {channels // 3} camera(s) per sample and this judge set "
                               f"has {x.shape[1] // 3}; export with --cameras both")
            with torch.no_grad():
                out[index] = torch.sigmoid(self._net(task)(torch.from_numpy(x)).squeeze(1)).numpy()
        return out

    def judge(self, samples: Sequence[JudgeSample]) -> List[Verdict]:
        return [Verdict(bool(p >= self.threshold), float(p)) for p in self.probabilities(samples)]

    def identity(self) -> Dict[str, Any]:
        return {"name": self.name, "weights_sha256": self.manifest.get("weights_sha256"), "threshold": self.threshold}


__all__ = ["EndStateJudge", "TrainConfig", "WEIGHTS_DIR", "balanced_accuracy", "build_net", "train"]
