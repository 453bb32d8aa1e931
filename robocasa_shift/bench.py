"""``make bench``: the harness against the simulator's own limit, measured side by side in one run.

Every figure is measured in the same process (or the same pools) with the
repeats interleaved, so a slow minute on the machine affects all of them
alike; each is reported as median, min and max over the repeats.

- ``physics_sps``: bare ``robosuite`` stepping (``env.step`` as the backend built it), no rendering.
- ``render_ms_<camera>``: one 128x128 frame with out-of-view geoms culled (the fast
  profile), ``render_full_ms_<camera>`` of the full scene; ``render_ms_empty``: a frame of a
  scene without geoms (what a frame costs besides its triangles).
- ``reset_ms``: the between-rollout reset (restore nominal, seeded reset, fingerprint).
- ``overhead_ratio``: harness time per control step / a bare robosuite loop with
  the same environment, the same actions (recorded from the harness rollout) and
  the same rendering cadence and cameras, in the same process.
- ``fastpath_speedup``: the same harness rollout on stock robosuite and MuJoCo (``robosuite_fastpath``
  off, full-scene renders, numpy's BLAS pool at its default size) / as the harness runs it;
  ``fused_step_speedup``: the same for a rollout that renders nothing. All must end in the
  same state, bit for bit.
- ``physics_limit_ratio``: harness time per control step of a rollout that renders nothing /
  bare ``mujoco.mj_step`` over the rollout's own substep controls, each control step from the state the
  rollout's started from (RoboCasa's fixtures move joints between steps; restoring is not timed), on the same
  model and trajectory: its final qpos must equal the harness's, bit for bit;
  ``bare_mj_step_ms`` is that denominator per control step. ``render_limit_ratio``: the
  rollout that reads both cameras every 4 steps / that bare ``mj_step`` plus MuJoCo's own
  render of the same frames (``mjv_updateScene``, ``mjr_render`` of the full scene,
  ``mjr_readPixels``, from the very states the harness rendered).
  ``profile_ms_<part>``: milliseconds per control step in physics, controller,
  observables, render, policy and the rest (bookkeeping) of one harness rollout.
- ``cadence_speedup``: a harness rollout reading one observation per chunk of
  k steps vs the same rollout reading one every step.
- ``batch_speedup``: the reference policy queried once for the 13 conditions
  of a base episode vs once per condition (policy time only); and
  ``lockstep_speedup_13``: the 13 rollouts (40 steps each) stepped in lockstep
  with batched calls vs one after another (everything included).
- ``scaling_2_workers``: formal-run throughput with 2 single-threaded workers /
  1 single-threaded worker, beside 1 worker with 2 threads; ``rss_mb`` per
  worker and ``wall_vs_parts`` (wall time per rollout / its physics + render +
  policy time) come from the same runs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from robocasa_shift import seeding
from robocasa_shift.backends import get_backend, libero_fastpath, robosuite_fastpath
from robocasa_shift.backends.mujoco_env import RENDER_PROFILES
from robocasa_shift.config import DEFAULT_POLICY, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.backend import BaseEpisode
from robocasa_shift.core.policy import Observation, act_batch
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import prepare_episode, run_lockstep, run_rollout
from robocasa_shift.policies.reference import ReferencePolicy
from robocasa_shift.study.executors import as_record
from robocasa_shift.study.worker import apply_threads, init_worker, run_in_worker

BENCH_TASK = "Lift"
# the task each backend is measured on: the embedded study's first, a LIBERO-Spatial scene, the kitchen of the
# step-cost measurements (RoboCasa's on its own assets or the stand-in kit)
BENCH_TASKS = {"robosuite": BENCH_TASK, "libero": "spatial-0", "robocasa": "RinseSinkBasin"}
BENCH_EPISODE = BaseEpisode("formal", 0)
# Mild conditions, under which the reference policy's rollouts have similar lengths: the scaling
# figure then measures parallel efficiency, not the tail of one long rollout in a short batch.
FORMAL_CONDITIONS = ("clean", "illumination:L1", "blur:L1", "base:L1")


class FixedActions:
    """A policy with no cost of its own: plays fixed actions in chunks of ``chunk``, reading both cameras (or none)."""

    name = "bench-fixed-actions"
    image_size = 128
    privileged = False
    deterministic = True

    def __init__(self, actions: np.ndarray, chunk: int, cameras: bool = True):
        self.actions, self.chunk, self._next = actions, chunk, 0
        self.camera_roles = ("third_person", "wrist") if cameras else ()

    def reset(self, seed: int) -> None:
        """Start again from the first action (the seed is irrelevant: nothing is random)."""
        self._next = 0

    def act(self, obs) -> np.ndarray:
        """The next ``chunk`` fixed actions."""
        chunk = self.actions[self._next : self._next + self.chunk]
        self._next += len(chunk)
        return chunk

    def rng_fingerprint(self) -> str:
        """Constant: the policy has no generator."""
        return "deterministic"


@contextmanager
def culling(on: bool):
    """The fast render profile with out-of-view culling on or off, for the duration."""
    profile = RENDER_PROFILES["fast"]
    saved, profile["cull"] = profile["cull"], on
    try:
        yield
    finally:
        profile["cull"] = saved


@contextmanager
def attached(env, targets: Callable[[], Dict], after_reset: Callable[[], object] = lambda: None):
    """Instance attributes wrapping ``targets()`` (``(owner, name)`` -> a function of the original), put on now and
    again after every ``env.reset`` (RoboCasa's kitchens build a new simulator at every reset), with ``after_reset``
    called then; taken off afterwards, an attribute that was there before (the harness's watch on the sim) put back."""
    installed: List[tuple] = []

    def attach():
        for (owner, name), wrap in targets().items():
            if owner is None:  # a kitchen before its first reset has no simulator yet
                continue
            installed.append((owner, name, vars(owner).get(name)))
            setattr(owner, name, wrap(getattr(owner, name)))

    def detach():
        while installed:
            owner, name, before = installed.pop()
            if before is None:
                delattr(owner, name)
            else:
                setattr(owner, name, before)

    reset = env.reset

    def reset_and_attach(*args, **kwargs):
        detach()
        out = reset(*args, **kwargs)
        attach()
        after_reset()
        return out

    env.reset = reset_and_attach
    attach()
    try:
        yield
    finally:
        detach()
        del env.reset


def summary(values: Sequence[float], digits: int = 3) -> Dict[str, float]:
    """Median, min, max and count of ``values``, rounded."""
    return {"median": round(float(np.median(values)), digits), "min": round(float(np.min(values)), digits),
            "max": round(float(np.max(values)), digits), "n": len(values)}


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class InProcess:
    """The single-process measurements, all on one live environment of the embedded backend."""

    def __init__(self, env, steps: int, backend: str = "robosuite"):
        self.protocol = specs.load_protocol()
        self.backend = backend
        self.stage_spec = specs.load_stage_spec(backend, env.task.name)
        self.env = env
        self.steps = steps
        rng = np.random.default_rng(0)
        self.actions = np.clip(rng.normal(0.0, 0.5, (steps, self.env.action_dim)), -1, 1)
        self.actions[:, 6:] = 0.0  # the arm only (PandaOmron's base and torso stay put, the gripper open)
        self.cameras = list(self.env.third_person_cameras) + list(self.env.wrist_cameras)

    def key(self, condition: str = "clean") -> RolloutKey:
        """The bench's rollout key: formal base episode 0 of the task under ``condition``."""
        return RolloutKey("formal", self.env.task.name, 0, condition, 0)

    def physics_sps(self) -> float:
        """Bare robosuite control steps per second (``env.step``, as the backend built it), no rendering."""
        self.env.reset(1, BENCH_EPISODE)
        raw, actions = self.env.raw, [self.env.raw_action(a) for a in self.actions]
        return self.steps / _timed(lambda: [raw.step(a) for a in actions])

    def render_ms(self, culled: bool = True, frames: int = 10) -> Dict[str, float]:
        """Milliseconds per 128x128 frame of each camera (after the same steps of the rollout's actions), with
        out-of-view geoms culled (the fast profile's way) or the full scene; ``empty``: a scene without geoms
        (clearing, the draw setup and the read-back: what a frame costs besides its triangles)."""
        self.env.reset(1, BENCH_EPISODE)
        for action in self.actions[:40]:
            self.env.step(action)
        out = {}
        with culling(culled):
            for cam in self.cameras:
                out[cam] = 1000 * _timed(lambda: [self.env.render(cam, 128) for _ in range(frames)]) / frames
        if culled:
            ctx, mj = self.env._render_context(), self.env._mujoco
            rect, rgb = mj.MjrRect(0, 0, 128, 128), np.empty((128, 128, 3), dtype=np.uint8)
            ctx.render(width=128, height=128, camera_id=self.env._cam_ids[self.cameras[0]])
            ctx.scn.ngeom = 0

            def empty():
                mj.mjr_render(rect, ctx.scn, ctx.con)
                mj.mjr_readPixels(rgb, None, rect, ctx.con)

            out["empty"] = 1000 * _timed(lambda: [empty() for _ in range(frames)]) / frames
        return out

    def reset_ms(self, resets: int = 5) -> float:
        """Milliseconds per between-rollout reset (restore nominal, seeded reset, fingerprint)."""
        key = self.key()
        return 1000 * _timed(lambda: [prepare_episode(self.env, self.protocol, key) for _ in range(resets)]) / resets

    def harness(self, chunk: int, condition: str = "clean", cameras: bool = True) -> tuple:
        """(seconds per control step, steps, final qpos) of a full harness rollout of the fixed actions."""
        policy = FixedActions(self.actions, chunk, cameras)
        t0 = time.perf_counter()
        record = run_rollout(self.env, policy, self.key(condition), self.protocol, self.stage_spec, self.backend,
                             horizon=self.steps)
        if not record.valid:
            raise RuntimeError(f"benchmark rollout failed: {record.error}")
        # the reset between rollouts is reset_ms's (a kitchen's takes seconds): per step, the steps only
        per_step = (time.perf_counter() - t0 - record.timing["reset_s"]) / record.steps
        return per_step, record.steps, self.env.data.qpos.copy()

    def bare(self, chunk: int, steps: int) -> tuple:
        """(seconds per control step, final qpos) of a plain loop from the harness rollout's seed: seeded reset,
        then ``env.step``, rendering the same cameras every ``chunk`` steps as the backend renders them."""
        env = self.env
        seed = seeding.env_seed(self.protocol.study_seed, self.env.task.name, "formal", 0)
        env.reset(seed, BENCH_EPISODE)  # the backend's own reset with its generators seeded (reset_ms's, untimed)
        t0 = time.perf_counter()
        for i in range(steps):
            if i % chunk == 0:
                for cam in self.cameras:
                    env.render(cam, 128)
            env.raw.step(env.raw_action(self.actions[i]))
        return (time.perf_counter() - t0) / steps, env.data.qpos.copy()

    def limits(self, chunk: int, condition: str = "clean") -> tuple:
        """What the harness rollout of ``chunk`` (both cameras) costs the simulator itself, untimed here:
        (the state each control step started from, the ``ctrl`` of every physics substep, the physics state of every
        rendered frame with its camera, final qpos, qpos just after the last integration)."""
        env, raw = self.env, self.env.raw
        controls: List[np.ndarray] = []
        frames: List[tuple] = []
        starts: List[np.ndarray] = []  # the state each control step starts from (RoboCasa's fixtures write qpos)
        integrated: List[np.ndarray] = []  # qpos just after the last integration (before the fixtures' last writes)

        def record(integrate):
            def recorded():
                if len(controls) % env._substeps == 0:  # robosuite's count of substeps per control step
                    starts.append(env._integration())
                controls.append(raw.sim.data.ctrl.copy())
                return integrate()
            return recorded

        def after(physics):
            def kept(*args):
                out = physics(*args)
                integrated[:] = [raw.sim.data.qpos.copy()]
                return out
            return kept

        def targets():
            # robosuite integrates with sim.step, or with step1 / ctrl / step2 under lite_physics (1.5's default);
            # LIBERO's fast path calls mj_step2 itself, after its hook
            fused = getattr(raw.step, "__self__", None)
            if isinstance(fused, libero_fastpath.ElidedForwardStep):
                return {(fused, "before_integration"): record, (fused, "_physics"): after}
            integrate = (raw.sim, "step2" if getattr(raw, "lite_physics", False) else "step")
            return {integrate: lambda fn: after(record(fn))}

        render = env.render
        env.render = lambda cam, size: (frames.append((env._integration(), cam, size)), render(cam, size))[1]
        try:  # LIBERO's and RoboCasa's resets step to settle: only the rollout's own substeps count
            with attached(env, targets, after_reset=lambda: (controls.clear(), frames.clear(), starts.clear())):
                _, _, qpos = self.harness(chunk, condition)
        finally:
            del env.render
        return starts, np.array(controls), frames, qpos, integrated[0]

    def bare_physics(self, starts: Sequence[np.ndarray], controls: np.ndarray) -> tuple:
        """(seconds for ``mj_step`` over ``controls``, final qpos): the simulation's own cost. Each control step
        starts from the state the rollout's did (``starts``: robosuite's and LIBERO's are where the last step ended;
        RoboCasa's kitchens move fixture joints between steps), restored untimed."""
        mj, model, data = self.env._mujoco, self.env.model, self.env.data
        substeps = len(controls) // len(starts)
        spent = 0.0
        for k, start in enumerate(starts):
            mj.mj_setState(model, data, start, mj.mjtState.mjSTATE_INTEGRATION)
            t0 = time.perf_counter()
            for ctrl in controls[k * substeps:(k + 1) * substeps]:
                data.ctrl[:] = ctrl
                mj.mj_step(model, data)
            spent += time.perf_counter() - t0
        return spent, data.qpos.copy()

    def bare_renders(self, frames: Sequence[tuple]) -> float:
        """Seconds for MuJoCo's own render of ``frames`` (state, camera, size): ``mjv_updateScene``, ``mjr_render``
        of the full scene, ``mjr_readPixels``; restoring each state is not timed."""
        env, mj = self.env, self.env._mujoco
        ctx = env._render_context()
        spent = 0.0
        for integration, cam, size in frames:
            env.set_physics_state(integration)
            t0 = time.perf_counter()
            ctx.render(width=size, height=size, camera_id=env._cam_ids[cam])
            ctx.read_pixels(size, size)
            spent += time.perf_counter() - t0
        return spent

    def profile(self, chunk: int) -> Dict[str, float]:
        """Seconds per control step of each part of one harness rollout: physics, controller, observables,
        render, policy and the rest (bookkeeping), from wrappers around robosuite's own calls (or the fast path's)."""
        from robosuite.utils.observables import Observable

        raw = self.env.raw
        spent = {"physics": 0.0, "controller": 0.0, "observables": 0.0}
        inside = set()  # parts being timed now: a nested call of the same part is not counted twice
        # instance attributes, gone again afterwards; robosuite builds new controllers on every reset, so the
        # composite controller's and the observables' methods are wrapped on their classes
        fused = getattr(raw.step, "__self__", None)

        def targets():  # on the current simulator: RoboCasa's kitchens build a new one at every reset
            wrapped = {(raw.sim, name): "physics" for name in ("step", "forward", "step1", "step2")
                       if hasattr(raw.sim, name)}
            wrapped.update({(raw, "_pre_action"): "controller", (raw, "_get_observations"): "observables"})
            if isinstance(fused, robosuite_fastpath.FusedStep):
                wrapped.update({(fused, "_control"): "controller", (fused, "_compiled_control"): "controller",
                                (fused, "_push_history"): "controller"})
            if isinstance(fused, libero_fastpath.ElidedForwardStep):  # it calls MuJoCo itself
                wrapped.update({(fused, "_physics"): "physics"})
            return {key: (lambda fn, part=part: timing(fn, part)) for key, part in wrapped.items()}

        on_classes = {(Observable, "update"): "observables", (robosuite_fastpath.SharedClock, "update"): "observables",
                      (robosuite_fastpath.SharedClock, "write_back"): "observables",
                      (libero_fastpath.FlatArm, "control"): "controller",
                      (libero_fastpath.FlatArm, "policy_control"): "controller"}
        composite = getattr(raw.robots[0], "composite_controller", None)  # robosuite 1.5 (1.4 sets goals in control)
        if composite is not None:
            on_classes[(type(composite), "set_goal")] = "controller"

        def timing(fn, part):
            def timed(*args, **kwargs):
                if part in inside:
                    return fn(*args, **kwargs)
                inside.add(part)
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[part] += time.perf_counter() - t0
                    inside.discard(part)
            return timed

        saved = {(cls, name): vars(cls)[name] for cls, name in on_classes}
        for (cls, name), part in on_classes.items():
            setattr(cls, name, timing(saved[cls, name], part))
        try:  # what the reset spent (RoboCasa's and LIBERO's settle by stepping) is not the rollout's
            with attached(self.env, targets, after_reset=lambda: spent.update(dict.fromkeys(spent, 0.0))):
                policy = FixedActions(self.actions, chunk)
                t0 = time.perf_counter()
                record = run_rollout(self.env, policy, self.key(), self.protocol, self.stage_spec, self.backend,
                                     horizon=self.steps)
                total = time.perf_counter() - t0 - record.timing["reset_s"]
        finally:
            for (cls, name), method in saved.items():
                setattr(cls, name, method)
        spent["render"] = record.timing["render_s"]
        spent["policy"] = record.timing["policy_s"]
        spent["bookkeeping"] = total - sum(spent.values())
        return {part: seconds / record.steps for part, seconds in spent.items()}

    def stock(self, chunk: int, cameras: bool = True) -> tuple:
        """(seconds per control step, final qpos) of the same harness rollout on stock robosuite and MuJoCo: the fast
        path off, every render of the full scene, numpy's BLAS pool at its default size (one thread per core), as a
        process that never set it has it."""
        from threadpoolctl import threadpool_limits

        self.env.set_stock_simulator(True)
        try:
            with threadpool_limits(os.cpu_count() or 1, user_api="blas"):
                per_step, _, qpos = self.harness(chunk, cameras=cameras)
        finally:
            self.env.set_stock_simulator(False)
        return per_step, qpos

    def close(self) -> None:
        """Close the environment."""
        self.env.close()


class BatchBench:
    """The reference policy for the 13 conditions of one base episode: one batched call vs 13 calls."""

    def __init__(self, env, conditions: Sequence[str]):
        env.reset(1)
        images = {c: env.render(c, 128) for c in list(env.third_person_cameras) + list(env.wrist_cameras)}
        roles = {c: ("wrist" if c in env.wrist_cameras else "third_person") for c in images}
        self.obs = [Observation(images, roles, env.proprio(), env.task.instruction, 0, task=env.task.name) for _ in conditions]
        self.policies = [ReferencePolicy() for _ in conditions]
        self.extra_envs = [get_backend("robosuite").make(env.task.name) for _ in conditions[1:]]
        for extra in self.extra_envs:  # create their render contexts outside the timings
            extra.reset(1)
            extra.render(extra.third_person_cameras[0], 128)

    def lockstep(self, local: "InProcess", keys, horizon: int) -> tuple:
        """(seconds for ``keys`` one after another, seconds for the same keys in lockstep), same horizon."""
        envs = [local.env] + self.extra_envs[: len(keys) - 1]
        t_single = _timed(lambda: [run_rollout(local.env, self.policies[0], k, local.protocol, local.stage_spec,
                                               "robosuite", horizon=horizon) for k in keys])
        t_lock = _timed(lambda: run_lockstep(envs, self.policies[: len(keys)], keys, local.protocol, local.stage_spec,
                                             "robosuite", horizon=horizon))
        return t_single, t_lock

    def one_by_one(self, calls: int = 10) -> float:
        """Seconds for ``calls`` rounds of one policy call per condition."""
        for i, p in enumerate(self.policies):
            p.reset(i)
        return _timed(lambda: [[p.act(o) for p, o in zip(self.policies, self.obs)] for _ in range(calls)])

    def batched(self, calls: int = 10) -> float:
        """Seconds for ``calls`` rounds of one batched call for all conditions."""
        for i, p in enumerate(self.policies):
            p.reset(i)
        return _timed(lambda: [act_batch(self.policies, self.obs) for _ in range(calls)])


class Pool:
    """A pool of real formal-run workers (the local executor's), started once and timed warm."""

    def __init__(self, workers: int, threads: int, policy: str):
        self.label = f"{workers}x{threads}"
        self.workers = workers
        self.pool = mp.get_context("spawn").Pool(
            workers, initializer=init_worker, initargs=(StudyConfig(backend="robosuite", policy=policy), threads))

    def run(self, keys) -> tuple:
        """(rollouts per second, results) for ``keys``, after the pool is warm."""
        t0 = time.perf_counter()
        results = [r for group in self.pool.imap_unordered(run_in_worker, [[k] for k in keys], chunksize=1) for r in group]
        return len(keys) / (time.perf_counter() - t0), results

    def close(self) -> None:
        """Stop the pool's processes."""
        self.pool.terminate()
        self.pool.join()


_FIXED: "InProcess | None" = None  # a fixed-action pool worker's environment


def _init_fixed_worker(backend: str, asset_kit, task: str, steps: int, threads: int) -> None:
    global _FIXED
    apply_threads(threads)
    _FIXED = InProcess(get_backend(backend, asset_kit=asset_kit).make(task), steps, backend)


def _run_fixed(key: RolloutKey) -> Dict:
    """One harness rollout of the fixed actions (both cameras every 4 steps) in a pool worker: its record's timing
    and the worker's peak memory."""
    from robocasa_shift.study.worker import peak_rss_mb

    policy = FixedActions(_FIXED.actions, 4)
    record = run_rollout(_FIXED.env, policy, key, _FIXED.protocol, _FIXED.stage_spec, _FIXED.backend,
                         horizon=_FIXED.steps)
    if not record.valid:
        raise RuntimeError(f"benchmark rollout failed: {record.error}")
    return {"timing": record.timing, "rss_mb": peak_rss_mb()}


class FixedPool:
    """A pool of workers stepping the fixed-action rollouts of ``steps`` steps (a backend without the reference
    policy, whose formal rollouts would run to horizons of over a thousand steps)."""

    def __init__(self, workers: int, threads: int, backend: str, asset_kit, task: str, steps: int):
        self.label = f"{workers}x{threads}"
        self.workers = workers
        self.pool = mp.get_context("spawn").Pool(workers, initializer=_init_fixed_worker,
                                                 initargs=(backend, asset_kit, task, steps, threads))

    def run(self, keys) -> tuple:
        """(rollouts per second, results) for ``keys``, after the pool is warm."""
        t0 = time.perf_counter()
        results = list(self.pool.imap_unordered(_run_fixed, keys, chunksize=1))
        return len(keys) / (time.perf_counter() - t0), results

    close = Pool.close


def formal_keys(task: str, episodes: Sequence[int]) -> List[RolloutKey]:
    """The formal keys of ``episodes`` under the bench's mild conditions."""
    return [RolloutKey("formal", task, e, c, 0) for e in episodes for c in FORMAL_CONDITIONS]


def pool_keys(task: str, repeat: int, rollouts: int) -> List[RolloutKey]:
    """The pools' ``rollouts`` keys of one repeat: the conditions of as many base episodes as they need, other
    episodes each repeat and as few in all as that takes (LIBERO has 25 formal base episodes per task)."""
    per_repeat = -(-rollouts // len(FORMAL_CONDITIONS))
    return formal_keys(task, range(repeat * per_repeat, (repeat + 1) * per_repeat))[:rollouts]


def run_bench(repeats: int = 5, steps: int = 200, rollouts: int = 8, policy: str = DEFAULT_POLICY,
              task: str | None = None, progress: bool = True, backend: str = "robosuite",
              asset_kit: str | None = None) -> Dict:
    """Measure everything (``repeats`` interleaved repeats) on ``backend``; return the JSON-able result.

    The embedded backend's pools run formal rollouts of ``policy`` and its figures include the reference policy's
    batching; the others' pools run the fixed-action rollouts of ``steps`` steps, and have no batching figures."""
    task = task or BENCH_TASKS[backend]
    embedded = backend == "robosuite"
    apply_threads(1)  # the in-process figures are per core; the pools choose their own threads
    local = InProcess(get_backend(backend, asset_kit=asset_kit).make(task), steps, backend)
    conditions = ["clean"] + [f"{f}:L{level}" for f in ("illumination", "camera", "base", "blur") for level in (1, 2, 3)]
    batch = BatchBench(local.env, conditions) if embedded else None
    conditions_keys = [local.key(c) for c in conditions]
    shapes = ((1, 1), (2, 1), (1, 2))  # workers x threads; 2x1 is the default on 2 cores
    warm_keys = formal_keys(task, [100, 101]) if embedded else formal_keys(task, [0])[:2]
    pools = [Pool(w, t, policy) for w, t in shapes] if embedded else []
    for pool in pools:  # start workers, build environments, load networks
        pool.run(warm_keys)

    def warm_pools():
        """The pools, warm: the embedded backend's kept for the whole run; the others' started and warmed in each
        repeat and closed after it, one at a time (a kitchen worker holds about 1.5 GB)."""
        yield from pools
        for w, t in shapes if not embedded else ():
            pool = FixedPool(w, t, backend, asset_kit, task, steps)
            try:
                pool.run(warm_keys)
                yield pool
            finally:
                pool.close()

    m: Dict[str, List[float]] = {}
    add = lambda name, value: m.setdefault(name, []).append(float(value))  # noqa: E731
    parts: List[float] = []
    rss: Dict[str, List[float]] = {}
    bar = tqdm(total=repeats, desc=f"bench {backend}", unit="repeat", disable=not progress, dynamic_ncols=True)
    for r in range(repeats):
        add("physics_sps", local.physics_sps())
        for culled, label in ((True, "render_ms"), (False, "render_full_ms")):
            for part, ms in local.render_ms(culled).items():
                add(f"{label}_{part}", ms)
        add("reset_ms", local.reset_ms())
        per_step = {}
        for chunk in (1, 4, 8):
            per_step[chunk], n, _ = local.harness(chunk)
        blind, _, blind_qpos = local.harness(4, cameras=False)
        bare4, _ = local.bare(4, n)
        add("overhead_ratio", per_step[4] / bare4)
        stock4, stock_qpos = local.stock(4)
        stock_blind, _ = local.stock(4, cameras=False)
        starts, controls, frames, harness_qpos, integrated_qpos = local.limits(4)
        if not (np.array_equal(stock_qpos, harness_qpos) and np.array_equal(blind_qpos, harness_qpos)):
            raise RuntimeError("the fast path changed the rollout: it must not change a bit")
        add("fastpath_speedup", stock4 / per_step[4])
        add("fused_step_speedup", stock_blind / blind)
        physics_s, physics_qpos = local.bare_physics(starts, controls)
        if not np.array_equal(physics_qpos, integrated_qpos):  # the same trajectory, or the ratio means nothing
            raise RuntimeError("bare mj_step did not retrace the harness rollout: max |dqpos| "
                               f"{np.abs(physics_qpos - integrated_qpos).max():.3g}")
        renders_s = local.bare_renders(frames)
        add("physics_limit_ratio", blind / (physics_s / n))
        add("stock_physics_limit_ratio", stock_blind / (physics_s / n))
        add("render_limit_ratio", per_step[4] / ((physics_s + renders_s) / n))
        add("bare_mj_step_ms", 1000 * physics_s / n)
        for part, seconds in local.profile(4).items():
            add(f"profile_ms_{part}", 1000 * seconds)
        add("cadence_speedup_4", per_step[1] / per_step[4])
        add("cadence_speedup_8", per_step[1] / per_step[8])
        if embedded:
            add("batch_speedup", batch.one_by_one() / batch.batched())
            single, lock = batch.lockstep(local, conditions_keys, horizon=40)
            add("lockstep_speedup_13", single / lock)
        keys = pool_keys(task, r, rollouts)
        for pool in warm_pools():
            rate, results = pool.run(keys)
            add(f"throughput_{pool.label}", rate)
            for res in results:
                rss.setdefault(pool.label, []).append(res["rss_mb"])
            if pool.label == "1x1":
                timings = [as_record(res).timing for res in results] if embedded else [res["timing"] for res in results]
                busy = sum(t["physics_s"] + t["render_s"] + t["policy_s"] for t in timings)
                parts.append((1.0 / rate) / (busy / len(timings)))  # wall per rollout / its parts
        add("scaling_2_workers", m["throughput_2x1"][-1] / m["throughput_1x1"][-1])
        for name, value in (served_batching() if embedded else {}).items():  # the GR00T launcher: main venv
            add(name, value)
        for image_format in ("png", "raw") if embedded else ():  # robosuite's PandaOmron: the robocasa365 preset
            for name, value in vla_eval_parts(local, image_format).items():
                add(name, value)
        bar.update(1)
    bar.close()
    for pool in pools:
        pool.close()
    for env in batch.extra_envs if batch else ():
        env.close()
    fastpath = local.env.fastpath
    local.close()
    figures = {name: summary(values) for name, values in m.items()}
    figures["wall_vs_parts"] = summary(parts)
    figures["rss_mb"] = {label: summary(v, 1) for label, v in rss.items()}
    return {
        "backend": backend,
        "asset_kit": asset_kit,
        "task": task,
        "policy": policy if embedded else FixedActions.name,
        "fastpath": fastpath,
        "repeats": repeats,
        "steps_per_rollout": steps,
        "rollouts_per_repeat": rollouts,
        "conditions": list(FORMAL_CONDITIONS),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "in_process_threads": 1,
        "figures": figures,
        "goals": {"overhead_ratio": "<= 1.05", "physics_limit_ratio": "<= 3" if embedded else "<= 1.5",
                  "scaling_2_workers": ">= 1.8", "wall_vs_parts": "<= 1.2",
                  **({"served_batching_speedup": ">= 2.5"} if embedded else {})},
    }


def served_batching(workers: int = 4, requests: int = 25, c0_s: float = 0.040, c1_s: float = 0.005,
                    max_wait_ms: float = 10.0) -> Dict[str, float]:
    """``workers`` clients against one GR00T launcher serving a stand-in that costs ``c0 + c1 x batch``: get_action
    throughput (requests per second) unbatched and with ``--max-batch workers``, side by side, and whether every
    session's actions were bit-identical both ways.

    Raises:
        RuntimeError: a session's actions differ between the two launchers (batching must not change them).
    """
    from robocasa_shift.policies.gr00t.client import Gr00tClient
    from robocasa_shift.policies.gr00t.server import Gr00tLauncher
    from robocasa_shift.policies.gr00t.standin import ACTION_KEY, STATE_KEY, CostModel

    def run(max_batch: int):
        launcher = Gr00tLauncher(CostModel(c0_s, c1_s), "127.0.0.1", 0, max_batch=max_batch,
                                 max_wait_ms=max_wait_ms if max_batch > 1 else 0.0)
        launcher.start()
        actions: Dict[int, List[np.ndarray]] = {w: [] for w in range(workers)}

        def worker(w: int) -> None:
            client = Gr00tClient("127.0.0.1", launcher.port, timeout_s=30.0, retries=0)
            try:
                client.reset(1000 + w)
                for step in range(requests):
                    reply = client.get_action({STATE_KEY: np.array([[w, step, 0.0]])})
                    actions[w].append(np.asarray(reply[ACTION_KEY]))
            finally:
                client.close()

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall_s = time.perf_counter() - start
        sizes = list(launcher.model.batch_sizes)
        launcher.stop()
        return workers * requests / wall_s, actions, sizes

    unbatched, plain, _ = run(1)
    batched, gathered, sizes = run(workers)
    if any(not all(np.array_equal(a, b) for a, b in zip(plain[w], gathered[w])) for w in range(workers)):
        raise RuntimeError("a session's actions changed when its requests were batched with others'")
    return {"served_throughput_unbatched": unbatched, "served_throughput_batched": batched,
            "served_batching_speedup": batched / unbatched, "served_mean_batch": float(np.mean(sizes))}


def merged(out: Path | str, result: Dict) -> Dict:
    """The bench file at ``out`` with ``result`` in place of its backend's entry: every backend's figures side by
    side in one file (``{"backends": {name: result}}``), each from its own run. A result file of one backend from
    before (figures at the top) is kept under its backend; anything else there is refused, naming the file."""
    from robocasa_shift.errors import BadInput
    from robocasa_shift.rundir.files import read_json

    document: Dict = {"backends": {}}
    if Path(out).exists():
        try:
            before = read_json(out, what="bench result")
        except Exception as exc:
            raise BadInput(f"{out}: not a bench result ({exc}); move it away or choose another --out") from None
        if isinstance(before, dict) and isinstance(before.get("backends"), dict):
            document = before
        elif isinstance(before, dict) and isinstance(before.get("figures"), dict):
            document["backends"][str(before.get("backend", "robosuite"))] = before
        else:
            raise BadInput(f"{out}: not a bench result (no 'backends' or 'figures'); move it away or choose "
                           f"another --out")
    document["backends"][result["backend"]] = result
    return document


class VlaEvalStandin:
    """A loopback server of vla-eval's protocol whose model answers at once with a zero action: what is left of
    a step's time is the client's (encoding the images, decoding the reply) and the simulator's. ``busy_s``:
    the time the server spent on the messages it answered."""

    def __init__(self, action_dim: int = 12):
        from websockets.sync.server import serve

        self.action_dim, self.busy_s = action_dim, 0.0
        self.server = serve(self._handle, "127.0.0.1", 0, max_size=64 * 2**20, compression=None)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handle(self, ws) -> None:
        import msgpack

        from robocasa_shift.policies.vla_eval.wire import pack_message

        for data in ws:
            start = time.perf_counter()
            message = msgpack.unpackb(data)  # the client's own messages (PNG images in them), read as vla-eval does
            kind, seq = message["type"], message["seq"]
            if kind == "hello":
                reply = pack_message("hello", {"protocol_version": 1, "model_server": "bench-standin",
                                               "capabilities": {}}, seq)
            elif kind == "observation":
                reply = pack_message("action", {"actions": np.zeros(self.action_dim)}, seq)
            else:
                reply = None
            self.busy_s += time.perf_counter() - start
            if reply is not None:
                ws.send(reply)

    def close(self) -> None:
        self.server.shutdown()


def vla_eval_parts(local: "InProcess", image_format: str = "png",
                   image_size: Optional[int] = None) -> Dict[str, float]:
    """One rollout of the ``vla-eval`` client (preset ``robocasa365``: three 256 px cameras, PNG, every step) against
    ``VlaEvalStandin``: wall time per step over its parts (the simulator's physics and renders, the server's
    time), and the client's share of the wall time (the policy's time less the server's); ``image_format="raw"``
    sends the images as arrays (vla-eval's option), the figures' names then end in ``_raw``."""
    from robocasa_shift.policies.vla_eval.client import VlaEvalPolicy

    server = VlaEvalStandin()
    policy = VlaEvalPolicy(host="127.0.0.1", port=server.port, preset="robocasa365", image_size=image_size,
                           image_format=image_format)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the stand-in takes no seed
            record = run_rollout(local.env, policy, local.key(), local.protocol, local.stage_spec, "robosuite",
                                 horizon=local.steps)
    finally:
        policy.close()
        server.close()
    if not record.valid:
        raise RuntimeError(f"the vla-eval rollout failed: {record.error}")
    timing = record.timing
    parts = timing["physics_s"] + timing["render_s"] + server.busy_s
    suffix = "" if image_format == "png" else f"_{image_format}"
    return {f"vla_eval_wall_vs_parts{suffix}": record.wall_s / parts,
            f"vla_eval_client_share{suffix}": (timing["policy_s"] - server.busy_s) / record.wall_s}


def table(result: Dict) -> str:
    """The figures of a bench result as a fixed-width text table."""
    lines = [f"{'figure':<26}{'median':>10}{'min':>10}{'max':>10}"]
    for name, s in result["figures"].items():
        items = s.items() if "median" not in s else [("", s)]
        for label, v in items:
            lines.append(f"{(name + (' ' + label if label else '')):<26}{v['median']:>10}{v['min']:>10}{v['max']:>10}")
    return "\n".join(lines)

