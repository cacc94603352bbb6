"""The control socket's listener in-process (mcplhost/control/server.py): mode, stale sockets, bounds."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import anyio
import pytest

from mcplhost.control import server
from mcplhost.control.client import NoDaemon, ask
from mcplhost.control.server import ControlSocketError, bind_control_socket, serve_control
from mcplhost.control.wire import MAX_REQUEST_BYTES, Answer, Request, RestartRequest, StatusRequest, decode_answer


async def echo_name(request: Request) -> Answer:
    """Answers a restart with the name it was given, a status with ok."""
    if isinstance(request, RestartRequest):
        return Answer(ok=False, error=f"asked for {request.name}")
    return Answer(ok=True)


async def raw_exchange(path: Path, data: bytes) -> bytes:
    async with await anyio.connect_unix(str(path)) as stream:
        await stream.send(data)
        received = b""
        while True:
            try:
                received += await stream.receive()
            except anyio.EndOfStream:
                return received


class TestBinding:
    def test_the_socket_is_0600_before_it_listens(self, tmp_path: Path):
        """The mode is the owner's only, and it is a socket."""
        sock = bind_control_socket(tmp_path / "c.sock")
        try:
            mode = os.stat(tmp_path / "c.sock").st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        finally:
            sock.close()

    def test_a_socket_another_daemon_answers_on_is_left_alone(self, tmp_path: Path):
        """Something listening there: the start is refused, and its socket stays."""
        path = tmp_path / "c.sock"
        other = bind_control_socket(path)
        try:
            with pytest.raises(ControlSocketError, match="another daemon answers on it"):
                bind_control_socket(path)
            assert stat.S_ISSOCK(os.lstat(path).st_mode)
        finally:
            other.close()

    def test_a_file_that_is_not_a_socket_is_never_removed(self, tmp_path: Path):
        """An operator's file at the path refuses the start and is kept as it was."""
        path = tmp_path / "c.sock"
        path.write_text("notes")
        with pytest.raises(ControlSocketError, match="not a socket"):
            bind_control_socket(path)
        assert path.read_text() == "notes"

    def test_a_stale_socket_is_replaced(self, tmp_path: Path):
        """A socket nobody listens on (a killed daemon's) gives way to a new one."""
        path = tmp_path / "c.sock"
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(path))
        stale.close()
        bind_control_socket(path).close()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    async def test_a_path_past_the_socket_address_limit_is_served(self, tmp_path: Path):
        """A deep state directory (sun_path holds ~108 bytes) is reached through its folder's descriptor."""
        folder = tmp_path / ("d" * 60) / ("e" * 60)
        folder.mkdir(parents=True)
        path = folder / "mcplhost.sock"
        async with anyio.create_task_group() as tg:
            await tg.start(serve_control, path, echo_name)
            assert (await ask(path, StatusRequest())).ok
            tg.cancel_scope.cancel()
        assert not path.exists()


class TestClients:
    async def test_requests_are_answered_and_the_socket_is_removed_on_exit(self, tmp_path: Path):
        """One answer per request; cancelling the server removes its socket file."""
        path = tmp_path / "c.sock"
        async with anyio.create_task_group() as tg:
            await tg.start(serve_control, path, echo_name)
            answer = await ask(path, RestartRequest(name="disc"))
            assert answer == Answer(ok=False, error="asked for disc")
            tg.cancel_scope.cancel()
        assert not path.exists()

    async def test_a_request_that_is_not_one_is_answered_with_why(self, tmp_path: Path):
        """An unknown command, junk and an over-long line each get an error answer, not a crash."""
        path = tmp_path / "c.sock"
        async with anyio.create_task_group() as tg:
            await tg.start(serve_control, path, echo_name)
            unknown = decode_answer(await raw_exchange(path, b'{"command": "reboot"}\n'))
            assert not unknown.ok and "not a control request" in (unknown.error or "")
            junk = decode_answer(await raw_exchange(path, b"\xff\xfe{\n"))
            assert not junk.ok
            long = decode_answer(await raw_exchange(path, b"x" * (MAX_REQUEST_BYTES + 10) + b"\n"))
            assert long == Answer(ok=False, error=f"the request is longer than {MAX_REQUEST_BYTES} bytes")
            assert (await ask(path, StatusRequest())).ok  # still serving
            tg.cancel_scope.cancel()

    async def test_a_stuck_client_is_cut_off_and_holds_no_one_else(self, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
        """A client that never asks is closed after the deadline; others are answered meanwhile."""
        monkeypatch.setattr(server, "CLIENT_DEADLINE_S", 0.2)
        path = tmp_path / "c.sock"
        async with anyio.create_task_group() as tg:
            await tg.start(serve_control, path, echo_name)
            async with await anyio.connect_unix(str(path)) as stuck:
                assert (await ask(path, StatusRequest())).ok
                with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
                    await stuck.receive()  # the server's deadline closed it
            tg.cancel_scope.cancel()

    async def test_a_failing_answer_is_an_error_answer_and_the_server_goes_on(self, tmp_path: Path):
        """A bug answering one client reaches that client as an error; the next is served."""
        calls = []

        async def flaky(request: Request) -> Answer:
            calls.append(request)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return Answer(ok=True)

        path = tmp_path / "c.sock"
        async with anyio.create_task_group() as tg:
            await tg.start(serve_control, path, flaky)
            first = await ask(path, StatusRequest())
            assert not first.ok and "internal error" in (first.error or "")
            assert (await ask(path, StatusRequest())).ok
            tg.cancel_scope.cancel()

    async def test_no_daemon_is_said_plainly(self, tmp_path: Path):
        """No file, or a stale socket: NoDaemon naming the path."""
        path = tmp_path / "c.sock"
        with pytest.raises(NoDaemon, match="does not exist"):
            await ask(path, StatusRequest())
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(path))
        stale.close()
        with pytest.raises(NoDaemon, match="no daemon answers"):
            await ask(path, StatusRequest())
