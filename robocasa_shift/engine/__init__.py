"""The pairing engine: rollout keys and records, the StageTracker, factor kinds, the rollout loop.

Everything here acts on one live environment and one policy; nothing here knows
about run directories, executors or statistics.
"""
