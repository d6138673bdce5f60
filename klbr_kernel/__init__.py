"""klbr: a Jupyter kernel that never leaves its frontend hanging and never forgets a cell."""

from ._version import __version__

__all__ = ["__version__"]
