"""Success judges: the plug-in contract, the registry, and running a judge over a judge set (resumable).

A judge is a class registered by name (entry-point group ``robocasa_shift.judges``)
with ``inputs`` (``end``, ``start_end`` or ``clip``: which images it is given) and
``judge(samples) -> [Verdict]``; options come from ``--judge-option KEY=VALUE``.
A secret option (a name with key, token, secret or password) is never written
anywhere: ``identity()`` is what the predictions' sidecar records.

Predictions are a CSV file with ``sample_id, predicted_success`` (0/1) and an
optional ``confidence`` (the judge's probability of success), so any judge,
run anywhere, can be scored. ``robocasa-shift judge`` writes one, appending as
jobs finish: a killed run resumes where it stopped, with nothing judged twice.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from robocasa_shift.config import ExecutionConfig, StudyConfig, redact_options
from robocasa_shift.errors import BadInput, RunDirError
from robocasa_shift.judging.judgeset import INPUTS, JudgeSample, JudgeSet
from robocasa_shift.registry import Registry

JUDGES: Registry[type] = Registry("judge", "robocasa_shift.judges")
JUDGES.register("end-state", "robocasa_shift.judging.endstate:EndStateJudge")
JUDGES.register("openai", "robocasa_shift.judging.openai_judge:OpenAIJudge")

PREDICTION_COLUMNS = ("sample_id", "predicted_success", "confidence")
SIDECAR_SUFFIX = ".json"  # P.csv -> P.csv.json: which judge, with which options, on which judge set


class PredictionsError(BadInput):
    """A predictions file that cannot be scored (the message names the file, the row and the field)."""


@dataclass(frozen=True)
class Verdict:
    """A judge's answer for one sample: did the attempt succeed, and how sure is it (P(success), optional).

    ``error`` (instead of an answer): why the judge has none for this sample; it is reported and the
    sample is judged again by the next run.
    """

    predicted_success: bool
    confidence: Optional[float] = None
    error: Optional[str] = None


class Judge:
    """Base class of success judges.

    Class attributes: ``name``, ``inputs`` (one of ``judgeset.INPUTS``). Subclasses take their
    options as constructor keywords and implement :meth:`judge`.
    """

    name = "judge"
    inputs = "end"

    def judge(self, samples: Sequence[JudgeSample]) -> List[Verdict]:
        """One verdict per sample, in order."""
        raise NotImplementedError

    def identity(self) -> Dict[str, Any]:
        """What identifies this judge in a predictions sidecar (name, model, weights hash; never a secret)."""
        return {"name": self.name}

    def close(self) -> None:
        """Release what the judge holds (a connection, a model)."""


def make_judge(name: str, options: Optional[Mapping[str, Any]] = None) -> Judge:
    """The judge registered as ``name``, built with ``options``.

    Raises:
        UnknownNameError: no judge of that name (the message lists the registered ones).
        BadInput: an option the judge does not take (the message lists those it takes).
    """
    import inspect

    cls = JUDGES.get(name)
    options = dict(options or {})
    params = inspect.signature(cls.__init__).parameters if cls.__init__ is not object.__init__ else {}
    known = [n for n in params if n != "self"]
    unknown = sorted(set(options) - set(known))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise BadInput(f"judge {name!r} takes no option {unknown[0]!r}; its options: {', '.join(known) or '(none)'}")
    judge = cls(**options)
    if judge.inputs not in INPUTS:
        raise BadInput(f"judge {name!r} declares inputs {judge.inputs!r}; one of {', '.join(INPUTS)}")
    return judge


class JudgeJob:
    """A job for the executors: one judge over a chunk of samples (images travel with the job)."""

    def __init__(self, name: str, options: Mapping[str, Any], samples: Sequence[JudgeSample]):
        self.name, self.options, self.samples = name, dict(options), list(samples)

    @property
    def size(self) -> int:
        return len(self.samples)

    def run(self, cache) -> List[Dict[str, Any]]:
        kept_as = ("judge", self.name, json.dumps(self.options, sort_keys=True, default=str))
        if kept_as not in cache.kept:  # one judge per worker and command
            cache.kept[kept_as] = make_judge(self.name, self.options)
        verdicts = cache.kept[kept_as].judge(self.samples)
        if len(verdicts) != len(self.samples):
            raise BadInput(f"judge {self.name!r} returned {len(verdicts)} verdicts for {len(self.samples)} samples")
        return [{"verdict": {"sample_id": s.sample_id, "error": v.error} if v.error else
                 {"sample_id": s.sample_id, "predicted_success": int(bool(v.predicted_success)),
                  "confidence": None if v.confidence is None else float(v.confidence)}}
                for s, v in zip(self.samples, verdicts)]

    def unrun(self, study, kind: str, message: str, protocol=None) -> List[Dict[str, Any]]:
        return [{"verdict": {"sample_id": s.sample_id, "error": f"{kind}: {message}"}} for s in self.samples]


def read_predictions(path: Path | str, known_ids: Optional[Sequence[str]] = None):
    """A predictions CSV as a DataFrame (``sample_id``, ``predicted_success`` 0/1, ``confidence`` or NaN).

    Raises:
        PredictionsError: a missing column, a value that is not 0/1, a confidence outside [0, 1], a sample
            judged twice, or (with ``known_ids``) a sample the judge set does not hold; the message names
            the file, the row and the field.
    """
    import pandas as pd

    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype={"sample_id": str})
    except (OSError, ValueError) as exc:
        raise PredictionsError(f"{path}: cannot read predictions ({exc})") from None
    missing = [c for c in PREDICTION_COLUMNS[:2] if c not in frame.columns]
    if missing:
        raise PredictionsError(f"{path}: no column {missing[0]!r} (a predictions file has sample_id, "
                               f"predicted_success and optionally confidence)")
    if "confidence" not in frame.columns:
        frame["confidence"] = float("nan")
    for i, row in frame.iterrows():
        where = f"{path}, row {i + 2}"  # the header is line 1
        value = row["predicted_success"]
        if value not in (0, 1, 0.0, 1.0, True, False):
            raise PredictionsError(f"{where}: field 'predicted_success' must be 0 or 1, got {value!r}")
        conf = row["confidence"]
        if not (isinstance(conf, (int, float)) and (math.isnan(conf) or 0.0 <= conf <= 1.0)):
            raise PredictionsError(f"{where}: field 'confidence' must be a number in [0, 1] or empty, got {conf!r}")
    duplicated = frame["sample_id"][frame["sample_id"].duplicated()]
    if len(duplicated):
        raise PredictionsError(f"{path}: sample {duplicated.iloc[0]!r} is judged more than once")
    if known_ids is not None:
        unknown = sorted(set(frame["sample_id"]) - set(known_ids))
        if unknown:
            raise PredictionsError(f"{path}: {len(unknown)} sample(s) not in the judge set, e.g. {unknown[0]!r}")
    frame["predicted_success"] = frame["predicted_success"].astype(int)
    return frame[list(PREDICTION_COLUMNS)]


def _judged_rows(path: Path) -> List[Dict[str, str]]:
    """Rows already in a predictions file; a torn last line (a killed run) is cut off first."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return list(csv.DictReader(io.StringIO(data.decode())))


def run_judge(judge_set: Path | str, name: str, out: Path | str, options: Optional[Mapping[str, Any]] = None,
              execution: ExecutionConfig = ExecutionConfig(), chunk: int = 16) -> Dict[str, Any]:
    """Judge every sample of ``judge_set`` with judge ``name`` into the predictions CSV ``out`` (resumable).

    Raises:
        RunDirError: ``out`` holds predictions of another judge, other options or another judge set.
        Error: the judge failed on a chunk (its message; what was judged before it is kept).
    """
    from robocasa_shift.study.executors import make_executor
    from robocasa_shift.study.runner import progress_iter

    judges = JudgeSet(judge_set)
    out = Path(out)
    options = dict(options or {})
    probe = make_judge(name, options)  # unknown names and options are refused before anything runs
    try:
        sidecar = {"judge": probe.identity(), "options": redact_options(options), "inputs": probe.inputs,
                   "judge_set": str(judges.root), "export_hash": judges.export_hash}
    finally:
        probe.close()
    sidecar_path = out.with_name(out.name + SIDECAR_SUFFIX)
    if sidecar_path.exists():
        found = json.loads(sidecar_path.read_text())
        differ = sorted(k for k in ("judge", "options", "export_hash") if found.get(k) != sidecar.get(k))
        if differ:
            raise RunDirError(f"{out} holds predictions of another judge or judge set ({', '.join(differ)} differ); "
                              f"write to another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    sidecar_path.write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    done = {row["sample_id"] for row in _judged_rows(out)}
    todo = [sid for sid in judges.by_id if sid not in done]
    jobs = [JudgeJob(name, options, judges.samples(todo[i : i + chunk], probe.inputs))
            for i in range(0, len(todo), chunk)]
    errors: List[str] = []
    if jobs:
        study = StudyConfig(backend=judges.info["source"]["backend"])
        executor = make_executor(study, execution.resolved())
        new_file = not out.exists() or out.stat().st_size == 0
        try:
            with out.open("a", newline="") as handle:
                writer = csv.writer(handle)
                if new_file:
                    writer.writerow(PREDICTION_COLUMNS)
                for result in progress_iter(executor.run_jobs(jobs), len(todo), "samples", execution.progress):
                    verdict = result["verdict"]
                    if "error" in verdict:
                        errors.append(f"{verdict['sample_id']}: {verdict['error']}")
                        continue
                    conf = verdict["confidence"]
                    writer.writerow([verdict["sample_id"], verdict["predicted_success"], "" if conf is None else
                                     f"{conf:.6f}"])
                    handle.flush()
        finally:
            executor.close()
    return {"judge": name, "out": str(out), "samples": len(judges.rows), "judged_now": len(todo) - len(errors),
            "judged": len(_judged_rows(out)), "errors": errors, "export_hash": judges.export_hash}


__all__ = ["JUDGES", "Judge", "JudgeJob", "PREDICTION_COLUMNS", "PredictionsError", "Verdict", "make_judge",
           "read_predictions", "run_judge"]
