"""Runtime monitors as intervention rules: scores from per-step logs, detection and timing, decision value."""
