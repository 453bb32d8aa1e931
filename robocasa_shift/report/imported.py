"""The report of an imported run (``import-results``): where the results came from, first.

No video and no audit: the harness did not run these rollouts, so it can neither replay nor check
them; the page says so on its first line and shows what the statistics can say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping

from robocasa_shift.analysis.imported import summarize
from robocasa_shift.importing.writer import frame_of
from robocasa_shift.report.html import CSS, ci, esc, html_table, num
from robocasa_shift.rundir.files import atomic_write_json, atomic_write_text, confined
from robocasa_shift.rundir.store import RunStore


def _grid_html(grid: List[Mapping[str, Any]]) -> str:
    levels = sorted({k for row in grid for k in row if k != "dimension"}, key=lambda k: int(k[1:]))
    rows = []
    for row in grid:
        cells = [row["dimension"]]
        for level in levels:
            cell = row.get(level)
            cells.append("-" if cell is None else f"{num(cell['sr'], '.2f')} {ci(cell['ci95'])} n={cell['n']} "
                                                  f"{cell['verdict'] or '-'} ({cell['pairing'].lower()})")
        rows.append(cells)
    return "<div class='scroll'>" + html_table(["dimension", *levels], rows) + "</div>"


def build_imported_report(run_dir: Path | str, min_effect: float = 0.10) -> Path:
    """Write ``run_dir/report/index.html`` for an imported run; refresh ``analysis/imported.json``."""
    run_dir = Path(run_dir)
    with confined(run_dir):
        store = RunStore(run_dir)
        info: Dict[str, Any] = (store.manifest() or {})["imported"]
        summary = summarize(frame_of(store.records()), min_effect=min_effect)
        summary["imported"] = info
        atomic_write_json(run_dir / "analysis" / "imported.json", summary, run_dir)
        parts = [
            f"<p class='note'><b>Imported from {esc(info.get('format'))} results in {esc(info.get('source_file'))} "
            f"(SHA-256 {esc(str(info.get('source_sha256'))[:16])}...): the harness did not run these rollouts.</b> "
            f"Read with {esc(info.get('reader'))}. Unknown to the source: {esc('; '.join(info.get('unknown', [])))}.</p>",
            f"<h1>robocasa-shift report (imported): {esc(run_dir.name)}</h1>",
            f"<p>{esc(info.get('episodes'))} episodes. Across runs: {esc(info.get('cross_run_pairing'))}.</p>",
        ]
        if info.get("instruction_leaks"):
            parts.append(f"<p class='bad'>{esc(info['instruction_leaks'])} instruction(s) carry their variant's id: "
                         f"the policy was told which perturbation it faced (analysis/imported.json).</p>")
        parts.append("<h2>Success by dimension and difficulty</h2>")
        parts.append(_grid_html(summary["grid"]))
        rows = []
        for cond, entry in summary["conditions"].items():
            rate, paired, unpaired = entry["rate"], entry.get("paired"), entry.get("unpaired") or {}
            rows.append([cond, rate["n"], rate["tasks"], num(rate["sr"], ".3f"), ci(rate["ci95"]),
                         num(paired["dsr"]) if paired else num(unpaired.get("dsr")),
                         ci(paired["dsr_ci95_calibrated"]) if paired else ci(unpaired.get("ci95")),
                         "PAIRED" if paired else ("UNPAIRED" if cond != "clean" else ""),
                         (paired or unpaired).get("verdict") or "-",
                         "; ".join(f"{k} ({n})" for k, n in (entry.get("unpaired_reasons") or {}).items())])
        parts.append("<h2>Conditions</h2>")
        parts.append("<div class='scroll'>" + html_table(
            ["condition", "n", "base tasks", "SR", "95% CI (task-clustered)", "dSR", "95% CI", "pairing", "verdict",
             "why unpaired"], rows) + "</div>")
        methods = summary["methods"]
        parts.append("<h2>Methods</h2><ul>" + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in methods.items())
                     + "</ul>")
        page = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
                f"<title>robocasa-shift report (imported): {esc(run_dir.name)}</title><style>{CSS}</style></head>"
                f"<body>{''.join(parts)}</body></html>")
        out = run_dir / "report" / "index.html"
        atomic_write_text(out, page, run_dir)
    return out
