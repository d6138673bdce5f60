"""One workbench generation (`generation.Generation`) and what it is made of: the channels to its
worker and when it serves (`channels`, `readiness`), what the worker says and is sent (`traffic`,
`resign`), the link to a worker elsewhere (`link`), its end (`closing`), what and where it runs
(`identity`)."""

from .generation import Generation

__all__ = ["Generation"]
