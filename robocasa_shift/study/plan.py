"""The study plan: which rollout keys a command runs, in what order, in which shard.

Pure functions of their inputs (the run directory's ``plan.json`` belongs to
:class:`~robocasa_shift.rundir.store.RunStore`: ``store.add_to_plan(keys)``,
``store.planned_keys()``).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple

from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import BadInput, UnknownNameError
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.seeding import PHASES
from robocasa_shift.study.pairing import FINAL_ERROR_KINDS

# Most rollout keys one command plans without ``force``: a typo such as --episodes 0-999999999 would
# otherwise build billions of keys (and their plan.json) before anything could say so.
MAX_KEYS = 100_000


def parse_episodes(text: str, max_count: Optional[int] = MAX_KEYS) -> List[int]:
    """``'0-19'`` -> 0..19; ``'0,3,5-7'`` -> [0, 3, 5, 6, 7].

    Args:
        text: the ranges.
        max_count: refuse ranges naming more than this many numbers (None: no limit); checked
            before any list is built.

    Raises:
        BadInput: a malformed, empty or too large range.
    """
    out: List[int] = []
    count = 0
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise BadInput(f"episodes must look like '0-19' or '0,3,5-7', got {text!r}") from None
        if first < 0:
            raise BadInput(f"bad episode range {part!r} in {text!r}: numbers start at 0")
        if last < first:
            raise BadInput(f"bad episode range {part!r} in {text!r}: it ends before it starts "
                           f"(write the lower number first: '{last}-{first}')")
        count += last - first + 1
        if max_count is not None and count > max_count:
            raise BadInput(f"{text!r} names more than {max_count:,} numbers (episodes or replicates); "
                           f"pass --force if you mean it")
        out.extend(range(first, last + 1))
    if not out:
        raise BadInput(f"no episodes in {text!r}")
    return sorted(set(out))


def plan_keys(
    tasks: Sequence[str],
    episodes: Iterable[int],
    conditions: Sequence[str],
    phase: str = "formal",
    replicates: Sequence[int] = (0,),
    force: bool = False,
) -> List[RolloutKey]:
    """Keys in execution order: task, episode, replicate, then condition (clean first).

    Args:
        force: plan more than :data:`MAX_KEYS` keys.

    Raises:
        UnknownNameError: ``phase`` is not a seed stream of the protocol.
        BadInput: more than :data:`MAX_KEYS` keys without ``force`` (counted before any is built).
    """
    if phase not in PHASES:
        raise UnknownNameError("phase", phase, list(PHASES))
    episodes = list(episodes)
    count = len(tasks) * len(episodes) * len(replicates) * len(conditions)
    if count > MAX_KEYS and not force:
        raise BadInput(f"{count:,} rollouts planned ({len(tasks)} tasks x {len(episodes)} episodes x "
                       f"{len(replicates)} replicates x {len(conditions)} conditions), more than {MAX_KEYS:,}; "
                       f"pass --force if you mean it")
    return [
        RolloutKey(phase, task, ep, cond, rep)
        for task in tasks
        for ep in episodes
        for rep in replicates
        for cond in conditions
    ]


def parse_shard(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """``'2/8'`` -> (2, 8): the third of eight slices (0-based index i of n); empty -> None (no sharding)."""
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise BadInput(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise BadInput(f"--shard {text}: need 0 <= i < n")
    return i, n


def shard_keys(keys: Sequence[RolloutKey], shard: Optional[Tuple[int, int]]) -> List[RolloutKey]:
    """A disjoint, deterministic slice: base episodes (all their conditions together) dealt round-robin."""
    if shard is None:
        return list(keys)
    i, n = shard
    groups = sorted({(k.phase, k.task, k.episode, k.replicate) for k in keys})
    mine = {g for j, g in enumerate(groups) if j % n == i}
    return [k for k in keys if (k.phase, k.task, k.episode, k.replicate) in mine]


def pending_keys(store: RunStore, keys: Sequence[RolloutKey], retry_errors: bool = False) -> List[RolloutKey]:
    """Keys without a record in ``store``; with ``retry_errors`` also keys whose record is invalid.

    A record invalid for good (kind in ``pairing.FINAL_ERROR_KINDS``: a fingerprint mismatch that
    survived its retry) is never retried: it stays as the determinism failure it reports.
    """
    recorded = {RolloutKey.from_record(r): r for r in store.records()}

    def retry(rec: dict) -> bool:
        return rec.get("valid", True) is not True and rec.get("error_kind") not in FINAL_ERROR_KINDS

    return [k for k in keys if k not in recorded or (retry_errors and retry(recorded[k]))]


__all__ = ["MAX_KEYS", "parse_episodes", "parse_shard", "pending_keys", "plan_keys", "shard_keys"]
