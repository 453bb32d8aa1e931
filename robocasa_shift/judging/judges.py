"""Success judges: the plug-in contract, the registry, and running a judge over a judge set (resumable).

A judge is a class registered by name (entry-point group ``robocasa_shift.judges``)
with ``inputs`` (``end``, ``start_end`` or ``clip``: which images it is given) and
``judge(samples) -> [Verdict]``; options come from ``--judge-option KEY=VALUE``.
A secret option (a name with key, token, secret or password) is never written
anywhere: ``identity()`` is what the predictions' sidecar records.

Predictions are a CSV file with ``sample_id, predicted_success`` (0/1), an
optional ``confidence`` (the judge's probability of success) and an optional
``reasoning`` (the judge's own explanation, where it gives one), so any judge,
run anywhere, can be scored. ``robocasa-shift judge`` writes one, appending as
jobs finish: a killed run resumes where it stopped, with nothing judged twice.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from robocasa_shift.config import ExecutionConfig, StudyConfig, redact_options
from robocasa_shift.errors import BadInput, RunDirError, RunDirLocked
from robocasa_shift.judging.judgeset import INPUTS, JudgeSample, JudgeSet, is_sample_id
from robocasa_shift.rundir.files import (
    MAX_FILE_BYTES,
    MAX_JSON_BYTES,
    atomic_write_bytes,
    atomic_write_text,
    clean_orphans,
    confined,
    csv_header,
    open_append,
    open_lock,
    read_bytes,
)
from robocasa_shift.registry import Registry

JUDGES: Registry[type] = Registry("judge", "robocasa_shift.judges")
JUDGES.register("end-state", "robocasa_shift.judging.endstate:EndStateJudge")
JUDGES.register("openai", "robocasa_shift.judging.openai_judge:OpenAIJudge")

PREDICTION_COLUMNS = ("sample_id", "predicted_success", "confidence", "reasoning", "predicted_stage")
MAX_REASONING_CHARS = 20000  # a judge's reasoning kept per sample (longer text is cut, and says so)
SIDECAR_SUFFIX = ".json"  # P.csv -> P.csv.json: which judge, with which options, on which judge set


class PredictionsError(BadInput):
    """A predictions file that cannot be scored (the message names the file, the row and the field)."""


@dataclass(frozen=True)
class Verdict:
    """A judge's answer for one sample: did the attempt succeed, and how sure is it (P(success), optional).

    ``error`` (instead of an answer): why the judge has none for this sample; it is reported and the
    sample is judged again by the next run. ``reasoning``: the judge's explanation or thinking text, kept in
    the predictions (None for a judge that gives none).
    """

    predicted_success: bool
    confidence: Optional[float] = None
    error: Optional[str] = None
    reasoning: Optional[str] = None


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
                  "confidence": None if v.confidence is None else float(v.confidence),
                  "reasoning": clean_reasoning(v.reasoning)}}
                for s, v in zip(self.samples, verdicts)]


def clean_reasoning(text: Optional[str]) -> str:
    """A judge's reasoning as one CSV cell: control characters but newline and tab removed, at most
    :data:`MAX_REASONING_CHARS` (a cut text ends with a note saying so); '' for none."""
    if not text:
        return ""
    kept = "".join(ch for ch in str(text) if ch in "\n\t" or ord(ch) >= 32)
    if len(kept) > MAX_REASONING_CHARS:
        kept = kept[:MAX_REASONING_CHARS] + f" [cut: {len(kept)} characters in all]"
    return kept

    def unrun(self, study, kind: str, message: str, protocol=None) -> List[Dict[str, Any]]:
        return [{"verdict": {"sample_id": s.sample_id, "error": f"{kind}: {message}"}} for s in self.samples]


def read_predictions(path: Path | str, known_ids: Optional[Sequence[str]] = None):
    """A predictions CSV as a DataFrame (``sample_id``, ``predicted_success`` 0/1, ``confidence`` or NaN).

    Raises:
        PredictionsError: a missing column, a line that repeats the header, a sample judged twice, a value
            that is not 0/1, a confidence outside [0, 1], or (with ``known_ids``) a sample the judge set does
            not hold; the message names the file, the row and the field.
    """
    import pandas as pd

    path = Path(path)
    try:
        data = read_bytes(path, None, MAX_FILE_BYTES, "predictions file")
        header = csv_header(data, path)  # a huge header is refused before pandas parses any of it
        frame = pd.read_csv(io.BytesIO(data), dtype={"sample_id": str},
                            usecols=list(dict.fromkeys(c for c in header if c in PREDICTION_COLUMNS)))
    except (OSError, ValueError) as exc:
        raise PredictionsError(f"{path}: cannot read predictions ({getattr(exc, 'strerror', None) or exc})") from None
    missing = [c for c in PREDICTION_COLUMNS[:2] if c not in frame.columns]
    if missing:
        raise PredictionsError(f"{path}: no column {missing[0]!r} (a predictions file has sample_id, "
                               f"predicted_success and optionally confidence)")
    if "confidence" not in frame.columns:
        frame["confidence"] = float("nan")
    frame["reasoning"] = frame["reasoning"].fillna("").astype(str) if "reasoning" in frame.columns else ""
    headers = [i + 2 for i, sid in enumerate(frame["sample_id"]) if sid == "sample_id"]  # the header is line 1
    if headers:
        raise PredictionsError(f"{path}, row {headers[0]}: repeats the header line ({len(headers)} such line(s): two "
                               f"runs wrote to one file?); rerun `robocasa-shift judge` with this --out to repair it")
    counts = frame["sample_id"].value_counts()
    twice = counts[counts > 1]
    if len(twice):
        rows = [i + 2 for i, sid in enumerate(frame["sample_id"]) if sid == twice.index[0]]
        raise PredictionsError(f"{path}: sample {twice.index[0]!r} is judged more than once (rows "
                               f"{', '.join(map(str, rows[:5]))}; {len(twice)} sample(s) in all); rerun "
                               f"`robocasa-shift judge` with this --out to repair it")
    for column in ("predicted_success", "confidence"):  # a column read as text ("1") holds numbers if it can
        if frame[column].dtype == object:
            numbers = pd.to_numeric(frame[column], errors="coerce")
            if numbers.notna().sum() == frame[column].notna().sum():
                frame[column] = numbers
    for i, row in frame.iterrows():
        where = f"{path}, row {i + 2}"  # the header is line 1
        value = row["predicted_success"]
        if value not in (0, 1, 0.0, 1.0, True, False):
            raise PredictionsError(f"{where}: field 'predicted_success' must be 0 or 1, got {value!r}")
        conf = row["confidence"]
        if not (isinstance(conf, (int, float)) and (math.isnan(conf) or 0.0 <= conf <= 1.0)):
            raise PredictionsError(f"{where}: field 'confidence' must be a number in [0, 1] or empty, got {conf!r}")
    if known_ids is not None:
        unknown = sorted(set(frame["sample_id"]) - set(known_ids))
        if unknown:
            raise PredictionsError(f"{path}: {len(unknown)} sample(s) not in the judge set, e.g. {unknown[0]!r}")
    frame["predicted_success"] = frame["predicted_success"].astype(int)
    # optional: the stage a judge says the attempt reached (scored against the StageTracker's depth)
    stage = pd.to_numeric(frame.get("predicted_stage", pd.Series(float("nan"), index=frame.index)), errors="coerce")
    if "predicted_stage" in frame.columns:
        bad = frame["predicted_stage"].notna() & (stage.isna() | (stage < 0) | (stage % 1 != 0) | (stage > 10**6))
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise PredictionsError(f"{path}, row {row + 2}: field 'predicted_stage' must be a whole number of stages "
                                   f"or empty, got {frame['predicted_stage'].iloc[row]!r}")
    frame["predicted_stage"] = stage
    return frame[list(PREDICTION_COLUMNS)]


def _judged_rows(path: Path) -> List[Dict[str, str]]:
    """Rows already in a predictions file (read as a shared directory's files are read)."""
    if not os.path.lexists(path):
        return []
    data = read_bytes(path, None, MAX_FILE_BYTES, "predictions file")
    try:
        return list(csv.DictReader(io.StringIO(data.decode("utf-8", errors="replace"), newline="")))
    except csv.Error as exc:
        raise RunDirError(f"{path}: not a predictions file ({exc}); write to another --out") from None


def repair_predictions(path: Path, known_ids: Sequence[str]) -> Dict[str, int]:
    """Make a predictions file one header and one row per judged sample again (call it holding the lock).

    Cut: a torn last line (a killed run), lines that repeat the header or name no sample of the set,
    rows whose verdict is not 0/1, and every row of a sample after its first (two runs that appended to
    one file). The file is rewritten atomically only when something was cut; returns the counts cut.
    """
    if not os.path.lexists(path):
        return {}
    data = read_bytes(path, None, MAX_FILE_BYTES, "predictions file")
    cut = {"torn": 0, "headers": 0, "unknown": 0, "malformed": 0, "duplicates": 0}
    if data and not data.endswith(b"\n"):
        data, cut["torn"] = data[: data.rfind(b"\n") + 1], 1
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8", errors="replace"), newline="")))
    except csv.Error as exc:
        raise RunDirError(f"{path}: not a predictions file ({exc}); write to another --out") from None
    known, kept, seen = set(known_ids), [], set()
    if rows and rows[0][:2] != list(PREDICTION_COLUMNS[:2]):
        raise RunDirError(f"{path}: not a predictions file (its first line is not the header "
                          f"{','.join(PREDICTION_COLUMNS)}); write to another --out")
    for row in rows[1:]:
        if row[:2] == list(PREDICTION_COLUMNS[:2]):
            cut["headers"] += 1
        elif not row or row[0] not in known:
            cut["unknown"] += 1
        elif len(row) < 2 or row[1] not in ("0", "1"):
            cut["malformed"] += 1
        elif row[0] in seen:
            cut["duplicates"] += 1
        else:
            seen.add(row[0])
            kept.append(row)
    if not any(cut.values()):
        return cut
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(PREDICTION_COLUMNS)
    writer.writerows(row[:4] for row in kept)
    atomic_write_bytes(path, buffer.getvalue().encode("utf-8"))
    return cut


def _lock_predictions(out: Path) -> int:
    """Hold ``OUT.lock`` (flock, released when the process dies) or refuse: one judge run per predictions file."""
    fd = open_lock(out.with_name(out.name + ".lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip()
        os.close(fd)
        raise RunDirLocked(f"{out} is being written by another judge run ({holder or 'unknown'}); wait for it to "
                           f"finish or write to another --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}".encode())
    return fd


def run_judge(judge_set: Path | str, name: str, out: Path | str, options: Optional[Mapping[str, Any]] = None,
              execution: ExecutionConfig = ExecutionConfig(), chunk: int = 16, crop: Any = False,
              boxes: Optional[str] = None) -> Dict[str, Any]:
    """Judge every sample of ``judge_set`` with judge ``name`` into the predictions CSV ``out`` (resumable).

    ``crop``: the localise-and-crop input mode (True or one of ``crops.CROP_MODES``: cut, blackout, upscaled);
    the sidecar records it. ``boxes``: crop to the boxes a localiser wrote (``SET/boxes/NAME.json``, see
    ``judging/localiser.py``) instead of the export's; the sidecar records the name and the file's SHA-256.

    ``out`` is locked while the run writes it (a second run on it is refused), and repaired first
    (see :func:`repair_predictions`). Below the judge set, nothing is written through a symbolic link.

    Raises:
        RunDirError: ``out`` holds predictions of another judge, other options or another judge set.
        RunDirLocked: another judge run is writing ``out``.
        Error: the judge failed on a chunk (its message; what was judged before it is kept).
    """
    judges = JudgeSet(judge_set)
    with confined(judges.root):
        return _run_judge(judges, name, Path(out), options, execution, chunk, crop, boxes)


def _run_judge(judges: JudgeSet, name: str, out: Path, options: Optional[Mapping[str, Any]],
               execution: ExecutionConfig, chunk: int, crop: Any = False, boxes: Optional[str] = None) -> Dict[str, Any]:
    from robocasa_shift.judging.crops import crop_mode

    options = dict(options or {})
    mode = crop_mode(crop) or ("cut" if boxes else None)
    probe = make_judge(name, options)  # unknown names and options are refused before anything runs
    try:
        sidecar = {"judge": probe.identity(), "options": redact_options(options), "inputs": probe.inputs,
                   "crop": mode is not None, "judge_set": str(judges.root), "export_hash": judges.export_hash}
        if mode not in (None, "cut"):  # the native cut's sidecar keeps its shape
            sidecar["crop_mode"] = mode
        if boxes:  # a localiser's boxes, named and hashed: another localiser is another pipeline
            from robocasa_shift.judging.boxes import boxes_path

            sidecar["boxes"] = {"name": boxes, "sha256": hashlib.sha256(
                read_bytes(boxes_path(judges.root, boxes), judges.root, MAX_JSON_BYTES, "boxes file")).hexdigest()}
    finally:
        probe.close()
    sidecar_path = out.with_name(out.name + SIDECAR_SUFFIX)
    lock = _lock_predictions(out)
    try:
        if os.path.abspath(out).startswith(os.path.abspath(judges.root) + os.sep):
            clean_orphans(out.parent)  # temporary files of killed runs; never outside the set
        return _judge_locked(judges, name, out, options, execution, chunk, sidecar, sidecar_path, probe)
    finally:
        os.close(lock)


def _judge_locked(judges: JudgeSet, name: str, out: Path, options: Dict[str, Any], execution: ExecutionConfig,
                  chunk: int, sidecar: Dict[str, Any], sidecar_path: Path, probe: Judge) -> Dict[str, Any]:
    from robocasa_shift.study.executors import make_executor
    from robocasa_shift.study.runner import progress_iter

    if os.path.lexists(sidecar_path):
        try:
            found = json.loads(read_bytes(sidecar_path, None, MAX_JSON_BYTES, "predictions sidecar").decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise RunDirError(f"{sidecar_path}: not readable JSON ({getattr(exc, 'strerror', None) or exc}); write "
                              f"to another --out") from None
        found = found if isinstance(found, dict) else {}
        differ = sorted(k for k in ("judge", "options", "export_hash", "boxes") if found.get(k) != sidecar.get(k))
        if (bool(found.get("crop", False)), found.get("crop_mode")) != (sidecar["crop"], sidecar.get("crop_mode")):
            differ.append("crop")
        if differ:
            raise RunDirError(f"{out} holds predictions of another judge or judge set ({', '.join(differ)} differ); "
                              f"write to another --out")
    atomic_write_text(sidecar_path, json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    repaired = repair_predictions(out, list(judges.by_id))
    done = {row.get("sample_id") for row in _judged_rows(out)}
    todo = [sid for sid in judges.by_id if sid not in done]
    localised = None
    if sidecar.get("boxes"):
        from robocasa_shift.judging.boxes import localiser_boxes

        localised = localiser_boxes(judges, sidecar["boxes"]["name"], todo)
    jobs = [JudgeJob(name, options, judges.samples(todo[i : i + chunk], probe.inputs,
                                                          sidecar.get("crop_mode") or sidecar["crop"], localised))
            for i in range(0, len(todo), chunk)]
    errors: List[str] = []
    if jobs:
        study = StudyConfig(backend=judges.info["source"]["backend"])
        executor = make_executor(study, execution.resolved())
        try:
            with open_append(out) as handle:
                writer = csv.writer(handle)
                if os.fstat(handle.fileno()).st_size == 0:
                    writer.writerow(PREDICTION_COLUMNS)
                for result in progress_iter(executor.run_jobs(jobs), len(todo), "samples", execution.progress):
                    verdict = result["verdict"]
                    if "error" in verdict or not is_sample_id(verdict.get("sample_id")):
                        errors.append(f"{verdict.get('sample_id')}: {verdict.get('error')}")
                        continue
                    conf = verdict["confidence"]
                    writer.writerow([verdict["sample_id"], verdict["predicted_success"], "" if conf is None else
                                     f"{conf:.6f}", verdict.get("reasoning") or ""])
                    handle.flush()
        finally:
            executor.close()
    return {"judge": name, "out": str(out), "samples": len(judges.rows), "judged_now": len(todo) - len(errors),
            "judged": len(_judged_rows(out)), "errors": errors, "export_hash": judges.export_hash,
            "repaired": {k: v for k, v in repaired.items() if v}}


__all__ = ["JUDGES", "Judge", "JudgeJob", "PREDICTION_COLUMNS", "PredictionsError", "Verdict", "clean_reasoning",
           "make_judge",
           "read_predictions", "repair_predictions", "run_judge"]
