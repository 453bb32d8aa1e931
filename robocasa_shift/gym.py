"""Gymnasium wrapper: a paired, perturbed episode of any backend for your own evaluation loop.

``PerturbedEnv(backend, task, condition, episode, run_dir=...)`` is a ``gymnasium.Env`` whose episodes are
the harness's rollouts, run by the same engine (``engine.rollout.Rollout``) with the policy left out: your
loop chooses the actions. ``gymnasium.make`` ids are registered on import::

    import gymnasium
    import robocasa_shift.gym  # registers robocasa_shift/PerturbedEnv-v0 and robocasa_shift/<backend>-<task>-v0

    env = gymnasium.make("robocasa_shift/robosuite-Lift-v0", condition="camera:L2",
                         run_dir="runs/mine", policy="my-vla")
    obs, info = env.reset(seed=0)                 # base episode 0, fingerprinted, then perturbed
    my_policy.seed(info["policy_seed"])           # the seed the harness would give your policy
    while True:
        obs, reward, terminated, truncated, info = env.step(my_policy(obs))
        if terminated or truncated:               # success / the task's official horizon
            break
    env.close()                                   # then: robocasa-shift audit runs/mine

- ``reset(seed=e)`` (or ``options={"episode": e}``) restores base episode ``e`` (the key's env seed and base
  state), takes the pre-perturbation fingerprint, injects the condition (``options={"condition": c}``, its
  frozen parameters, the draw from the factor's seed stream) and returns the observation as the harness
  delivers it to a policy: the cameras of ``camera_roles`` rendered at ``image_size`` after any
  observation-side factor (blur), the robot's proprio, and the delivered instruction (the ``language``
  factor's paraphrase). Other options: ``replicate``, ``phase`` and ``policy_rng_fingerprint``. Without a
  seed or an episode, ``reset`` runs the next base episode, from ``episode`` on, that the run directory has
  not planned under the condition (without ``run_dir``: that this environment has not run), so the
  sub-environments of ``gymnasium.make_vec`` (sync or async, each autoreset included) run distinct keys.
- ``step(action)`` applies one action (the embodiment's, ``action_space``), then updates the StageTracker
  and the task's official success check on the post-step state: ``terminated`` on success, ``truncated``
  at the official horizon (registered as the id's ``max_episode_steps``), ``reward`` 1.0 on the success
  step, 0.0 otherwise.
- ``info``: ``key``, ``base_episode``, ``step``, ``horizon``, ``policy_seed`` (seed your policy with it: every
  condition of a base episode shares it, which is what pairs the rollouts on the policy side),
  ``env_fingerprint``, ``policy_rng_fingerprint``, ``subgoals`` (latched subgoal -> its step, None until it
  latches, in the spec's order), ``latched``, ``success``, ``perturbation`` (what was applied, read back from
  the simulator), and ``record`` (the record's path once the episode is written). No key that Gymnasium's
  wrappers reserve (``episode``: ``RecordEpisodeStatistics``).
- Every finished episode is written to ``run_dir`` as a record of the run store (manifest, plan, atomic
  files), so ``audit``, ``analyze``, ``export``, ``report`` and ``compare`` read it like a study the CLI ran.
  An episode the loop ends before success or the horizon (another ``reset``, ``close``, a ``TimeLimit``
  shorter than the horizon) is written as truncated at the step it reached, which the audit reports as an
  unexpected truncation; its key may be run again. A key with a complete record is refused (a key runs once
  per run directory). Without ``run_dir`` nothing is written.

The policy RNG fingerprint is yours to report (``options={"policy_rng_fingerprint": ...}`` or
:meth:`PerturbedEnv.report_policy_fingerprint`, e.g. a hash of your generator's state after seeding it with
``info["policy_seed"]``); a record without one holds ``"external-unreported"``, and pairing on the policy side
is then your loop's word. The report cannot re-run an external loop, so its matched-pair videos are left out.
"""

from __future__ import annotations

import copy
import os
import string
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.core import specs
from robocasa_shift.core.backend import cameras_for_roles, check_hooks
from robocasa_shift.core.conditions import Condition
from robocasa_shift.core.factors import required_hooks
from robocasa_shift.core.policy import Observation, Policy
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.engine.rollout import Rollout, prepare_episode
from robocasa_shift.errors import BadInput, RendererError, RolloutError, RunDirError, UnknownNameError
from robocasa_shift.extras import require
from robocasa_shift.rundir.store import RunStore, parse_record
from robocasa_shift.seeding import PHASES
from robocasa_shift.study.runner import SEED_RULE, package_versions

gymnasium = require("gymnasium", "gym", "robocasa_shift.gym")  # without it: DependencyMissing, the gym extra's pip line
spaces = gymnasium.spaces

EXTERNAL_FINGERPRINT = "external-unreported"
DRIVER = "robocasa_shift.gym.PerturbedEnv"
RESET_OPTIONS = ("episode", "condition", "replicate", "phase", "policy_rng_fingerprint")
DEFAULT_FPS = 20  # a backend that names no control frequency (the fake one): robosuite's and LIBERO's
# Characters an instruction may hold in the observation space (gymnasium's Text defaults to alphanumerics).
INSTRUCTION_CHARSET = string.printable


class ExternalPolicy(Policy):
    """The loop's policy as the engine sees it: what it reads, its name, the fingerprint the loop reports.

    It never acts (:meth:`PerturbedEnv.step` takes the loop's actions); ``reset`` keeps the seed the engine
    derives for the key.
    """

    deterministic = False
    state_refusal = "an external loop's policy lives outside the harness, so its rollouts cannot be branched"

    def __init__(self, name: str, camera_roles: Sequence[str], image_size: int):
        self.name = str(name)
        self.camera_roles = tuple(camera_roles)
        self.image_size = int(image_size)
        self.seed: Optional[int] = None
        self.fingerprint = EXTERNAL_FINGERPRINT

    def reset(self, seed: int) -> None:
        self.seed = int(seed)

    def rng_fingerprint(self) -> str:
        return self.fingerprint

    def act(self, obs: Observation) -> np.ndarray:
        raise RuntimeError("an external loop chooses the actions: call PerturbedEnv.step")

    def identity(self) -> Dict[str, Any]:
        return {"name": self.name, "driver": DRIVER, "camera_roles": list(self.camera_roles),
                "image_size": self.image_size}


# One RunStore per run directory and process, shared by the PerturbedEnvs writing to it, holding the directory's
# lock in shared mode: the sub-environments of an async vector env, each in its own process, share it too, and
# claim keys under the store's plan lock; a command of the CLI (exclusive) cannot run beside them.
_STORES: Dict[Path, List[Any]] = {}


def _acquire_store(run_dir: Union[str, Path]) -> RunStore:
    root = Path(run_dir).resolve()
    if root not in _STORES:
        _STORES[root] = [RunStore(root).lock(shared=True), 0]
    _STORES[root][1] += 1
    return _STORES[root][0]


def _release_store(store: RunStore) -> None:
    root = store.root.resolve()
    entry = _STORES.get(root)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        entry[0].unlock()
        del _STORES[root]


def _condition(value: Any) -> str:
    return str(value if isinstance(value, Condition) else Condition.parse(str(value)))


class PerturbedEnv(gymnasium.Env):
    """A backend's task under one condition, one base episode per ``reset``, recorded in a run directory.

    Args:
        backend: a registered backend's name (``robosuite``, ``libero``, ``robocasa``, ``fake``) or a backend.
        task: the backend's task.
        condition: ``clean`` or ``factor:Lk`` (a :class:`Condition` or its text), the default of each reset.
        episode: the base episode, the default of each reset.
        run_dir: where finished episodes are written (None: nowhere).
        phase: the base episodes' seed stream (``formal``, ``screening``, ``validation``).
        replicate: the policy-seed replicate.
        policy: the name your policy's records carry.
        camera_roles: the cameras your policy reads (``third_person``, ``wrist``); only those are rendered.
        image_size: square render size.
        render_profile, stock_simulator: as the CLI's options (recorded in the manifest).
        render_mode: ``rgb_array`` to let ``render()`` return the first camera's current frame.

    Raises:
        UnknownNameError: an unknown backend, task, condition or phase.
        RunDirLocked: another process writes to ``run_dir``.
        RunDirError: ``run_dir`` was made by another study (spec hash, backend, policy, versions).
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, backend: Any = "robosuite", task: Optional[str] = None, condition: Any = "clean",
                 episode: int = 0, run_dir: Union[None, str, Path] = None, *, phase: str = "formal",
                 replicate: int = 0, policy: str = "external", camera_roles: Sequence[str] = ("third_person", "wrist"),
                 image_size: int = 128, render_profile: str = "fast", stock_simulator: bool = False,
                 render_mode: Optional[str] = None):
        if isinstance(backend, str):
            self.backend_name, self.backend = backend, get_backend(backend)
        else:
            self.backend_name, self.backend = str(getattr(backend, "name")), backend
        if task is None:
            raise BadInput(f"PerturbedEnv needs a task of backend {self.backend_name}: "
                           f"{', '.join(self.backend.task_names())}")
        if render_mode not in (None, "rgb_array"):
            raise UnknownNameError("render mode", str(render_mode), ["rgb_array"])
        self.protocol = specs.load_protocol(verify=True)
        self.task_info = self.backend.task(task)
        self.task = task
        self.defaults = self._key_fields(episode=episode, condition=condition, replicate=replicate, phase=phase)
        self.backend.check_available()
        self.stage_spec = specs.load_stage_spec(self.backend_name, task)
        self.render_profile, self.stock_simulator, self.render_mode = render_profile, bool(stock_simulator), render_mode
        config = self.backend.config()
        fps = config.get("control_freq_hz") or config.get("control_freq") or DEFAULT_FPS
        self.metadata = {**self.metadata, "render_fps": int(fps)}  # one frame per control step
        self.policy = ExternalPolicy(policy, camera_roles, image_size)
        self.env = self.backend.make(task, render_profile=render_profile, stock_simulator=self.stock_simulator)
        self.store: Optional[RunStore] = None
        try:
            check_hooks(self.env, required_hooks(self.protocol), self.backend_name)
            self._check_optional_hooks(self.defaults[1])
            self.cameras = cameras_for_roles(self.env, self.policy.camera_roles)
            self.action_dim = int(self.env.action_layout.dim if self.env.action_layout is not None else 12)
            self.action_space = spaces.Box(-1.0, 1.0, (self.action_dim,), np.float64)
            self.observation_space = self._observation_space()
            if run_dir is not None:
                self.store = _acquire_store(run_dir)
                with self.store.plan_lock():
                    self.store.ensure_manifest(self._manifest())
                self.store.log_command({"driver": DRIVER, "task": task, "policy": self.policy.name})
        except BaseException:
            self.close()
            raise
        self._rollout: Optional[Rollout] = None
        self._ran: set = set()  # the keys this environment ran (the next-episode rule without a run directory)
        self._supersede = self._claimed = False
        self._renderer: Optional[str] = None
        self._last_obs_time = 0.0
        self._record_path: Optional[str] = None

    # ------------------------------------------------------------------ set-up

    def _key_fields(self, episode: Any, condition: Any, replicate: Any, phase: Any) -> Tuple[int, str, int, str]:
        """``(episode, condition, replicate, phase)``, each checked."""
        if phase not in PHASES:
            raise UnknownNameError("phase", str(phase), list(PHASES))
        condition = _condition(condition)
        self.protocol.condition(condition)  # an unknown factor or level lists the valid ones
        for name, value in (("episode", episode), ("replicate", replicate)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise BadInput(f"{name} must be an integer >= 0, got {value!r}")
        return int(episode), condition, int(replicate), str(phase)

    def _check_optional_hooks(self, condition: str) -> None:
        named = set(Condition.parse(condition).factors)
        held = [f for f in sorted(named) if self.protocol.factor(f).kind == "action_hold"]
        if held:  # the loop is yours: it acts at every step, so a lower control rate cannot be imposed here
            raise BadInput(f"condition {condition!r}: factor {held[0]} holds each action for several control steps, "
                           "which a loop that sends an action at every step cannot do; run it with `robocasa-shift "
                           "run` (action and observation latency do work here)")
        optional = sorted(named & set(self.protocol.optional_factors))
        if optional:
            check_hooks(self.env, required_hooks(self.protocol, optional), self.backend_name)

    def _observation_space(self) -> spaces.Dict:
        """Images of the policy's cameras (no ``images`` key when it reads none: Gymnasium allows no empty Dict
        space), the proprio the backend delivers (shapes read from a reset), the instruction."""
        episode, _, _, phase = self.defaults
        prepare_episode(self.env, self.protocol, RolloutKey(phase, self.task, episode, "clean"))
        proprio = {k: np.asarray(v) for k, v in self.env.proprio().items()}
        size = self.policy.image_size
        images = {"images": spaces.Dict({c: spaces.Box(0, 255, (size, size, 3), np.uint8) for c in self.cameras})}
        return spaces.Dict({
            **(images if self.cameras else {}),
            "proprio": spaces.Dict({k: spaces.Box(-np.inf, np.inf, v.shape, v.dtype if v.dtype.kind == "f" else
                                                  np.float64) for k, v in proprio.items()}),
            "instruction": spaces.Text(max_length=4096, min_length=0, charset=INSTRUCTION_CHARSET),
        })

    def _manifest(self) -> Dict[str, Any]:
        """The run's manifest, as ``study.runner.study_manifest`` writes one for the CLI."""
        info = self.task_info
        return {
            "spec_hash": self.protocol.spec_hash,
            "spec_files": dict(self.protocol.file_hashes),
            "study_seed": self.protocol.study_seed,
            "backend": self.backend_name,
            "env_config": self.backend.config(),
            "policy": self.policy.identity(),
            "policy_options": {},
            "stage_spec_hashes": {self.task: self.stage_spec.content_hash},
            "task_variants": {self.task: info.variant_of} if getattr(info, "variant_of", None) else {},
            "versions": package_versions({**self.backend.versions(), "gymnasium": gymnasium.__version__}),
            "render_profile": self.render_profile,
            "seed_rule": SEED_RULE,
            "command": f"{DRIVER}(backend={self.backend_name!r}, task={self.task!r}) in {os.path.basename(sys.argv[0])}",
        }

    # ------------------------------------------------------------------ episodes

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        """Restore a base episode, fingerprint it, inject the condition; the first observation and ``info``.

        ``seed`` (or the option ``episode``) is the base episode; without either, the next one from the default
        ``episode`` on whose key the run directory has not planned (without one: this environment has not run).

        Raises:
            BadInput: an unknown option or a bad value.
            RunDirError: the key already has a complete record in ``run_dir``.
            RolloutError: the episode could not start (its invalid record is written).
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise BadInput(f"PerturbedEnv.reset takes no option {unknown[0]!r}; its options: {', '.join(RESET_OPTIONS)}")
        self._end_early()
        episode, condition, replicate, phase = self.defaults
        chosen = options.get("episode", seed)
        episode, condition, replicate, phase = self._key_fields(
            episode if chosen is None else chosen, options.get("condition", condition),
            options.get("replicate", replicate), options.get("phase", phase))
        self._check_optional_hooks(condition)
        self._supersede = self._claimed = False
        self._record_path = None
        if self.store is None:
            key = self._next_key(RolloutKey(phase, self.task, episode, condition, replicate), chosen, self._ran)
        else:
            with self.store.plan_lock():  # sub-environments in other processes claim keys too
                planned = set(self.store.planned_keys())
                key = self._next_key(RolloutKey(phase, self.task, episode, condition, replicate), chosen, planned)
                self._supersede = self._check_rerun(key)
                self._claimed = key not in planned
                self.store.add_to_plan([key])
        self._ran.add(key)
        fingerprint = options.get("policy_rng_fingerprint", EXTERNAL_FINGERPRINT)
        if not isinstance(fingerprint, str) or not fingerprint:
            raise BadInput(f"policy_rng_fingerprint must be a non-empty string, got {fingerprint!r}")
        self.policy.fingerprint = fingerprint
        rollout = Rollout(self.env, self.policy, key, self.protocol, self.stage_spec, self.backend_name)
        self._rollout = rollout
        rollout.begin()
        obs = None if rollout.done else rollout.observe()
        if obs is None:  # the reset, the perturbation or the first render failed (or a horizon of 0)
            record = self._finish()
            raise RolloutError(f"{key.id} could not start: {record.error or 'the horizon is 0'}")
        self._last_obs_time = time.perf_counter()
        return self._observation(obs), self._info(rollout, obs)

    def step(self, action: Any):
        """One control step with ``action``; ``(observation, reward, terminated, truncated, info)``.

        Raises:
            gymnasium.error.ResetNeeded: no episode in progress.
            ValueError: an action of another shape, or with a non-finite value (the episode goes on).
            RolloutError: the simulator failed (the episode's invalid record is written).
        """
        rollout = self._rollout
        if rollout is None:
            raise gymnasium.error.ResetNeeded("call reset() before step(): no episode is in progress")
        value = np.asarray(action, dtype=np.float64)
        if value.shape != (self.action_dim,):
            raise ValueError(f"an action of {self.backend_name}'s {self.task} has shape ({self.action_dim},), "
                             f"got {value.shape}")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"the action has non-finite values: {value.tolist()}")
        rollout.load(value[None], time.perf_counter() - self._last_obs_time)
        rollout.step()
        record = rollout.record
        if not record.valid:
            self._finish()
            raise RolloutError(f"{record.key.id} failed at step {rollout.step_index}: {record.error}")
        terminated = bool(rollout.done and record.success)
        truncated = bool(rollout.done and not record.success)
        if rollout.done:
            self._finish()
        obs = rollout.observe()  # after the last step too: gymnasium returns a final observation
        if obs is None:
            raise RendererError(f"{record.key.id}: rendering the observation after step {rollout.step_index} failed: "
                                f"{rollout.record.error}")
        self._last_obs_time = time.perf_counter()
        return self._observation(obs), (1.0 if terminated else 0.0), terminated, truncated, self._info(rollout, obs)

    def report_policy_fingerprint(self, fingerprint: str) -> None:
        """Record your policy's RNG fingerprint for the episode in progress (e.g. after seeding it from ``info``)."""
        if self._rollout is None:
            raise gymnasium.error.ResetNeeded("no episode is in progress: report the fingerprint after reset()")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise BadInput(f"a policy RNG fingerprint is a non-empty string, got {fingerprint!r}")
        self.policy.fingerprint = fingerprint
        self._rollout.record.policy_rng_fingerprint = fingerprint

    def render(self) -> Optional[np.ndarray]:
        """The first camera's current frame (``render_mode="rgb_array"``; the third-person view for a policy that
        reads none), without any observation-side factor."""
        if self.render_mode != "rgb_array":
            return None
        camera = self.cameras[0] if self.cameras else cameras_for_roles(self.env, ("third_person",))[0]
        return self.env.render(camera, self.policy.image_size)

    def close(self) -> None:
        """Write an episode in progress as truncated, close the simulator, release the run directory."""
        try:
            self._end_early()
        finally:
            env, self.env = getattr(self, "env", None), None
            if env is not None:
                env.close()
            store, self.store = getattr(self, "store", None), None
            if store is not None:
                _release_store(store)

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _next_key(key: RolloutKey, chosen: Any, taken: set) -> RolloutKey:
        """``key`` when its episode was chosen, else the first of its episode on that is not in ``taken``."""
        while chosen is None and key in taken:
            key = RolloutKey(key.phase, key.task, key.episode + 1, key.condition, key.replicate)
        return key

    def _check_rerun(self, key: RolloutKey) -> bool:
        """Whether ``key``'s current record is to be superseded (it has one that is invalid or truncated).

        Raises:
            RunDirError: its record is complete (success or the official horizon): a key runs once.
        """
        path = self.store.record_path(key)
        if not path.exists():
            return False
        existing, _ = parse_record(path.read_bytes())
        if existing is not None and existing.get("valid") is True and not existing.get("truncated"):
            raise RunDirError(f"{key.id} already has a complete record in {self.store.root} (a key runs once per "
                              "run directory): reset to another episode, condition or replicate, or use another run_dir")
        return True

    def _end_early(self) -> None:
        """An episode in progress that the loop ended (``reset``, ``close``: Gymnasium's truncation, e.g. by a
        ``TimeLimit`` wrapper) is recorded as truncated at the step it reached; one never stepped (a vector env's
        autoreset before the loop stopped) is not recorded, and its key is unclaimed when this env claimed it."""
        rollout = getattr(self, "_rollout", None)
        if rollout is None:
            return
        if rollout.step_index == 0:
            self._rollout = None
            self._ran.discard(rollout.record.key)
            if self.store is not None and self._claimed:
                with self.store.plan_lock():
                    self.store.drop_from_plan([rollout.record.key])
            return
        if rollout.record.success is None:
            rollout.record.success = False
        self._finish()

    def _finish(self) -> Record:
        """End the episode in progress and write its record (when there is a run directory)."""
        rollout, self._rollout = self._rollout, None
        record = rollout.finish()
        record.renderer = self._renderer_summary()
        if self.store is not None:
            with self.store.plan_lock():
                if self._supersede:
                    self.store.supersede(record.key)
                self._record_path = str(self.store.write(record))
        return record

    def _renderer_summary(self) -> str:
        if self._renderer is None:
            info = self.env.renderer_info()
            self._renderer = f"{info.get('MUJOCO_GL')}/{info.get('gl_renderer')}/{info.get('render_profile')}"
            if self.store is not None:  # what drew the frames, as the CLI's runs record it
                simulator = self.env.simulator_info() if hasattr(self.env, "simulator_info") else {}
                with self.store.plan_lock():
                    self.store.ensure_manifest({"renderer": info, "simulator": simulator})
        return self._renderer

    def _observation(self, obs: Observation) -> Dict[str, Any]:
        images = {"images": dict(obs.images)} if self.cameras else {}
        return {**images, "proprio": {k: np.asarray(v) for k, v in obs.proprio.items()}, "instruction": obs.instruction}

    def _info(self, rollout: Rollout, obs: Observation) -> Dict[str, Any]:
        record = rollout.record
        steps = list(rollout.tracker.stage_steps)
        names = self.stage_spec.names
        return {
            "key": record.key.id,
            "task": record.task, "phase": record.phase, "base_episode": record.episode, "condition": record.condition,
            "replicate": record.replicate,
            "step": rollout.step_index,
            "horizon": rollout.horizon,
            "policy_seed": record.policy_seed,
            "env_seed": record.env_seed,
            "env_fingerprint": record.env_fingerprint,
            "policy_rng_fingerprint": record.policy_rng_fingerprint,
            "subgoals": dict(zip(names, steps)),
            "latched": [n for n, s in zip(names, steps) if s is not None],
            "success": bool(record.success),
            "perturbation": copy.deepcopy(record.perturbation),
            "camera_roles": dict(obs.camera_roles),
            "record": self._record_path if rollout.done else None,
        }


# =========================================================================== gymnasium.make ids


def _builtin_tasks() -> Dict[str, Dict[str, int]]:
    """The built-in backends' tasks and their official horizons (their task tables only: no simulator is imported)."""
    from robocasa_shift.backends import fake, libero_tasks, robosuite_tasks

    return {"fake": {name: task.horizon for name, task in fake.TASKS.items()},
            "robosuite": {name: task.horizon for name, task in robosuite_tasks.TASKS.items()},
            "libero": {name: libero_tasks.parse_task(name).horizon for name in libero_tasks.task_names()}}


def register_envs() -> List[str]:
    """Register ``robocasa_shift/PerturbedEnv-v0`` (any backend and task as arguments) and
    ``robocasa_shift/<backend>-<task>-v0`` for the built-in backends' tasks, with the task's official horizon as
    ``max_episode_steps``; the ids registered."""
    ids = []
    entries = [("robocasa_shift/PerturbedEnv-v0", {}, None)]
    entries += [(f"robocasa_shift/{backend}-{task}-v0", {"backend": backend, "task": task}, horizon)
                for backend, tasks in _builtin_tasks().items() for task, horizon in tasks.items()]
    for env_id, kwargs, horizon in entries:
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=f"{__name__}:PerturbedEnv", kwargs=kwargs,
                               max_episode_steps=horizon, disable_env_checker=False)
        ids.append(env_id)
    return ids


ENV_IDS = register_envs()

__all__ = ["DRIVER", "ENV_IDS", "EXTERNAL_FINGERPRINT", "ExternalPolicy", "PerturbedEnv", "register_envs"]
