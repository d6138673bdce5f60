"""A request as the proxy tracks it, and the state the proxy's parts share: the request and its
phases (`request`, `states`), the errors it can end with (`outcomes`), the shell queue (`queue`),
the current generation as the proxy sees it (`current`). No I/O: the parts that act on them are
`klbr_kernel.proxy`'s."""
