"""Readers of other harnesses' per-episode results: LIBERO-Plus, ``lerobot-eval`` and vla-eval.

Each reader turns one source file into :class:`Episode` rows and says, per row, whether its pairing
with a clean twin (in the same file) or with the same episode of another run is provable from what
the source records. Nothing is guessed: what a source does not record (seed, initial state, stage
depth) is listed in :data:`UNKNOWN` and stated in the imported run's manifest.

Formats, as written by the versions named in :data:`FORMATS` (docs/import-results.md has a worked
example of each):

- ``liberoplus``: a per-episode table (CSV with a header, or JSON Lines) of a LIBERO-Plus evaluation,
  columns ``suite`` and ``name`` (the task's registry name) or ``id`` (its id in
  ``task_classification.json``), ``success``, optional ``episode`` (the trial index, which is LIBERO's
  init-state index; default 0), ``instruction`` and ``steps``; joined with LIBERO-Plus's
  ``task_classification.json`` (``{suite: [{id, name, category, difficulty_level}]}``).
- ``lerobot-eval``: ``eval_info.json`` (multi-task: ``per_task[].{task_group, task_id,
  metrics.successes[]}``; single-env: ``per_episode[].{episode_ix, success, seed}``).
- ``vla-eval``: the result JSON (``benchmark``, ``harness_version``, ``seed``,
  ``tasks[].{task, episodes[].{episode_id, metrics.success, steps, failure_reason}}``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from robocasa_shift.errors import ImportFormatError
from robocasa_shift.rundir.files import read_bytes

CLEAN = "clean"
MAX_SOURCE_BYTES = 256 * 2**20   # a result file or per-episode table
MAX_EPISODES = 1_000_000         # rows of one source
MAX_FIELD_CHARS = 4096           # one text field (a task name, an instruction)
MAX_COLUMNS = 256                # columns of a per-episode table

# What each reader was written against (the formats are read from these versions' code).
FORMATS = {
    "liberoplus": "LIBERO-Plus (sylvestf/LIBERO-plus, task_classification.json with difficulty_level, 2025-10)",
    "lerobot-eval": "lerobot 0.4.4 (lerobot/scripts/lerobot_eval.py: eval_info.json)",
    "vla-eval": "vla-eval 0.8.0 (vla_eval/results/collector.py: BenchmarkResult)",
}

# What the sources never record: every imported record says so.
UNKNOWN = ("initial simulator state (no fingerprint)", "policy RNG state", "stage depth (no StageTracker: "
           "n_stages 1, a success is the only stage)")

# LIBERO-Plus's seven perturbation dimensions, as this harness names them (a condition is 'factor:Lk').
LIBEROPLUS_FACTORS = {
    "Objects Layout": "objects_layout",
    "Camera Viewpoints": "camera_viewpoints",
    "Robot Initial States": "robot_initial_states",
    "Language Instructions": "language_instructions",
    "Light Conditions": "light_conditions",
    "Background Textures": "background_textures",
    "Sensor Noise": "sensor_noise",
}
# A variant's name is its task's name plus these suffixes (in this order, each optional).
_VARIANT_SUFFIX = re.compile(
    r"(?P<suffix>(_language_\d+)?(_view_-?\d+_-?\d+_-?\d+_-?\d+_-?\d+)?(_initstate_(?P<init>\d+))?"
    r"(_noise_\d+|_light_\d+|_table_\d+|_tb_\d+|_add_\d+|_level\d+_sample\d+)?)$")
# Dimensions whose variants keep the clean task's scene and initial states: a variant named
# '..._initstate_N' starts from the clean task's init state N, so it is provably the twin of the clean
# rollout of trial N.
_SAME_INITIAL_STATE = {"Camera Viewpoints", "Sensor Noise", "Language Instructions"}


@dataclass
class Episode:
    """One imported rollout outcome."""

    task: str                 # the base task (the cluster of every interval)
    condition: str            # 'clean' or 'factor:Lk'
    episode: int              # unique within (task, condition); the same number for the same rollout in
    success: bool             # another run of the same suite
    variant: str              # the source's own name of what was run
    line: int                 # where in the source (1-based line or entry number)
    twin_episode: Optional[int] = None   # the clean rollout of the same initial state, where provable
    unpaired_reason: Optional[str] = None  # why it has no provable clean twin
    steps: Optional[int] = None
    instruction: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Source:
    """What a reader found: the episodes and the facts about the whole file."""

    format: str
    episodes: List[Episode]
    suite: Dict[str, Any]          # what identifies the suite (same suite => comparable runs)
    cross_run_pairing: Optional[str]  # None when the same key in two runs is the same initial state, else why not
    policy: Optional[str] = None
    seed: Optional[int] = None


def _fail(path: Path, where: Any, name: str, problem: str) -> ImportFormatError:
    return ImportFormatError(f"{path}:{where}: field {name!r}: {problem}")


def _text(path: Path, where: Any, name: str, value: Any, required: bool = True) -> Optional[str]:
    if value is None or value == "":
        if required:
            raise _fail(path, where, name, "missing")
        return None
    if not isinstance(value, str):
        raise _fail(path, where, name, f"expected text, got {type(value).__name__}")
    if len(value) > MAX_FIELD_CHARS:
        raise _fail(path, where, name, f"longer than {MAX_FIELD_CHARS} characters")
    return value


def _integer(path: Path, where: Any, name: str, value: Any, default: Optional[int] = None) -> Optional[int]:
    if value is None or value == "":
        if default is None:
            raise _fail(path, where, name, "missing")
        return default
    if isinstance(value, bool):
        raise _fail(path, where, name, f"expected an integer, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise _fail(path, where, name, f"expected an integer, got {value!r}")
        value = int(value)
    if isinstance(value, str):
        if not re.fullmatch(r"-?\d{1,12}", value.strip()):
            raise _fail(path, where, name, f"expected an integer, got {value[:40]!r}")
        value = int(value)
    if not isinstance(value, int) or not -1 < value < 2**31:
        raise _fail(path, where, name, f"expected a non-negative integer below 2^31, got {str(value)[:40]!r}")
    return value


def _boolean(path: Path, where: Any, name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise _fail(path, where, name, f"expected true/false or 1/0, got {str(value)[:40]!r}")


def _json(path: Path, data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ImportFormatError(f"{path}: not valid JSON ({str(exc)[:200]})") from None


def _read(path: Path) -> bytes:
    try:
        return read_bytes(path, max_bytes=MAX_SOURCE_BYTES, what="result file")
    except OSError as exc:  # a FIFO, a device, too large, missing
        raise ImportFormatError(f"{path}: cannot be read as a result file ({exc})") from None


def _object(path: Path, where: Any, value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ImportFormatError(f"{path}:{where}: {what} must be a JSON object, got {type(value).__name__}")
    return value


def _list(path: Path, where: Any, name: str, value: Any) -> list:
    if not isinstance(value, list):
        raise _fail(path, where, name, f"expected a list, got {type(value).__name__}")
    if len(value) > MAX_EPISODES:
        raise _fail(path, where, name, f"more than {MAX_EPISODES} entries")
    return value


# --------------------------------------------------------------------------- LIBERO-Plus


def _table_rows(path: Path, data: bytes) -> Iterator[Tuple[int, Mapping[str, Any]]]:
    """(line, row) of a CSV with a header or of JSON Lines, capped in columns, rows and field size."""
    text = data.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                if n > MAX_EPISODES:
                    raise ImportFormatError(f"{path}: more than {MAX_EPISODES} rows")
                yield n, _object(path, n, _json(path, line.encode()), "a JSON Lines row")
        return
    csv.field_size_limit(MAX_FIELD_CHARS)
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if not header:
            raise ImportFormatError(f"{path}: empty table (a header line is expected)")
        if len(header) > MAX_COLUMNS:
            raise ImportFormatError(f"{path}:1: {len(header)} columns, more than {MAX_COLUMNS}")
        for n, values in enumerate(reader, start=2):
            if n > MAX_EPISODES + 1:
                raise ImportFormatError(f"{path}: more than {MAX_EPISODES} rows")
            if values:
                if len(values) != len(header):
                    raise ImportFormatError(f"{path}:{n}: {len(values)} fields, the header has {len(header)}")
                yield n, dict(zip(header, values))
    except csv.Error as exc:
        raise ImportFormatError(f"{path}:{reader.line_num}: not a CSV row ({exc})") from None


def _classification(path: Path) -> Dict[str, Dict[str, Any]]:
    """task_classification.json as {suite: {'by_id': {id: entry}, 'by_name': {name: entry}}}."""
    raw = _object(path, 0, _json(path, _read(path)), "task_classification.json")
    out: Dict[str, Dict[str, Any]] = {}
    for suite, entries in raw.items():
        by_id, by_name = {}, {}
        for i, entry in enumerate(_list(path, suite, suite, entries)):
            where = f"{suite}[{i}]"
            entry = _object(path, where, entry, "an entry")
            name = _text(path, where, "name", entry.get("name"))
            category = _text(path, where, "category", entry.get("category"))
            if category not in LIBEROPLUS_FACTORS:
                raise _fail(path, where, "category", f"unknown {category!r}; known: {sorted(LIBEROPLUS_FACTORS)}")
            level = entry.get("difficulty_level")
            level = None if level is None else _integer(path, where, "difficulty_level", level)
            item = {"id": _integer(path, where, "id", entry.get("id")), "name": name, "category": category,
                    "difficulty_level": level}
            by_id[item["id"]], by_name[name] = item, item
        out[suite] = {"by_id": by_id, "by_name": by_name}
    return out


def _base_task(name: str) -> Tuple[str, Optional[int]]:
    """A LIBERO-Plus variant name split into its task's name and the init-state index it names (or None)."""
    match = _VARIANT_SUFFIX.search(name)
    suffix = match["suffix"] if match else ""
    init = match["init"] if match else None
    return name[: len(name) - len(suffix)] if suffix else name, None if init is None else int(init)


def _variant_condition(entry: Mapping[str, Any]) -> str:
    factor = LIBEROPLUS_FACTORS[entry["category"]]
    if entry["difficulty_level"] is None:  # LIBERO-Plus leaves some light variants unrated
        return f"{factor}_unrated:L1"
    return f"{factor}:L{entry['difficulty_level']}"


def read_liberoplus(path: Path, classification: Path) -> Source:
    """A LIBERO-Plus per-episode table joined with its ``task_classification.json``."""
    classes = _classification(classification)
    episodes: List[Episode] = []
    for line, row in _table_rows(path, _read(path)):
        suite = _text(path, line, "suite", row.get("suite"))
        if suite not in classes and suite not in ("libero_90",):
            raise _fail(path, line, "suite", f"unknown {suite!r}; task_classification.json has {sorted(classes)}")
        known = classes.get(suite, {"by_id": {}, "by_name": {}})
        name = _text(path, line, "name", row.get("name"), required=False)
        if row.get("id") not in (None, ""):
            entry = known["by_id"].get(_integer(path, line, "id", row.get("id")))
            if entry is None:
                raise _fail(path, line, "id", f"{row.get('id')!r} is not an id of suite {suite!r}")
            if name is not None and name != entry["name"]:
                raise _fail(path, line, "name", f"{name!r} but id {entry['id']} is {entry['name']!r}")
            name = entry["name"]
        elif name is None:
            raise _fail(path, line, "name", "missing (give the task's name or its id)")
        entry = known["by_name"].get(name)
        trial = _integer(path, line, "episode", row.get("episode"), default=0)
        success = _boolean(path, line, "success", row.get("success"))
        steps = None if row.get("steps") in (None, "") else _integer(path, line, "steps", row.get("steps"))
        instruction = _text(path, line, "instruction", row.get("instruction"), required=False)
        base, init = _base_task(name)
        if entry is None:
            if base != name:
                raise _fail(path, line, "name", f"{name!r} is a variant name but not in task_classification.json's "
                                                f"{suite!r}")
            # a clean LIBERO task: the trial index is LIBERO's init-state index
            episodes.append(Episode(task=name, condition=CLEAN, episode=trial, success=success, variant=name,
                                    line=line, steps=steps, instruction=instruction,
                                    details={"suite": suite, "init_state": trial}))
            continue
        ep = Episode(task=base, condition=_variant_condition(entry), episode=entry["id"] * 1000 + trial,
                     success=success, variant=name, line=line, steps=steps, instruction=instruction,
                     details={"suite": suite, "id": entry["id"], "category": entry["category"],
                              "difficulty_level": entry["difficulty_level"], "trial": trial})
        if trial >= 1000:
            raise _fail(path, line, "episode", f"trial {trial} of one variant; at most 999 are read")
        if entry["category"] in _SAME_INITIAL_STATE and init is not None and trial == 0:
            ep.twin_episode = init
        elif entry["category"] in _SAME_INITIAL_STATE:
            ep.unpaired_reason = "the variant's name does not give the clean task's init-state index"
        elif entry["category"] == "Robot Initial States":
            ep.unpaired_reason = "the variant changes the robot's initial state"
        else:
            ep.unpaired_reason = "LIBERO-Plus builds this variant's scene and initial states anew"
        episodes.append(ep)
    if not episodes:
        raise ImportFormatError(f"{path}: no episodes")
    from hashlib import sha256

    return Source("liberoplus", episodes,
                  suite={"classification_sha256": sha256(_read(classification)).hexdigest()},
                  cross_run_pairing=None)


# --------------------------------------------------------------------------- lerobot-eval


def read_lerobot_eval(path: Path) -> Source:
    """``eval_info.json`` of ``lerobot-eval`` (multi-task or single-env)."""
    info = _object(path, 0, _json(path, _read(path)), "eval_info.json")
    episodes: List[Episode] = []
    if "per_task" in info:
        for i, item in enumerate(_list(path, "per_task", "per_task", info["per_task"])):
            where = f"per_task[{i}]"
            item = _object(path, where, item, "a per_task entry")
            group = _text(path, where, "task_group", item.get("task_group"))
            task_id = _integer(path, where, "task_id", item.get("task_id"))
            metrics = _object(path, where + ".metrics", item.get("metrics"), "metrics")
            successes = _list(path, where + ".metrics", "successes", metrics.get("successes"))
            for k, value in enumerate(successes):
                task = f"{group}-{task_id}"
                episodes.append(Episode(task=task, condition=CLEAN, episode=k,
                                        success=_boolean(path, f"{where}.metrics.successes[{k}]", "successes", value),
                                        variant=task, line=i + 1))
        reason = ("eval_info.json of a multi-task evaluation records neither the seed nor the init state of an "
                  "episode")
        return Source("lerobot-eval", episodes, suite={"tasks": sorted({e.task for e in episodes})},
                      cross_run_pairing=reason)
    if "per_episode" not in info:
        raise ImportFormatError(f"{path}: neither 'per_task' nor 'per_episode'; not an eval_info.json of lerobot-eval")
    seeds = []
    for i, item in enumerate(_list(path, "per_episode", "per_episode", info["per_episode"])):
        where = f"per_episode[{i}]"
        item = _object(path, where, item, "a per_episode entry")
        seed = item.get("seed")
        seed = None if seed is None else _integer(path, where, "seed", seed)
        seeds.append(seed)
        index = _integer(path, where, "episode_ix", item.get("episode_ix"))
        episodes.append(Episode(task="env", condition=CLEAN, episode=index if seed is None else seed,
                                success=_boolean(path, where, "success", item.get("success")), variant="env",
                                line=i + 1, details={"seed": seed, "episode_ix": index}))
    if len({e.episode for e in episodes}) != len(episodes):
        raise ImportFormatError(f"{path}: two episodes with the same seed / episode_ix")
    reason = None if all(s is not None for s in seeds) else "some episodes have no seed"
    return Source("lerobot-eval", episodes, suite={"tasks": ["env"]}, cross_run_pairing=reason)


# --------------------------------------------------------------------------- vla-eval


def read_vla_eval(path: Path) -> Source:
    """vla-eval's result JSON (one benchmark)."""
    result = _object(path, 0, _json(path, _read(path)), "a vla-eval result")
    benchmark = _text(path, "benchmark", "benchmark", result.get("benchmark"))
    seed = result.get("seed")
    seed = None if seed is None else _integer(path, "seed", "seed", seed)
    episodes: List[Episode] = []
    for i, task in enumerate(_list(path, "tasks", "tasks", result.get("tasks"))):
        where = f"tasks[{i}]"
        task = _object(path, where, task, "a task")
        name = _text(path, where, "task", task.get("task"))
        for k, ep in enumerate(_list(path, where, "episodes", task.get("episodes"))):
            at = f"{where}.episodes[{k}]"
            ep = _object(path, at, ep, "an episode")
            metrics = _object(path, at + ".metrics", ep.get("metrics"), "metrics")
            failure = ep.get("failure_reason")
            success = False if failure else _boolean(path, at + ".metrics", "success", metrics.get("success"))
            steps = ep.get("steps")
            episodes.append(Episode(task=name, condition=CLEAN, episode=_integer(path, at, "episode_id", ep.get("episode_id")),
                                    success=success, variant=name, line=i + 1,
                                    steps=None if steps is None else _integer(path, at, "steps", steps),
                                    details={"failure_reason": _text(path, at, "failure_reason", failure, required=False)}))
    if not episodes:
        raise ImportFormatError(f"{path}: no episodes")
    keys = [(e.task, e.episode) for e in episodes]
    if len(set(keys)) != len(keys):
        raise ImportFormatError(f"{path}: a task lists the same episode_id twice")
    reason = None if seed is not None else "the result records no seed"
    config = result.get("config") if isinstance(result.get("config"), dict) else {}
    return Source("vla-eval", episodes, suite={"benchmark": benchmark,
                                               "benchmark_config": json.dumps(config.get("benchmark"), sort_keys=True,
                                                                              default=str)[:4096]},
                  cross_run_pairing=reason, seed=seed,
                  policy=_text(path, "config", "model", str(config.get("model"))[:200], required=False) if config.get("model") else None)


READERS: Dict[str, Callable[..., Source]] = {
    "liberoplus": read_liberoplus,
    "lerobot-eval": read_lerobot_eval,
    "vla-eval": read_vla_eval,
}


def instruction_leaks(episodes: Sequence[Episode]) -> List[Dict[str, Any]]:
    """Rollouts whose instruction carries the variant's id (e.g. 'table 1' of '..._table_1').

    A policy reading such an instruction is told which perturbation it faces; LIBERO-Plus users
    found instructions built from variant names.
    """
    leaks = []
    for ep in episodes:
        if ep.condition == CLEAN or not ep.instruction:
            continue
        base, _ = _base_task(ep.variant)
        suffix = ep.variant[len(base):].strip("_")
        said = re.sub(r"[\s_]+", " ", ep.instruction.lower())
        if suffix and re.sub(r"[\s_]+", " ", suffix.lower()) in said:
            leaks.append({"task": ep.task, "condition": ep.condition, "variant": ep.variant, "line": ep.line,
                          "instruction": ep.instruction[:200]})
    return leaks
