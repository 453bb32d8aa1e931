"""Running a study: plan keys, hold a run directory, send rollouts to executors, write records.

``runner`` is the API the CLI calls (``run``); ``pipeline`` the protocol steps
built on it (screening, the formal matrix, merging shards); ``store`` the run
directory; ``executors`` and ``ray_executor`` where rollouts run.
"""
