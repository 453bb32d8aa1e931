"""The reference policy: learned perception (torch, CPU) and scripted control."""

from .policy import ReferencePolicy, WeightsMissing

__all__ = ["ReferencePolicy", "WeightsMissing"]
