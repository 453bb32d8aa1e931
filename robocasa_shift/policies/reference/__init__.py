"""The reference policy: learned perception (torch, CPU) and scripted control."""

from robocasa_shift.errors import WeightsMissing
from robocasa_shift.policies.reference.policy import (
    BlindReferencePolicy,
    ReferencePolicy,
)

__all__ = ["BlindReferencePolicy", "ReferencePolicy", "WeightsMissing"]
