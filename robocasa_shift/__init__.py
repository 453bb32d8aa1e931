"""robocasa-shift: paired, stage-aware robustness evaluation of robot manipulation policies.

The API the CLI calls; heavy modules (simulators, torch) load only when used.
"""

__version__ = "0.1.0"

from .analysis import analyze, write_analysis  # noqa: E402
from .specs import load_protocol, load_stage_spec  # noqa: E402
from .study import parse_episodes, plan_keys, run  # noqa: E402

__all__ = ["__version__", "analyze", "write_analysis", "load_protocol", "load_stage_spec", "parse_episodes", "plan_keys", "run"]
