"""Counterfactual branching: where a failed rollout could still have been saved, and by what.

A *trunk* is a recorded rollout re-run from its key with snapshots switched on:
at every action-chunk boundary the complete state a continuation depends on
(simulator, controllers, task counters, StageTracker latches, the policy's
generators and internal state) is written beside the run. A *checkpoint* is
one such boundary; a *branch* restores it (in another process, possibly on
another machine), applies an *intervention* (``continue``, ``recover``, or a
user's own) under seeded execution noise, and runs to the end of the budget.

Modules:

- ``snapshot``: the snapshot file format (``.npz``, never pickled).
- ``interventions``: the repertoire, a registry with the entry-point group
  ``robocasa_shift.interventions``; ``recover`` reads its frozen, hashed spec
  from ``interventions/recover.yaml``.
- ``checkpoints``: recording a trunk, restoring a checkpoint, replay fidelity, branches.
- ``study``: selection, planning, jobs on the executors, the branch store, resume.
- ``events``: a trunk's task events, through the Env contract.

The estimator (the lower Jeffreys posterior quantile, the expansion rule, the recoverability horizon) is
``analysis/recoverability.py``.

On disk, under ``RUN_DIR/branching/<name>/``::

    manifest.json        the branch settings (interventions and their spec hashes, K, expansion,
                         q, tau, noise, budget, stride, selection) and the run's spec hash
    trunks/<phase>/<task>/<episode>__<condition>__r<replicate>.npz    snapshots (see snapshot.py)
    trunks/<phase>/<task>/<episode>__<condition>__r<replicate>.json   the trunk's verdict:
        phase, task, episode, condition, replicate; selection ("shift_failure", "clean_failure",
        "requested"); clean_success (the clean twin's outcome, or null); reproduced (the re-run equals
        the stored record: fingerprints, stage steps, outcome) and mismatch (why not, or null);
        success, steps, horizon, stage_names, stage_steps, first_incomplete; chunk_steps (every
        snapshotted boundary), checkpoint_steps (the ones branched, after the stride);
        snapshot_sha256 (of the .npz file); valid, error, error_kind; wall_s
    checkpoints/<phase>/<task>/<episode>__<condition>__r<replicate>/s<step:04d>.json  one checkpoint:
        the trunk key's five fields; step (control steps before the boundary); snapshot_sha256 (of
        that checkpoint's arrays); valid, error, error_kind; fidelity {ok, max_qpos_dev,
        max_state_dev, same_stages, same_outcome, success, steps, stage_steps}; zero_noise (the same
        fields, for one continue branch at sigma 0 through the branch code path; null unless fidelity
        ok); branched (fidelity ok); interventions {name: {k, n, expanded, estimate, script_steps, branches: [{index, seed,
        success, steps, stage_steps, first_incomplete, valid, error}]}}; wall_s
    summary.json, report figures    written by ``robocasa-shift branch`` after the units ran
"""
