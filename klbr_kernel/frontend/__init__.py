"""The frontend's side: its five sockets bound from the connection file, the stand-in that answers
before the proxy is up, what every message must be to get in (`door`), iopub's outbox, CurveZMQ."""
