"""The control socket's listener: a Unix socket (never TCP), mode 0600, one bounded task per client.

    await tg.start(serve_control, control_socket_path(config), service.answer)

- The socket is bound, made 0600, and only then listens: no client can
  connect before the mode is the owner's only.
- A socket file already at the path is a killed daemon's when nothing
  answers on it: it is replaced. One that answers is another daemon's, and
  anything that is not a socket is the operator's: both refuse the start
  (`ControlSocketError`), and nothing is removed.
- Each client gets its own task and `CLIENT_DEADLINE_S` for its whole
  exchange; at most `MAX_CLIENTS` at once (one more is closed at once), so a
  stuck or flooding client never holds the daemon.
- Every answer line passes `redact` as it is written (the host's secret
  values: docs/agents.md#secrets), whatever the answer holds.
- On exit the socket file is removed, if it is still the one bound here.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from mcplhost.errors import OperatorError

from .address import socket_address
from .wire import MAX_REQUEST_BYTES, Answer, Request, WireError, decode_request, encode

log = structlog.get_logger()

#: How long one client may take for its whole exchange (request in, answer out).
CLIENT_DEADLINE_S = 5.0
#: Clients served at once; the socket is the owner's, so this only stops a runaway script.
MAX_CLIENTS = 16
#: The socket's mode: its owner (the daemon's user) only.
SOCKET_MODE = 0o600
#: How long the stale-socket probe waits for a connection (a local socket answers at once or never).
PROBE_TIMEOUT_S = 1.0
#: Pending connections the kernel holds for us.
BACKLOG = 64


class ControlSocketError(OperatorError):
    """The control socket cannot be served at its path; the text says why and what to do."""


def _answering(address: str) -> bool:
    """Whether something accepts connections on the socket at `address`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(address)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        return True  # it is there and not refusing (busy, or timed out): not ours to remove
    else:
        return True
    finally:
        probe.close()


def refuse_taken_socket(path: Path) -> bool:
    """Raise ControlSocketError when `path` is another daemon's socket or not a socket; else whether a stale
    socket (a killed daemon's) is there. `run` asks before it creates anything, and again as it binds."""
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(existing.st_mode):
        raise ControlSocketError(f"control socket {path}: the path exists and is not a socket",
                                 "move that file away, or set [control] socket to another path")
    with socket_address(path) as address:
        if _answering(address):
            raise ControlSocketError(f"control socket {path}: another daemon answers on it",
                                     "stop the other daemon, or give this one its own [control] socket")
    return True


def bind_control_socket(path: Path) -> socket.socket:
    """A listening socket at `path`, mode 0600 before it listens; a stale one replaced (module docstring)."""
    with socket_address(path) as address:
        if refuse_taken_socket(path):
            os.unlink(path)  # a killed daemon's: nothing answers on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address)
            os.chmod(path, SOCKET_MODE)  # before listen: until then no client can connect
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            raise ControlSocketError(f"control socket {path}: cannot listen: {exc.strerror or exc}",
                                     "check that its folder exists and is writable, or set [control] socket") from exc
    sock.setblocking(False)
    return sock


async def serve_control(path: Path, answer: Callable[[Request], Awaitable[Answer]], *,
                        redact: Callable[[bytes], bytes] | None = None,
                        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve the control socket at `path` until cancelled; started once it listens. `redact`: applied to each
    answer line."""
    sock = bind_control_socket(path)
    bound = os.stat(path)
    try:
        listener = await SocketListener.from_socket(sock)
        log.info("control.listening", socket=str(path))
        task_status.started()
        active = 0

        async def client(stream: SocketStream) -> None:
            nonlocal active
            try:
                await serve_client(stream, answer, redact)
            finally:
                active -= 1

        async with listener, anyio.create_task_group() as clients:
            while True:
                stream = await listener.accept()
                if active >= MAX_CLIENTS:
                    await stream.aclose()
                    continue
                active += 1
                clients.start_soon(client, stream)
    finally:
        sock.close()
        _remove_if_ours(path, bound)


def _remove_if_ours(path: Path, bound: os.stat_result) -> None:
    try:
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
            os.unlink(path)
    except FileNotFoundError:
        pass


async def serve_client(stream: SocketStream, answer: Callable[[Request], Awaitable[Answer]],
                       redact: Callable[[bytes], bytes] | None = None) -> None:
    """One exchange: a request line in, one answer line out, within CLIENT_DEADLINE_S; then close."""
    with anyio.move_on_after(CLIENT_DEADLINE_S):
        async with stream:
            try:
                line = await BufferedByteReceiveStream(stream).receive_until(b"\n", MAX_REQUEST_BYTES)
            except anyio.DelimiterNotFound:
                line = None
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                return  # the client left before asking
            if line is None or len(line) > MAX_REQUEST_BYTES:  # a line ending in the chunk read may still be past it
                reply = Answer(ok=False, error=f"the request is longer than {MAX_REQUEST_BYTES} bytes")
            else:
                try:
                    reply = await answer(decode_request(line))
                except WireError as exc:
                    reply = Answer(ok=False, error=str(exc))
                except Exception:  # the boundary: a bug answering one client must not end the daemon
                    log.error("control.answer_failed", exc_info=True)
                    reply = Answer(ok=False, error="internal error in the daemon (its log has the traceback)")
            try:
                line = encode(reply)
                await stream.send(line if redact is None else redact(line))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the client left before the answer
