"""The reference policy: learned perception (torch, CPU) and scripted control."""

from .policy import BlindReferencePolicy, ReferencePolicy, WeightsMissing

__all__ = ["BlindReferencePolicy", "ReferencePolicy", "WeightsMissing"]
