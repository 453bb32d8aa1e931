"""The report's sections on the studies made from a run: severity sweeps, counterfactual branching, runtime
monitors and success judges.

Each is read from what its command wrote (``sweep/summary.json``, ``branching/<name>/summary.json``, ``monitors/summary.json``,
``<judge set>/scores/scores.md`` of a judge set exported into the run directory); nothing is re-run here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, List, Mapping, Tuple

import pandas as pd

from robocasa_shift.analysis.branching import condition_display, zero_noise_line
from robocasa_shift.rundir.files import MAX_JSON_BYTES, read_text
from robocasa_shift.report.html import (
    esc,
    html_table,
    identity_html,
    markdown_html,
    num,
    src,
)

_BRANCH_FIGURE = re.compile(r"figures/[A-Za-z0-9_.\-]+\.png")


def _branch_condition_rows(summary: Mapping[str, Any]) -> Tuple[List[str], List[List[Any]]]:
    """The per-condition table of a branch summary: recoverable counts, median horizons, the sign test."""
    frame = condition_display(pd.DataFrame(summary["conditions"]), summary["interventions"])
    return list(frame.columns), frame.astype(object).values.tolist()


def _zero_noise_html(tally: Any) -> List[str]:
    """The zero-noise known-answer line (none for a summary written before the check existed)."""
    if not isinstance(tally, Mapping):
        return []
    try:
        good = tally["ok"] == tally["checked"] == tally.get("eligible", tally["checked"])
        return [f"<p class='{'good' if good else 'bad'}'>{esc(zero_noise_line(tally))}</p>"]
    except (KeyError, TypeError) as exc:
        return [f"<p class='bad'>zero-noise tally cannot be read ({esc(type(exc).__name__)})</p>"]


def _branch_study_html(study_dir: Path) -> str:
    """One branch study from its ``summary.json`` (written by ``robocasa-shift branch``; nothing is re-run)."""
    try:
        summary = json.loads(read_text(study_dir / "summary.json", None, MAX_JSON_BYTES, "branch summary"))
        header, rows = _branch_condition_rows(summary)
        tally = summary["fidelity"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (f"<h3>{esc(study_dir.name)}</h3><p class='bad'>branching/{esc(study_dir.name)}/summary.json cannot "
                f"be read ({esc(type(exc).__name__)}: {esc(exc)}); write it again with the branch command.</p>")
    good = tally["ok"] == tally["checked"] and tally["checked"] > 0
    parts = [
        f"<h3>{esc(study_dir.name)}</h3>",
        "<table class='meta'>" + "".join(f"<tr><th>{esc(k)}</th><td>{identity_html(v)}</td></tr>"
                                         for k, v in (summary.get("settings") or {}).items()) + "</table>",
        f"<p class='{'good' if good else 'bad'}'>Replay fidelity: {esc(tally['ok'])}/{esc(tally['checked'])} restored "
        f"checkpoints reproduced their trunk (largest qpos deviation {num(tally.get('max_qpos_dev'), '.3g')}, largest "
        f"state deviation {num(tally.get('max_state_dev'), '.3g')}); {esc(tally.get('invalid', 0))} invalid. "
        f"{esc(tally.get('trunks_reproduced'))} of {esc(tally.get('trunks'))} trunks are valid and re-ran to their "
        f"stored record.</p>",
        *_zero_noise_html(tally.get("zero_noise")),
        html_table(header, rows),
        f"<p class='small'>tau = {num(summary.get('tau'), 'g')}; estimate: lower {num(summary.get('q'), 'g')} quantile "
        "of the Jeffreys posterior of each checkpoint's branches. Horizon: the latest checkpoint whose estimate reaches "
        "tau (not assumed monotone); combined: the best intervention at each checkpoint. Median and IQR over the trunks "
        "with a defined horizon; the sign test over trunks defined under both interventions, zeros dropped. Only "
        "checkpoints whose replay reproduced the trunk are used.</p>",
    ]
    closing = [c["text"] for c in summary.get("closing") or []]
    if closing:
        parts.append("<ul>" + "".join(f"<li>{esc(text)}</li>" for text in closing) + "</ul>")
    parts += _branch_extended_html(summary)
    for figure in summary.get("figures") or []:
        name = str(figure.get("file", ""))
        if _BRANCH_FIGURE.fullmatch(name) and (study_dir / name).is_file():
            path = f"../branching/{study_dir.name}/{name}"
            parts.append(f"<figure><img src='{src(path)}' alt='{esc(figure.get('task'))} {esc(figure.get('condition'))}'>"
                         f"<figcaption>{esc(figure.get('task'))}, {esc(figure.get('condition'))}</figcaption></figure>")
    return "".join(parts)


def _texts(section: Any) -> List[str]:
    return [str(s.get("text")) for s in ((section or {}).get("summary") or []) if isinstance(s, Mapping)]


def _branch_extended_html(summary: Mapping[str, Any]) -> List[str]:
    """Non-monotone recoverability, the fixed-K agreement, horizons relative to task events and expected costs."""
    parts = []
    for title, key, empty in (
            ("Non-monotone recoverability (recoverable, then not, then again)", "nonmonotone",
             "no trunk with three usable checkpoints"),
            ("Adaptive K (4 -> 16) against a fixed-K reference", "fixed_k",
             "no fixed-K reference in this study (branch ... --k-fixed 32)"),
            ("Horizons relative to task events (first grasp attempt, first drop, first contact with the target)",
             "events", "no trunk recorded its events"),
            ("Expected cost per (checkpoint, intervention), stopping included", "expected_cost",
             "no priced checkpoint (no run records beside the study)")):
        texts = _texts(summary.get(key))
        parts.append(f"<h4>{esc(title)}</h4><ul>" + "".join(f"<li>{esc(t)}</li>" for t in (texts or [empty]))
                     + "</ul>")
    definition = (summary.get("expected_cost") or {}).get("definition")
    if definition:
        parts.append(f"<p class='small'>{esc(definition)}; the cheapest action at each checkpoint is counted.</p>")
    return parts


def branching_sections(run_dir: Path) -> List[str]:
    """The "Counterfactual branching" section: one part per ``RUN_DIR/branching/*/summary.json`` (none: nothing)."""
    studies = sorted(p.parent for p in (Path(run_dir) / "branching").glob("*/summary.json"))
    if not studies:
        return []
    return ["<h2>Counterfactual branching</h2>", *(_branch_study_html(d) for d in studies)]


_MONITOR_FIGURE = re.compile(r"figures/(roc|alarms|fcp|lengths|latent)__[A-Za-z0-9_.\-]+\.png")


def monitor_sections(run_dir: Path) -> List[str]:
    """The "Runtime monitors" section from ``RUN_DIR/monitors/`` (written by ``robocasa-shift monitors``)."""
    folder = Path(run_dir) / "monitors"
    if not os.path.lexists(folder / "summary.json"):
        return []
    parts = ["<h2>Runtime monitors as intervention rules</h2>"]
    try:
        summary = json.loads(read_text(folder / "summary.json", None, MAX_JSON_BYTES, "monitor summary"))
        parts.append(markdown_html(read_text(folder / "summary.md", None, MAX_JSON_BYTES, "monitor summary")))
        figures = summary.get("figures") or []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return parts + [f"<p class='bad'>monitors/summary.json cannot be read ({esc(type(exc).__name__)}: "
                        f"{esc(exc)}); write it again with the monitors command.</p>"]
    parts.append("<p class='small'>A detection metric admits a monitor when its 95% bootstrap interval lies above 0.5; "
                 "decision value admits it when the interval of its excess cost over never intervening lies below 0. "
                 "f* is the break-even false-alarm rate (RESCUE Eq. 9): a realised rate f above it costs more than never "
                 "intervening. Alarm times are compared with when the failures ended.</p>")
    for figure in figures:
        name = str(figure.get("file", ""))
        if _MONITOR_FIGURE.fullmatch(name) and (folder / name).is_file():
            parts.append(f"<figure><img src='{src('../monitors/' + name)}' alt='{esc(figure.get('monitor'))}'>"
                         f"<figcaption>{esc(figure.get('monitor'))}: {esc(figure.get('kind'))}</figcaption></figure>")
    return parts


def judge_sections(run_dir: Path) -> List[str]:
    """The "Success judges" section: the scores of every judge set exported into the run directory
    (``RUN_DIR/<set>/export.json`` beside ``RUN_DIR/<set>/scores/scores.md``, as ``make judge-demo`` leaves
    them); none: nothing. A judge set elsewhere keeps its own ``scores.md``."""
    sets = sorted(p.parent.parent for p in Path(run_dir).glob("*/scores/scores.md")
                  if os.path.lexists(p.parent.parent / "export.json"))
    if not sets:
        return []
    parts = ["<h2>Success judges</h2>"]
    for folder in sets:
        try:
            text = read_text(folder / "scores" / "scores.md", run_dir, MAX_JSON_BYTES, "judge scores")
        except (OSError, ValueError) as exc:
            parts.append(f"<p class='bad'>{esc(folder.name)}/scores/scores.md cannot be read ({esc(type(exc).__name__)}: "
                         f"{esc(exc)}); write it again with score-judge.</p>")
            continue
        first = text.splitlines()[0] if text else ""
        title = f"{folder.name}: {first[2:]}" if first.startswith("# ") else folder.name  # names the set's hash
        parts.append(f"<h3>{esc(title)}</h3>" + markdown_html(text))
    return parts


def _band(values: Any) -> str:
    return "-" if not values else f"[{num(values[0], '.2f')}, {num(values[1], '.2f')}]"


BEHAVIOUR_COLUMNS = (("steps_to_success", "steps to success"), ("path_length_m", "path length (m)"),
                     ("idle_steps", "idle steps"), ("jerk", "jerk"), ("scene_contact_steps", "scene contact steps"),
                     ("object_collision_steps", "object collision steps"), ("drops", "drops"))
STAGE_COLUMNS = (("stage_steps", "steps in stage"), ("stage_contact_steps", "contact steps"), ("stage_drops", "drops"))


def _difference(d: Any) -> str:
    return "-" if not d or d.get("mean") is None else f"{num(d['mean'], '+.3g')} {_band(d.get('interval'))}"


def behaviour_tables(behaviour: Any) -> List[str]:
    """The paired behaviour differences (``analysis/behaviour.py``'s ``paired_differences``): one row per condition,
    then one per condition and stage."""
    rows = [[cond, b["pairs"]] + [_difference(b["metrics"].get(m)) for m, _ in BEHAVIOUR_COLUMNS]
            for cond, b in behaviour.items()]
    stage_rows = [[cond, stage] + [_difference((b.get(key) or {}).get(stage)) for key, _ in STAGE_COLUMNS]
                  for cond, b in behaviour.items() for stage in b.get("stage_steps", {})]
    return [html_table(["condition", "pairs"] + [label for _, label in BEHAVIOUR_COLUMNS], rows),
            html_table(["condition", "stage"] + [label for _, label in STAGE_COLUMNS], stage_rows),
            "<p class='small'>Perturbed minus clean twin, mean over the pairs where both have the metric, with a 95% "
            "t interval. Contact steps: steps with the robot touching the scene or an object it should not hit; a drop: "
            "the held object let go in the air, falling 2 cm or more. A stage's row counts the steps after the previous "
            "subgoal latched up to its own (the first unreached stage: to the rollout's end).</p>"]


def sweep_sections(run_dir: Path) -> List[str]:
    """The "Breaking points" and "Behaviour" sections from ``RUN_DIR/sweep/summary.json`` (none: nothing)."""
    path = Path(run_dir) / "sweep" / "summary.json"
    if not os.path.lexists(path):
        return []
    try:
        summary = json.loads(read_text(path, None, MAX_JSON_BYTES, "sweep summary"))
        curve, spent, med = summary["curve"], summary["cost"], summary["curve"]["median_breaking_point"]
        rows = [[num(p["severity"], "g"), f"{p['surviving']}/{p['n']}", _band(p["pointwise"]), _band(p["simultaneous"])]
                for p in curve["points"]]
        stages: dict = {}
        for e in summary["episodes"]:
            if e.get("broke_at_stage"):
                stages[e["broke_at_stage"]] = stages.get(e["broke_at_stage"], 0) + 1
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return ["<h2>Breaking points</h2>", f"<p class='bad'>sweep/summary.json cannot be read "
                f"({esc(type(exc).__name__)}: {esc(exc)}); write it again with the sweep command.</p>"]
    median = "beyond the maximum" if med["beyond_max"] else num(med["median"], "g")
    parts = [
        "<h2>Breaking points</h2>",
        f"<p>{esc(summary['factor'])} on {esc(summary['task'])} ({esc(summary['mode'])}): {esc(curve['n'])} base "
        f"episodes succeeded clean, {esc(curve['failed_clean'])} already failed clean, {esc(curve['never_broke'])} "
        f"never broke up to the maximum. Median breaking point {esc(median)}, 95% interval "
        f"{esc(_band(med['interval']))}. "
        f"Non-monotone episodes: {esc(curve['non_monotone'] or 'none')}. Broke at stage: "
        f"{esc(', '.join(f'{k} {v}' for k, v in sorted(stages.items())) or '-')}. Successes with a subgoal the "
        f"stage tracker did not latch (the stage spec asks more than the success check; counted as successes): "
        f"{esc(len(summary.get('unlatched_successes') or []))}.</p>",
        html_table(["severity", "still succeeding", "pointwise 95%", "simultaneous 95%"], rows),
        f"<p class='small'>Rollouts {esc(spent['rollouts'])}; the dense grid would take "
        f"{esc(spent['dense_grid_rollouts'])}, the frozen three levels {esc(spent['frozen_levels_rollouts'])}.</p>",
    ]
    conf = summary.get("confirmation")
    if conf:
        parts.append(html_table(["severity", "held-out rate", "curve rate", "difference 95%", "confirmed"],
                                [[num(p["severity"], "g"), num(p["held_out_rate"], ".2f"), num(p["curve_rate"], ".2f"),
                                  _band(p["difference_interval"]),
                                  ("yes", "good") if p["confirmed"] else ("NO", "bad")] for p in conf["points"]]))
    behaviour = summary.get("behaviour")
    if behaviour:
        parts += ["<h2>Behaviour</h2>"] + behaviour_tables(behaviour)
    return parts
