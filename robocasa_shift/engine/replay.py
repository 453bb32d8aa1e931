"""Re-running recorded rollouts with frame capture (pair videos), checked against their records.

Rollouts are deterministic given their key, so a pair is re-run from its keys
instead of recording frames for every rollout; a re-run that does not
reproduce its record's outcome and subgoal steps is reported, never hidden.

A run directory may come from someone else, so its manifest is not trusted
to say where a re-run connects, what it sends or what it loads. Policy
options that connect, authenticate or deserialize (``host``, ``port``,
``uri``, ``serializer``, ``api_token``/``api_key`` and every other secret,
checkpoint and other file paths, ...; see :func:`is_connection_option`) are
taken only from the reader's own command line (``report --policy-option
KEY=VALUE``), or from the manifest behind an explicit ``--trust-run-dir``.
``allow_pickle`` and a serializer other than msgpack are never taken from a
file, trusted or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.config import SECRET_PLACEHOLDER, StudyConfig, is_env_reference, is_secret_option
from robocasa_shift.core.factors import factor_kind
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.core.specs import load_protocol, load_stage_spec
from robocasa_shift.engine.rollout import Observer, run_rollout
from robocasa_shift.errors import PolicyOptionError, RunDirError
from robocasa_shift.policies import make_policy

# Record fields a re-run must reproduce exactly.
REPRODUCED_FIELDS = ("success", "steps", "stage_steps")

# Policy options naming where a policy connects, or what it loads: from a run directory only when it is trusted.
CONNECTION_OPTIONS = frozenset({"host", "port", "uri", "url", "endpoint", "address", "server", "serializer",
                                "checkpoint", "weights_dir", "model_path", "demo_dir"})
# Option name endings that name a file to load (a checkpoint beside the shared directory may hold a pickle).
PATH_SUFFIXES = ("_path", "_dir", "_file", "_checkpoint")
# The one serializer a run directory may name, and only when trusted: it decodes without running code.
SAFE_SERIALIZERS = frozenset({"msgpack"})


def is_connection_option(name: str) -> bool:
    """Whether policy option ``name`` decides where a re-run connects, what it sends, or what it loads and decodes.

    The known network and checkpoint options (``CONNECTION_OPTIONS``), file paths (``PATH_SUFFIXES``),
    every secret (a name with token, key, secret or password), CURVE keys, and anything about pickling
    or trust.
    """
    lowered = name.lower()
    return (lowered in CONNECTION_OPTIONS or lowered.endswith(PATH_SUFFIXES) or is_secret_option(name)
            or lowered.startswith(("curve_", "trust")) or "pickle" in lowered)


def never_from_file(name: str, value: Any) -> bool:
    """Whether option ``name=value`` must come from a command line even when the run directory is trusted.

    ``allow_pickle`` (and any pickle switch) and a serializer other than msgpack: they let whoever
    answers run code in this process, so a file never turns them on.
    """
    lowered = name.lower()
    return "pickle" in lowered or (lowered == "serializer" and value not in SAFE_SERIALIZERS)


def replay_policy_options(manifest: Mapping[str, Any], command_line: Optional[Mapping[str, Any]] = None,
                          trust_run_dir: bool = False) -> Dict[str, Any]:
    """The policy options a re-run of ``manifest``'s rollouts uses.

    The manifest's options, less those :func:`is_connection_option` names (unless ``trust_run_dir``),
    less those :func:`never_from_file` names, less redacted secrets (and URLs whose credentials were
    redacted), and less every ``env:NAME`` reference even when trusted: a manifest may not choose which
    environment variable is read and sent (``env:HOME`` to its own host); the reader names the
    variables on the command line (``--policy-option api_token=env:NAME``). Then ``command_line`` on top.

    Raises:
        PolicyOptionError: the manifest sets an option that was withheld and ``command_line`` does not
            give it: the message lists them and says how to give them (nothing has connected yet).
    """
    given = dict(command_line or {})
    options: Dict[str, Any] = {}
    withheld: Dict[str, Any] = {}
    for name, value in dict(manifest.get("policy_options") or {}).items():
        if name in given:
            continue
        if never_from_file(name, value) or value == SECRET_PLACEHOLDER \
                or (is_secret_option(name) and is_env_reference(value)) \
                or (isinstance(value, str) and SECRET_PLACEHOLDER in value):
            withheld[name] = value
        elif is_connection_option(name) and not trust_run_dir:
            withheld[name] = value
        else:
            options[name] = value
    if withheld:
        policy = (manifest.get("policy") or {}).get("name", "?")
        # secrets are not shown (the manifest holds a placeholder at best); the rest helps to retype them
        shown = ", ".join(name if is_secret_option(name) else f"{name}={value!r}" for name, value in withheld.items())
        raise PolicyOptionError(
            f"the run directory's manifest sets options of policy {policy!r} that decide where a re-run connects, "
            f"what it sends or what it loads ({shown}); they are not taken from a run directory that "
            "someone else may have written. Give each with --policy-option KEY=VALUE on this command line, or pass "
            "--trust-run-dir if you trust whoever wrote the directory (allow_pickle, a serializer other than msgpack, "
            "redacted secrets and env:NAME references are never taken from a file: name the variable yourself, e.g. "
            "--policy-option api_token=env:NAME), or --videos 0 to skip the re-runs")
    return {**options, **given}


def study_from_manifest(manifest: Mapping[str, Any], policy_options: Optional[Mapping[str, Any]] = None,
                        trust_run_dir: bool = False) -> StudyConfig:
    """The study a run directory's manifest describes (connection options only from the caller, see
    :func:`replay_policy_options`)."""
    options = replay_policy_options(manifest, policy_options, trust_run_dir)
    return StudyConfig(backend=manifest["backend"], policy=manifest["policy"]["name"],
                       policy_options=tuple(options.items()), render_profile=manifest.get("render_profile", "fast"))


def observation_transform(protocol, condition: str, key: Optional[RolloutKey] = None
                          ) -> Optional[Callable[..., np.ndarray]]:
    """The image transform of ``condition``'s observation-side factors (blur, sensor noise), or None: frames as the
    policy saw them. Called as ``transform(image, camera="", role=None, frame=0)``: a noise draws its per-frame
    randomness from the episode's draw (recomputed from ``key``'s seed stream; seed 0 without a key), the frame's
    control step and the camera, and leaves cameras of other roles alone (``role=None`` counts as third person)."""
    from robocasa_shift import seeding

    stages = []
    for shift in protocol.condition(condition).shifts:
        spec = protocol.factor(shift.factor)
        kind = factor_kind(spec)
        if kind.side != "obs":
            continue
        draw = None
        if key is not None:
            draw = kind.replay_draw(spec, seeding.draw_rng(protocol.study_seed, shift.factor, key.task, key.phase,
                                                           key.episode), 0)
        stages.append((kind, spec.level(shift.level), draw if draw is not None else [0]))
    if not stages:
        return None

    def transform(image: np.ndarray, camera: str = "", role: Optional[str] = None, frame: int = 0) -> np.ndarray:
        for kind, params, draw in stages:
            image = kind.transform_frame(image, params, draw, frame, camera, role or "third_person")
        return image

    return transform


class FrameCapture(Observer):
    """Captures what the given cameras see at every control step, and when subgoals latch.

    ``transform`` applies the condition's observation-side factor, so the frames
    are what the policy saw.
    """

    def __init__(self, cameras: List[str], size: int, transform: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        self.cameras, self.size, self.transform = cameras, size, transform
        self.frames: List[List[np.ndarray]] = []
        self.latched: List[Tuple[int, str]] = []

    def _grab(self, env, step: int = 0) -> List[np.ndarray]:
        frames = [env.render(c, self.size) for c in self.cameras]
        if not self.transform:
            return frames
        wrist = set(getattr(env, "wrist_cameras", ()))
        return [self.transform(f, camera=c, role="wrist" if c in wrist else "third_person", frame=step)
                for c, f in zip(self.cameras, frames)]

    def on_start(self, env) -> None:
        self.frames = [self._grab(env)]
        self.latched = []

    def on_step(self, step, action, env, latched) -> None:
        self.frames.append(self._grab(env, step))
        self.latched += [(step, g) for g in latched]


@dataclass
class Replay:
    """One re-run rollout: its frames, its new record and how it differs from the stored one."""

    key: RolloutKey
    capture: FrameCapture
    record: Record
    problems: List[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        """The re-run matched the stored record on every field of ``REPRODUCED_FIELDS``."""
        return not self.problems


class Replayer:
    """Re-runs keys of one run directory as its manifest describes them (backend, policy, render profile).

    The policy's connection options come from the caller, not the manifest (see
    :func:`replay_policy_options`). Environments are built once per task and closed by
    :meth:`close` (or on leaving a ``with`` block).

    Args:
        manifest: the run directory's ``manifest.json``.
        policy_options: options from the reader's command line; they override the manifest's.
        trust_run_dir: take connection options from the manifest too.

    Raises:
        PolicyOptionError: the manifest sets a connection option the caller did not give.
    """

    def __init__(self, manifest: Mapping[str, Any], policy_options: Optional[Mapping[str, Any]] = None,
                 trust_run_dir: bool = False):
        self.manifest = manifest
        self.backend_name = manifest["backend"]
        self.protocol = load_protocol()
        # the run's generated asset kit (robocasa's stand-in kitchens): its records are re-run on the same kit
        self.asset_kit = manifest.get("asset_kit") or (manifest.get("env_config") or {}).get("asset_kit")
        self.backend = get_backend(self.backend_name, asset_kit=(self.asset_kit or {}).get("kind"))
        self.policy_options = replay_policy_options(manifest, policy_options, trust_run_dir)
        self.policy = make_policy(manifest["policy"]["name"], **self.policy_options)
        self._envs: Dict[str, Any] = {}

    def env(self, task: str):
        """The live environment of ``task``."""
        if task not in self._envs:
            env = self.backend.make(task, self.manifest.get("render_profile", "fast"))
            kit = getattr(env, "asset_kit", None)
            if (kit or {}).get("sha256") != (self.asset_kit or {}).get("sha256"):
                env.close()
                raise RunDirError(f"the run was made on asset kit {self.asset_kit}, this environment loads {kit}: "
                                  f"re-running its rollouts on other assets would compare different kitchens")
            self._envs[task] = env
        return self._envs[task]

    def replay(self, key: RolloutKey, stored: Mapping[str, Any]) -> Replay:
        """Re-run ``key`` capturing every camera at the policy's image size; compare with ``stored``."""
        env = self.env(key.task)
        cameras = list(env.third_person_cameras) + list(env.wrist_cameras)
        capture = FrameCapture(cameras, self.policy.image_size, observation_transform(self.protocol, key.condition, key))
        spec = load_stage_spec(self.backend_name, key.task)
        record = run_rollout(env, self.policy, key, self.protocol, spec, self.backend_name, observer=capture)
        problems = [f"{key.condition}: {name} recorded {stored[name]}, re-run {getattr(record, name)}"
                    for name in REPRODUCED_FIELDS if getattr(record, name) != stored[name]]
        return Replay(key, capture, record, problems)

    def replay_all(self, keys: Sequence[RolloutKey], stored: Mapping[RolloutKey, Mapping[str, Any]]) -> List[Replay]:
        """:meth:`replay` for each key, in order."""
        return [self.replay(key, stored[key]) for key in keys]

    def close(self) -> None:
        """Close every environment and the policy."""
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self.policy.close()

    def __enter__(self) -> "Replayer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
