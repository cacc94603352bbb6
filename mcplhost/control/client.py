"""What `mcplhost status` and `restart-connector` use: one request over the control socket, one answer."""

from __future__ import annotations

from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from .address import socket_address
from .wire import MAX_ANSWER_BYTES, Answer, Request, WireError, decode_answer, encode

#: How long the command waits for the daemon's answer (the daemon gives each client 5 s).
ANSWER_TIMEOUT_S = 10.0


class NoDaemon(Exception):
    """No daemon answers on the control socket; the text says what was found."""


async def ask(path: Path, request: Request, *, timeout: float = ANSWER_TIMEOUT_S) -> Answer:
    """Send `request` to the daemon serving `path`; its answer. NoDaemon when none answers."""
    with socket_address(path) as address:
        try:
            stream = await anyio.connect_unix(address)
        except FileNotFoundError:
            raise NoDaemon(f"no daemon is running: {path} does not exist") from None
        except ConnectionRefusedError:
            raise NoDaemon(f"no daemon answers on {path} (a stale socket: it is replaced at the next start)") from None
        except OSError as exc:
            raise NoDaemon(f"cannot reach the daemon on {path}: {exc.strerror or exc}") from None
    try:
        async with stream:
            with anyio.fail_after(timeout):
                await stream.send(encode(request))
                line = await BufferedByteReceiveStream(stream).receive_until(b"\n", MAX_ANSWER_BYTES)
    except TimeoutError:
        raise NoDaemon(f"the daemon on {path} did not answer within {timeout:g} s") from None
    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
        raise NoDaemon(f"the daemon on {path} closed the connection without an answer") from None
    except anyio.DelimiterNotFound:
        raise NoDaemon(f"the daemon on {path} sent an answer longer than {MAX_ANSWER_BYTES} bytes") from None
    if len(line) > MAX_ANSWER_BYTES:  # found in the last chunk read, past the bound all the same
        raise NoDaemon(f"the daemon on {path} sent an answer longer than {MAX_ANSWER_BYTES} bytes")
    try:
        return decode_answer(line)
    except WireError as exc:
        raise NoDaemon(str(exc)) from None
