"""The contracts every other layer builds on, and the frozen data they are checked against.

Conditions, the frozen specs (protocol, factor levels, stage specs, pools), factor kinds, rollout
keys and records, the StageTracker and its predicates, the backend and policy contracts, and the
file formats of demonstrations and step logs. Nothing here imports a simulator, a model or a run
directory's writer.
"""
