"""CurveZMQ on the frontend's five sockets, when the connection file asks for it.

jupyter_client (8.9 and later, `KernelManager.transport_encryption`) writes a server keypair into a
kernel's connection file, `curve_publickey` and `curve_secretkey` (Z85 text), when the kernelspec
lists "curve" in `metadata.supported_encryption` (`install.kernel_json` does, where pyzmq has CURVE).
Its clients connect with that public key as the server's. With the keys, every frontend socket
(shell, control, stdin, iopub and the heartbeat) is a CURVE server: a client that does not speak
CURVE with that server key fails the handshake, and libzmq closes its connection before a single
message reaches the kernel. Without them the sockets are plaintext, as jupyter_client's default is.
The keys only ever come from the connection file (readable by its owner only), never from argv.

The link to the workers (`klbr_supervisor`) is not touched: ipc sockets in a 0700 directory, or
forwarded through ssh, signed with keys of their own.

Standard library and pyzmq only: the stand-in (`standin.bind`) imports it.
"""

from __future__ import annotations

from typing import Any

import zmq

KEYS = ("curve_publickey", "curve_secretkey")


def _given(info: dict[str, Any], name: str) -> bool:
    return info.get(name) not in (None, "")


def problem(info: dict[str, Any]) -> str | None:
    """Why the connection file's curve keys cannot be served, or None (also when it has none).

    Called by the app before anything is bound (and by the stand-in, which then binds nothing);
    a file that asks for encryption the kernel cannot give is refused, never served in plaintext."""
    given = [name for name in KEYS if _given(info, name)]
    if not given:
        return None
    if len(given) == 1:
        missing = next(name for name in KEYS if name not in given)
        return f"it carries {given[0]} but no {missing}: CurveZMQ needs both"
    if not zmq.has("curve"):
        return ("it asks for CurveZMQ transport encryption (curve_publickey, curve_secretkey), and this "
                f"pyzmq's libzmq {zmq.zmq_version()} was built without CURVE")
    public, secret = (info[name] for name in KEYS)
    if not isinstance(public, str) or not isinstance(secret, str):
        return "its curve keys are not Z85 text"
    try:
        derived = zmq.curve_public(secret.encode())
    except (ValueError, zmq.ZMQError):
        return "its curve_secretkey is not a Z85-encoded CurveZMQ key (40 characters)"
    if derived != public.encode():
        return "its curve_publickey is not the public key of its curve_secretkey"
    return None


def keys(info: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """The server's (public, secret) key in the connection file, or None: plaintext. Only for a
    file `problem` found nothing wrong with."""
    if not all(_given(info, name) for name in KEYS):
        return None
    return info["curve_publickey"].encode(), info["curve_secretkey"].encode()


def serve(sock: zmq.Socket[bytes], server_keys: tuple[bytes, bytes] | None) -> None:
    """Make `sock` a CURVE server with `server_keys` (nothing for None). Before its bind: libzmq
    copies a socket's options into each listener when it is bound."""
    if server_keys is None:
        return
    sock.curve_publickey, sock.curve_secretkey = server_keys
    sock.curve_server = True


def status(server_keys: tuple[bytes, bytes] | None) -> str:
    """`%klbr status`'s line about the frontend link."""
    if server_keys is None:
        return "no: plaintext (the connection file has no curve keys)"
    return "yes, CurveZMQ on shell, control, stdin, iopub and heartbeat"
