"""Policies. Built-ins are registered lazily so that importing the package needs no torch."""

from __future__ import annotations

from typing import Any

from ..registry import Registry
from .base import Observation, Policy

POLICIES: Registry[type] = Registry("policy", "robocasa_shift.policies")
POLICIES.register("expert", "robocasa_shift.policies.scripted:ExpertPolicy")
POLICIES.register("random", "robocasa_shift.policies.scripted:RandomPolicy")
POLICIES.register("replay", "robocasa_shift.policies.replay:ReplayPolicy")
POLICIES.register("reference", "robocasa_shift.policies.reference:ReferencePolicy")
POLICIES.register("reference-blind", "robocasa_shift.policies.reference:BlindReferencePolicy")
POLICIES.register("gr00t", "robocasa_shift.policies.gr00t:Gr00tPolicy")
POLICIES.register("openpi", "robocasa_shift.policies.openpi:OpenpiPolicy")
POLICIES.register("lerobot", "robocasa_shift.policies.lerobot:LeRobotPolicy")


def make_policy(name: str, **options: Any) -> Policy:
    """An instance of the policy registered under ``name``."""
    return POLICIES.get(name)(**options)


__all__ = ["POLICIES", "Observation", "Policy", "make_policy"]
