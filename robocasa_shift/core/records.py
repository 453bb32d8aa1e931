"""Rollout keys and records: one record per rollout, JSON on disk, one row of the records table."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional


@dataclass(frozen=True, order=True)
class RolloutKey:
    """What identifies a rollout: a key is run once per run directory."""

    phase: str
    task: str
    episode: int
    condition: str
    replicate: int = 0

    @property
    def id(self) -> str:
        return f"{self.phase}/{self.task}/{self.episode:04d}/{self.condition}/r{self.replicate}"

    @property
    def pair_id(self) -> str:
        """The base episode (and replicate) this rollout shares with its clean twin."""
        return f"{self.phase}/{self.task}/{self.episode:04d}/r{self.replicate}"

    @classmethod
    def from_id(cls, text: str) -> "RolloutKey":
        phase, task, episode, condition, replicate = text.split("/")
        return cls(phase, task, int(episode), condition, int(replicate.lstrip("r")))

    def to_json(self) -> Dict[str, Any]:
        """The five fields, as records carry them."""
        return {"phase": self.phase, "task": self.task, "episode": self.episode, "condition": self.condition,
                "replicate": self.replicate}

    @classmethod
    def from_record(cls, rec: Dict[str, Any]) -> "RolloutKey":
        return cls(rec["phase"], rec["task"], int(rec["episode"]), rec["condition"], int(rec.get("replicate", 0)))


@dataclass
class Record:
    """The outcome of one rollout, with everything the audit needs to check it."""

    phase: str
    task: str
    episode: int
    condition: str
    replicate: int
    backend: str
    policy: str
    spec_hash: str
    stage_spec_hash: str
    study_seed: int
    env_seed: int
    policy_seed: int
    horizon: int
    n_stages: int
    stage_names: List[str]
    env_fingerprint: Optional[str] = None
    policy_rng_fingerprint: Optional[str] = None
    success: Optional[bool] = None
    steps: int = 0
    truncated: bool = False
    stages_completed: int = 0
    first_incomplete: Optional[int] = 1
    stage_steps: List[Optional[int]] = field(default_factory=list)
    stage_error: Optional[str] = None
    perturbation: Optional[Dict[str, Any]] = None
    valid: bool = True
    error: Optional[str] = None
    error_kind: Optional[str] = None  # runtime | renderer | perturbation | policy_server
    renderer: Optional[str] = None
    wall_s: float = 0.0
    timing: Dict[str, float] = field(default_factory=dict)
    policy_calls: int = 0
    frames_rendered: int = 0
    step_log: Optional[Dict[str, Any]] = None  # {sha256, steps, boundaries, samples} of the log beside the record
    frame_log: Optional[Dict[str, Any]] = None  # {sha256, bytes, steps, cameras, size} of the frames beside the record
    # a generated asset kit the rollout ran on ("standin": the robocasa stand-in kitchens) and its content hash;
    # None on a backend's own assets
    asset_kit: Optional[str] = None
    asset_kit_sha256: Optional[str] = None
    # where an imported record came from (robocasa-shift import-results): the source's format, file SHA-256,
    # its own name and line of the rollout, what the source could not tell; absent on the harness's own records
    source: Optional[Dict[str, Any]] = None

    @property
    def key(self) -> RolloutKey:
        return RolloutKey(self.phase, self.task, self.episode, self.condition, self.replicate)

    def fail(self, kind: str, message: str) -> None:
        self.valid, self.error_kind, self.error = False, kind, message

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        for name in ("source", "frame_log"):  # absent unless used: records without them keep their shape
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Record":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# Fields kept out of record comparisons: they depend on the machine, not on the rollout.
MACHINE_FIELDS = ("wall_s", "timing", "renderer")


def comparable(record: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in record.items() if k not in MACHINE_FIELDS}


def unlatched_success(rec: Dict[str, Any]) -> Optional[str]:
    """The first subgoal a valid official success left unlatched, None for any other record.

    The tracker latches its subgoals in order and the official success check is the task's own, so a stage spec
    that asks more than the success check does (Lift's first subgoal wants the grasp site within 2 cm of the cube's
    centre; a grasp at the cube's edge lifts it from 2.5 cm) leaves a success with unlatched subgoals, every later
    one included. Such a record is a success, not a rollout stopped at that subgoal: callers name it apart.
    """
    if not (rec.get("valid") and rec.get("success")) or rec.get("stage_error"):
        return None
    names, first = rec.get("stage_names") or [], rec.get("first_incomplete")
    if not isinstance(first, int) or not 1 <= first <= len(names):
        return None
    return str(names[first - 1])


def _per_entry(pert: Dict[str, Any], field_name: str) -> Any:
    """A field of a perturbation record; of a combined one (``entries``), the list of its entries' fields."""
    if isinstance(pert.get("entries"), list):
        return [e.get(field_name) if isinstance(e, dict) else None for e in pert["entries"]]
    return pert.get(field_name)


def _defaults() -> Dict[str, Any]:
    """The value of every ``Record`` field that has one."""
    out = {}
    for f in fields(Record):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def to_row(rec: Dict[str, Any]) -> Dict[str, Any]:
    """One row of the records table (docs/records.md). A record file may leave out fields that have a default
    (an older version wrote fewer; the store accepts it): they read as their defaults."""
    rec = {**_defaults(), **rec}
    pert = rec.get("perturbation") or {}
    return {
        "task": rec["task"],
        "episode": rec["episode"],
        "condition": rec["condition"],
        "success": rec["success"],
        "n_stages": rec["n_stages"],
        "stages_completed": rec["stages_completed"],
        "first_incomplete": rec["first_incomplete"],
        "valid": rec["valid"],
        "phase": rec["phase"],
        "replicate": rec["replicate"],
        "spec_hash": rec["spec_hash"],
        # one stage-spec version per task: analyze refuses a table that mixes two
        "stage_spec_hash": rec.get("stage_spec_hash"),
        "stage_error": rec["stage_error"] is not None,
        "backend": rec["backend"],
        "policy": rec["policy"],
        "steps": rec["steps"],
        "horizon": rec["horizon"],
        "truncated": rec["truncated"],
        "env_fingerprint": rec["env_fingerprint"],
        "policy_rng_fingerprint": rec["policy_rng_fingerprint"],
        "env_seed": rec["env_seed"],
        "policy_seed": rec["policy_seed"],
        # a combined condition's entries, one per factor, as a list
        "perturbation_params": json.dumps(_per_entry(pert, "applied")) if pert else "",
        "perturbation_draw": json.dumps(_per_entry(pert, "draw")) if pert else "",
        "perturbation_ok": pert.get("ok", True) if pert else True,
        "stage_names": json.dumps(rec["stage_names"]),
        "stage_steps": json.dumps(rec["stage_steps"]),
        "stage_error_message": rec["stage_error"] or "",
        "error": rec["error"] or "",
        "error_kind": rec["error_kind"] or "",
        "renderer": rec["renderer"] or "",
        "wall_s": rec["wall_s"],
        "asset_kit": rec.get("asset_kit") or "",
        "asset_kit_sha256": rec.get("asset_kit_sha256") or "",
    }
