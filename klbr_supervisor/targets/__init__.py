"""Where generations run: the placement kinds (the `base` class declares the seam), one module each, and the `factory`."""
from .base import Given, LaunchError, Target
from .factory import check, kind_for, problem, target_for

__all__ = ["Given", "LaunchError", "Target", "check", "kind_for", "problem", "target_for"]
