"""Running a study: plan keys, hold a run directory, send rollouts to executors, write records.

``plan`` makes and slices the keys; ``store`` is the run directory (manifest,
plan, records, lock); ``worker`` keeps a process's environments and policies;
``executors`` and ``ray_executor`` decide where rollouts run; ``runner`` is
the API the CLI calls (``run``, ``RunSession``); ``pipeline`` holds the
formal matrix's helpers built on it (the screened suite, dry-run estimates, merging shards).
"""
