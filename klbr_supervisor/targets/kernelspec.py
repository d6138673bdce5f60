"""``kernelspec:NAME`` with jupyter_client's own provisioner: any installed kernelspec, run here.

Its command runs behind `boot.deathsig`. It may be any kernel, of any language, so it never learns
the frontend's key: a fresh one per generation, re-signed both ways, its link watched, and a minimal
environment. A kernelspec that names another provisioner is `provisioned`'s.
"""

from __future__ import annotations

import asyncio
from typing import Unpack

from jupyter_client.kernelspec import KernelSpecManager

from ..boot.placement import Placement, PlacementError
from .base import NO_ENGINES, Engines, SshCommand, TargetArgs
from .managed import ManagedTarget


class KernelspecTarget(ManagedTarget):
    def __init__(self, placement: Placement, **kwargs: Unpack[TargetArgs]):
        super().__init__(placement, **kwargs)
        self.kernel_name = placement.target

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        """The kernelspec is installed (what it runs is its own business: its launch says)."""
        names = await asyncio.to_thread(KernelSpecManager().find_kernel_specs)
        if placement.target not in names:
            known = ", ".join(sorted(names)) or "none"
            message = f"{placement}: no kernelspec named {placement.target!r} is installed (installed: {known})"
            raise PlacementError(message)
