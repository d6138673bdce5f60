"""The proxy: its parts built and wired (`proxy.Proxy`, which keeps the error boundary), and what
each does with a message: from the frontend (`dispatch`), to and from the worker (`delivery`),
answered by the proxy itself (`own`, `brackets`, `resends`, `magic_cells`), when a generation
ends (`endings`), interrupt and shutdown (`lifecycle`), input() (`stdin`)."""

from .proxy import Proxy

__all__ = ["Proxy"]
