"""Host callbacks: cell code asks its supervisor (see `klbr_kernel.host` for the client)."""

from .service import HostService

__all__ = ["HostService"]
