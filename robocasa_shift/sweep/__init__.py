"""Paired severity sweeps: where each base episode breaks along its factor's frozen direction.

``spec`` derives a protocol whose factor has one level per grid severity (the frozen draw shared by all of
them), ``search`` chooses which levels each base episode runs (bisection or the whole grid), ``curve`` turns the
breaking points into a survival curve with bands, and ``study`` runs it all through the normal rollout engine.
"""
