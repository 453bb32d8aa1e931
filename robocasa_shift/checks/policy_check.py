"""``check-policy NAME``: the policy checklist (docs/extending.md, "Add a policy") run as a command, as
``check-backend`` runs the backend contract.

The policy is built from its registry with the options given, then run for a few chunk boundaries on a real
environment of a backend whose embodiment it speaks (the observations it receives are the harness's own:
its cameras at its size, proprioception, the instruction). It checks:

- ``contract``: the class attributes (``camera_roles`` among the harness's roles, a positive ``image_size``) and
  methods exist, ``identity()`` is a dict naming the policy, ``rng_fingerprint()`` a string.
- ``options``: an option the constructor does not take is refused before anything runs (``PolicyOptionError``).
- ``chunks``: every ``act`` returns a finite ``(k, action_dim)`` chunk in the environment's action layout.
- ``seeded_determinism``: one seed gives one fingerprint and one action sequence (two instances, one rollout
  each); a stochastic policy (``deterministic = False``) gives another fingerprint and other actions for another
  seed, a deterministic one the same.
- ``state_roundtrip``: a branchable policy's ``get_state()`` holds plain numeric arrays that survive an ``.npz``
  round trip without pickle, and ``set_state`` continues bit for bit (actions and fingerprint); a policy that
  cannot be branched is reported "not offered" with its reason.
- ``samples``: ``sample_actions`` (where offered) returns ``(n, action_dim)`` and leaves the policy's state, and so
  its next actions, untouched.
- ``batch``: ``act_batch`` gives each instance what ``act`` gives it alone.

The result is a :class:`~robocasa_shift.checks.results.CheckResult`; the command prints it and exits 1 on a failure.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from robocasa_shift import seeding
from robocasa_shift.arrays import npz_bytes, read_npz
from robocasa_shift.backends import get_backend
from robocasa_shift.checks.results import CheckResult, Findings
from robocasa_shift.core import specs
from robocasa_shift.core.backend import CAMERA_ROLES
from robocasa_shift.core.policy import Observation, state_support
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import Rollout
from robocasa_shift.errors import PolicyOptionError
from robocasa_shift.policies import make_policy

CHECKS = ("contract", "options", "chunks", "seeded_determinism", "state_roundtrip", "samples", "batch")
POLICY_METHODS = ("reset", "act", "rng_fingerprint", "identity", "close", "get_state", "set_state",
                  "sample_actions")
PHASE = "validation"
UNKNOWN_OPTION = "no_such_option_of_any_policy"


def _trace(env, policy, key: RolloutKey, protocol, stage_spec, backend: str,
           boundaries: int) -> Tuple[List[Observation], List[np.ndarray], str, Optional[str]]:
    """Run ``policy`` on ``key`` for ``boundaries`` chunk boundaries: the observations it received, its chunks, its
    fingerprint after the reset, and the rollout's error (None)."""
    rollout = Rollout(env, policy, key, protocol, stage_spec, backend)
    rollout.begin()
    fingerprint = rollout.record.policy_rng_fingerprint
    observations, chunks = [], []
    while not rollout.done and len(chunks) < boundaries:
        if rollout.wants_observation():
            obs = rollout.observe()
            if obs is None:
                break
            chunk = np.array(policy.act(obs), dtype=np.float64)
            observations.append(obs)
            chunks.append(chunk)
            rollout.load(chunk, 0.0)
        rollout.step()
    return observations, chunks, fingerprint, rollout.record.error


def _same(a: List[np.ndarray], b: List[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _check_contract(policy, found: Findings) -> None:
    for method in POLICY_METHODS:
        if not callable(getattr(policy, method, None)):
            found.add("contract", f"the policy lacks {method}()")
    roles = list(getattr(policy, "camera_roles", ()))
    if any(role not in CAMERA_ROLES for role in roles):
        found.add("contract", f"camera_roles {roles} are not among {list(CAMERA_ROLES)}")
    size = getattr(policy, "image_size", None)
    if not isinstance(size, int) or size < 1:
        found.add("contract", f"image_size {size!r} is not a positive int")
    identity = found.guard("contract", "identity()", policy.identity)
    if identity is not None and (not isinstance(identity, Mapping) or "name" not in identity):
        found.add("contract", f"identity() returned {type(identity).__name__} without a 'name'")
    fingerprint = found.guard("contract", "rng_fingerprint()", policy.rng_fingerprint)
    if fingerprint is not None and not isinstance(fingerprint, str):
        found.add("contract", f"rng_fingerprint() returned {type(fingerprint).__name__}, not a str")


def _check_chunks(chunks: List[np.ndarray], action_dim: int, found: Findings) -> None:
    for i, chunk in enumerate(chunks):
        if chunk.ndim != 2 or chunk.shape[0] < 1 or chunk.shape[1] != action_dim:
            found.add("chunks", f"boundary {i}: a chunk of shape {chunk.shape}, expected (k, {action_dim})")
        elif not np.isfinite(chunk).all():
            found.add("chunks", f"boundary {i}: a chunk with non-finite actions")


def _check_state(name: str, options: Dict[str, Any], seed: int, observations: List[Observation],
                 found: Findings) -> str:
    """get_state after the first chunk, set_state into a fresh instance: the rest must follow bit for bit."""
    source = make_policy(name, **options)
    why = state_support(source)
    if why is not None:
        source.close()
        found.notes["state_roundtrip"] = f"not offered: {why}"
        return "not offered"
    copy = make_policy(name, **options)
    try:
        source.reset(seed)
        source.act(observations[0])
        state = found.guard("state_roundtrip", "get_state()", source.get_state)
        if state is None:
            return "offered"
        bad = [k for k, v in state.items() if not isinstance(v, np.ndarray) or v.dtype.kind not in "biuf"]
        if bad:
            found.add("state_roundtrip", f"get_state() entries {bad[:5]} are not numeric numpy arrays")
            return "offered"
        restored = found.guard("state_roundtrip", "an .npz round trip of the state",
                               lambda: read_npz(npz_bytes(state)))
        if restored is None:
            return "offered"
        copy.reset(seed)
        found.guard("state_roundtrip", "set_state()", lambda: copy.set_state(restored))
        if found.problems["state_roundtrip"]:
            return "offered"
        if copy.rng_fingerprint() != source.rng_fingerprint():
            found.add("state_roundtrip", "after set_state the fingerprint differs from the saved instance's")
        ahead = [np.array(source.act(o)) for o in observations[1:]]
        again = [np.array(copy.act(o)) for o in observations[1:]]
        if not _same(ahead, again):
            found.add("state_roundtrip", "after set_state the actions differ from the saved instance's")
        return "offered"
    finally:
        source.close()
        copy.close()


def _check_samples(name: str, options: Dict[str, Any], seed: int, observations: List[Observation],
                   action_dim: int, found: Findings) -> str:
    """Sampling at a boundary leaves the state, and so every later action, as it was."""
    plain, sampled = make_policy(name, **options), make_policy(name, **options)
    try:
        plain.reset(seed)
        sampled.reset(seed)
        samples = found.guard("samples", "sample_actions()",
                              lambda: sampled.sample_actions(observations[0], 3, np.random.default_rng(0)))
        if samples is None:
            if not found.problems["samples"]:
                found.notes["samples"] = "not offered (sample_actions returns None)"
            return "not offered"
        samples = np.asarray(samples)
        if samples.shape != (3, action_dim) or not np.isfinite(samples).all():
            found.add("samples", f"sample_actions(obs, 3, rng) gave shape {samples.shape}, expected (3, {action_dim})")
        if sampled.rng_fingerprint() != plain.rng_fingerprint():
            found.add("samples", "sample_actions changed the policy's fingerprint")
        if not _same([np.array(plain.act(o)) for o in observations], [np.array(sampled.act(o)) for o in observations]):
            found.add("samples", "after sample_actions the policy acts differently")
        return "offered"
    finally:
        plain.close()
        sampled.close()


def _check_batch(name: str, options: Dict[str, Any], seeds: Tuple[int, int], observations: List[Observation],
                 found: Findings) -> None:
    alone = [make_policy(name, **options) for _ in seeds]
    batched = [make_policy(name, **options) for _ in seeds]
    try:
        for policy, other, seed in zip(alone, batched, seeds):
            policy.reset(seed)
            other.reset(seed)
        pair = [observations[0], observations[-1]]
        expected = [np.array(p.act(o)) for p, o in zip(alone, pair)]
        got = found.guard("batch", "act_batch()", lambda: type(batched[0]).act_batch(batched, pair))
        if got is not None and not _same(expected, [np.array(g) for g in got]):
            found.add("batch", "act_batch gave other chunks than act gives each instance alone")
    finally:
        for policy in alone + batched:
            policy.close()


def check_policy(name: str, backend: str = "fake", task: Optional[str] = None,
                 options: Optional[Dict[str, Any]] = None, boundaries: int = 4,
                 asset_kit: Optional[str] = None) -> CheckResult:
    """Run the policy checklist on policy ``name`` (built with ``options``) on ``backend``'s ``task`` (default: its
    first) for ``boundaries`` chunk boundaries of a clean base episode.

    Raises:
        UnknownNameError: an unknown policy, backend or task (the message lists the valid ones).
        PolicyOptionError: an option the policy does not take.
        BackendUnavailable: the backend's simulator or assets are missing.
    """
    options = dict(options or {})
    found = Findings(CHECKS)
    policy = make_policy(name, **options)
    try:
        try:
            make_policy(name, **options, **{UNKNOWN_OPTION: 1}).close()
        except PolicyOptionError:
            pass  # refused before anything was built, as it must be
        except Exception as exc:  # accepted, then failed: a typo would fail the same late way
            found.add("options", f"an unknown option ({UNKNOWN_OPTION}) was taken, then failed: {exc}")
        else:
            found.add("options", f"an unknown option ({UNKNOWN_OPTION}) was not refused: the constructor must name "
                                 "its options (no **kwargs that swallow typos)")
        _check_contract(policy, found)
        b = get_backend(backend, asset_kit=asset_kit)
        b.check_available()
        task = task or b.task_names()[0]
        b.task(task)
        protocol, stage = specs.load_protocol(), specs.load_stage_spec(backend, task)
        env = b.make(task)
        try:
            key = RolloutKey(PHASE, task, 0, "clean")
            other_seed = RolloutKey(PHASE, task, 0, "clean", replicate=1)  # same scene, another policy seed
            observations, chunks, fingerprint, error = _trace(env, policy, key, protocol, stage, backend, boundaries)
            if error or not chunks:
                found.add("chunks", f"the rollout failed: {(error or 'no chunk')[:400]}")
                return _result(name, backend, task, options, found, {})
            _check_chunks(chunks, env.action_dim, found)
            twin = make_policy(name, **options)
            try:
                _, again, fingerprint_again, _ = _trace(env, twin, key, protocol, stage, backend, boundaries)
                _, other, fingerprint_other, _ = _trace(env, twin, other_seed, protocol, stage, backend, boundaries)
            finally:
                twin.close()
            if fingerprint_again != fingerprint or not _same(chunks, again):
                found.add("seeded_determinism", "one seed, two instances: other fingerprints or actions")
            differs = fingerprint_other != fingerprint or not _same(chunks, other)
            if policy.deterministic and differs:
                found.add("seeded_determinism", "declared deterministic, yet another seed gives other actions")
            if not policy.deterministic and fingerprint_other == fingerprint:
                found.add("seeded_determinism", "another seed gives the same fingerprint: reset(seed) does not seed "
                                                "the generators (or rng_fingerprint does not read them back)")
            seed = seeding.policy_seed(protocol.study_seed, key.task, key.phase, key.episode, key.replicate)
            offered = {"state": _check_state(name, options, seed, observations, found),
                       "samples": _check_samples(name, options, seed, observations, env.action_dim, found)}
            _check_batch(name, options, (seed, seed + 1), observations, found)
        finally:
            env.close()
        return _result(name, backend, task, options, found, offered)
    finally:
        policy.close()


def _result(name: str, backend: str, task: str, options: Dict[str, Any], found: Findings,
            offered: Dict[str, str]) -> CheckResult:
    checks = found.checks()
    passed = all(c["passed"] for c in checks.values())
    details = {"policy": name, "backend": backend, "task": task, "options": sorted(options), "offered": offered,
               "notes": found.notes, "checks": checks}
    return CheckResult("check-policy", passed, details, _markdown(details, found, passed))


def _markdown(details: Dict[str, Any], found: Findings, passed: bool) -> str:
    lines = [f"# Policy checklist: {details['policy']}", "", f"On backend {details['backend']}, task {details['task']}.", "",
             *found.table(), "", f"**{'PASSED' if passed else 'FAILED'}**", ""]
    return "\n".join(lines)


__all__ = ["CHECKS", "check_policy"]
