"""A request's life in the proxy: its state machine, the shell queue, dispatch from the frontend,
delivery to and from the worker, the proxy's own answers, what follows a generation's end."""
