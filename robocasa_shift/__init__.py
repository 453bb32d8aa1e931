"""robocasa-shift: paired, stage-aware robustness evaluation of robot manipulation policies.

The Python API the CLI calls, so a notebook can drive a study too::

    import robocasa_shift as rs
    study = rs.StudyConfig(policy="reference")          # what is studied
    execution = rs.ExecutionConfig(workers=2)           # how it is executed
    rs.run("runs/x", ["Lift"], ["clean", "camera:L2"], range(5), study, execution)
    summary = rs.analyze(rs.records_frame("runs/x"))

Simulator, torch and plotting imports happen only when a function needs them.
"""

from importlib import import_module

__version__ = "0.4.0"

_API = {
    "load_protocol": "robocasa_shift.core.specs:load_protocol",
    "load_stage_spec": "robocasa_shift.core.specs:load_stage_spec",
    "StudyConfig": "robocasa_shift.config:StudyConfig",
    "ExecutionConfig": "robocasa_shift.config:ExecutionConfig",
    "Execution": "robocasa_shift.config:ExecutionConfig",  # the former name, kept as an alias
    "parse_episodes": "robocasa_shift.study.plan:parse_episodes",
    "plan_keys": "robocasa_shift.study.plan:plan_keys",
    "run": "robocasa_shift.study.runner:run",
    "run_study": "robocasa_shift.study.runner:run",
    "screen": "robocasa_shift.checks.screening:screen",
    "merge": "robocasa_shift.study.pipeline:merge",
    "calibrate": "robocasa_shift.checks.calibration:calibrate",
    "validate_stages": "robocasa_shift.checks.validation:validate_stages",
    "validate_pairing": "robocasa_shift.checks.validation:validate_pairing",
    "records_frame": "robocasa_shift.analysis.export:records_frame",
    "analyze": "robocasa_shift.analysis.measures:analyze",
    "write_analysis": "robocasa_shift.analysis.measures:write_analysis",
    "audit_run": "robocasa_shift.checks.audit:audit_run",
    "compare_runs": "robocasa_shift.analysis.compare:compare_runs",
    "compare_many": "robocasa_shift.analysis.compare:compare_many",
    "build_report": "robocasa_shift.report.page:build_report",
}


def __getattr__(name: str):
    """Import the API's names on first use (``robocasa_shift.run_study`` imports the runner then)."""
    if name not in _API:
        raise AttributeError(f"module 'robocasa_shift' has no attribute '{name}'")
    module, attr = _API[name].split(":")
    return getattr(import_module(module), attr)


__all__ = ["__version__", *_API]
