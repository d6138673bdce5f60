"""The `klbr` comm the JupyterLab extension talks to (docs/comm-protocol.md), answered by the proxy
itself: its requests (`ops`), their answers (`comms`), the cells a page follows (`follow`), and a
page's recorded cells cut into chunks (`restore`)."""
