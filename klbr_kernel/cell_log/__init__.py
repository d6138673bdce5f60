"""The cell log's kernel side: each cell recorded (`recording`, the proxy's only door to the store)
and its outputs published again (`replay`); the store itself is `klbr_supervisor.store`."""
