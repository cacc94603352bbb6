"""A server that speaks just enough of PostgreSQL's protocol to refuse a password, for the wrong-password test.

    with refusing_server() as port:
        url = f"postgresql://mcplhost:wrong-password@127.0.0.1:{port}/mcplhost"

The tests' real server (tests/postgres.py) trusts every local connection, so
it cannot refuse a password. This one answers a client's SSL request with
"no", asks for the password in clear text, reads it, and answers with the
error PostgreSQL sends for a wrong one (SQLSTATE 28P01), then closes: what
the driver sees is byte for byte what a real server's refusal looks like
(protocol 3.0, https://www.postgresql.org/docs/current/protocol-flow.html).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The code of an SSLRequest (and of a GSSENCRequest) in place of a protocol version.
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
#: AuthenticationCleartextPassword.
CLEARTEXT = 3
#: How long the server waits for a client's next message before giving up on it.
CLIENT_TIMEOUT_S = 10.0


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def _error(code: str, message: str) -> bytes:
    fields = b"".join(kind + text.encode() + b"\0" for kind, text in
                      ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message)))
    body = fields + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


def _serve(conn: socket.socket) -> None:
    conn.settimeout(CLIENT_TIMEOUT_S)
    while True:  # the startup packet, after any SSL or GSS request declined
        (length,) = struct.unpack("!I", _read_exactly(conn, 4))
        body = _read_exactly(conn, length - 4)
        (code,) = struct.unpack("!I", body[:4])
        if code in (SSL_REQUEST, GSSENC_REQUEST):
            conn.sendall(b"N")
            continue
        break
    parameters = body[4:].split(b"\0")
    user = dict(zip(parameters[::2], parameters[1::2], strict=False)).get(b"user", b"?").decode()
    conn.sendall(b"R" + struct.pack("!II", 8, CLEARTEXT))
    kind = _read_exactly(conn, 1)
    (length,) = struct.unpack("!I", _read_exactly(conn, 4))
    _read_exactly(conn, length - 4)
    assert kind == b"p", kind
    conn.sendall(_error("28P01", f'password authentication failed for user "{user}"'))


@contextmanager
def refusing_server() -> Iterator[int]:
    """A loopback port whose server refuses every password, each connection in a thread of its own."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    _serve(conn)
                except (OSError, ConnectionError, AssertionError):
                    pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
        except OSError:
            pass
        listener.close()
        thread.join(timeout=5)
