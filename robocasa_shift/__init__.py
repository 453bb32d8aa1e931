"""robocasa-shift: paired, stage-aware robustness evaluation of robot manipulation policies.

The Python API the CLI calls, so a notebook can drive a study too::

    import robocasa_shift as rs
    rs.run_study("runs/x", ["Lift"], ["clean", "camera:L2"], range(5), policy="reference")
    summary = rs.analyze(rs.records_frame("runs/x"))

Simulator, torch and plotting imports happen only when a function needs them.
"""

from importlib import import_module

__version__ = "0.1.0"

_API = {
    "load_protocol": "robocasa_shift.specs:load_protocol",
    "load_stage_spec": "robocasa_shift.specs:load_stage_spec",
    "parse_episodes": "robocasa_shift.study.runner:parse_episodes",
    "plan_keys": "robocasa_shift.study.runner:plan_keys",
    "run_study": "robocasa_shift.study.runner:run",
    "Execution": "robocasa_shift.study.runner:Execution",
    "screen": "robocasa_shift.study.pipeline:screen",
    "merge": "robocasa_shift.study.pipeline:merge",
    "calibrate": "robocasa_shift.checks.calibration:calibrate",
    "validate_stages": "robocasa_shift.checks.validation:validate_stages",
    "validate_pairing": "robocasa_shift.checks.validation:validate_pairing",
    "records_frame": "robocasa_shift.analysis.export:records_frame",
    "analyze": "robocasa_shift.analysis.measures:analyze",
    "write_analysis": "robocasa_shift.analysis.measures:write_analysis",
    "audit_run": "robocasa_shift.checks.audit:audit_run",
    "compare_runs": "robocasa_shift.analysis.compare:compare_runs",
    "build_report": "robocasa_shift.analysis.report:build_report",
}


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'robocasa_shift' has no attribute '{name}'")
    module, attr = _API[name].split(":")
    return getattr(import_module(module), attr)


__all__ = ["__version__", *_API]
