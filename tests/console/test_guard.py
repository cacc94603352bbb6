"""What every console request passes first (mcplhost/console/guard.py), driven as ASGI with no server.

Each test hands the guard one request (scope and body messages) around a
small app, and reads what would have gone to the client.
"""

from __future__ import annotations

from typing import Any

import anyio
from structlog.testing import capture_logs

from mcplhost.console.access import COOKIE, Gate
from mcplhost.console.guard import MAX_BODY_BYTES, Guard

from .support import header_problems

TOKEN = "f00dfeedcafe1234f00dfeedcafe1234"


def scope(path: str = "/", method: str = "GET", headers: dict[str, str] | None = None) -> dict[str, Any]:
    given = {"host": "127.0.0.1:8787", **(headers or {})}
    return {"type": "http", "method": method, "path": path, "query_string": b"", "scheme": "http",
            "headers": [(k.encode(), v.encode()) for k, v in given.items()]}


async def exchange(guard: Guard, request: dict[str, Any], *chunks: bytes) -> tuple[int, dict[str, str], bytes]:
    """Run one request through `guard`; the status, headers and body sent."""
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks or [b""])]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await guard(request, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that answers 200 with the body it was given."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-frame-options", b"SAMEORIGIN")]})
    await send({"type": "http.response.body", "body": body})


class TestBounds:
    async def test_a_body_past_the_cap_is_refused_by_its_length_or_as_it_arrives(self) -> None:
        """413 for a Content-Length over the cap, and for a chunked body that grows past it; a small one passes."""
        guard = Guard(echo, Gate(None), loopback=True)
        big = str(MAX_BODY_BYTES + 1)
        assert (await exchange(guard, scope("/x", "POST", {"content-length": big})))[0] == 413
        chunks = [b"a" * 4096] * (MAX_BODY_BYTES // 4096 + 2)
        assert (await exchange(guard, scope("/x", "POST"), *chunks))[0] == 413
        assert await exchange(guard, scope("/x", "POST"), b"csrf=1", b"&x=2") == (
            200, (await exchange(guard, scope("/x", "POST"), b"csrf=1&x=2"))[1], b"csrf=1&x=2")

    async def test_past_the_cap_on_requests_in_flight_one_more_is_503(self) -> None:
        """With every slot busy, the next request is answered 503 at once; a slot freed serves again."""
        release = anyio.Event()
        entered = anyio.Event()

        async def stuck(scope: Any, receive: Any, send: Any) -> None:
            entered.set()
            await release.wait()
            await echo(scope, receive, send)

        guard = Guard(stuck, Gate(None), loopback=True, max_requests=1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(exchange, guard, scope())
            await entered.wait()
            assert (await exchange(guard, scope()))[0] == 503
            release.set()
        assert (await exchange(guard, scope()))[0] == 200

    async def test_a_page_past_its_time_bound_is_503(self) -> None:
        """A page that has not started its answer within the bound gets 503, logged once."""
        async def slow(scope: Any, receive: Any, send: Any) -> None:
            await anyio.sleep_forever()

        with capture_logs() as logs:
            status, _, _ = await exchange(Guard(slow, Gate(None), loopback=True, timeout_s=0.05), scope())
        assert status == 503
        assert [e["event"] for e in logs] == ["console.request_timeout"]

    async def test_a_page_s_exception_is_its_500_and_one_log_line(self) -> None:
        async def broken(scope: Any, receive: Any, send: Any) -> None:
            raise RuntimeError("a bug")

        with capture_logs() as logs:
            status, _, _ = await exchange(Guard(broken, Gate(None), loopback=True), scope())
        assert status == 500
        assert [e["event"] for e in logs] == ["console.request_failed"]


class TestHeaders:
    def test_the_server_puts_them_on_every_response_it_writes(self) -> None:
        """Hypercorn's headers for any response (the app's and its own errors) include the security headers."""
        from mcplhost.console.server import server_config

        headers = {k.decode(): v.decode() for k, v in server_config(0).response_headers("h11")}
        assert not header_problems(headers), headers

    async def test_a_page_cannot_weaken_or_double_them(self) -> None:
        """A page's own X-Frame-Options is removed; a page is never cached, a static file may be."""
        _, headers, _ = await exchange(Guard(echo, Gate(None), loopback=True), scope("/x"))
        assert "x-frame-options" not in headers and headers["cache-control"] == "no-store"
        _, headers, _ = await exchange(Guard(echo, Gate(None), loopback=True), scope("/static/x.css"))
        assert "x-frame-options" not in headers and "cache-control" not in headers


class TestWall:
    async def test_a_loopback_console_answers_only_a_loopback_host(self) -> None:
        """A page of another site whose name resolves to 127.0.0.1 is refused (421); localhost and [::1] pass."""
        guard = Guard(echo, Gate(None), loopback=True)
        assert (await exchange(guard, scope(headers={"host": "attacker.example:8787"})))[0] == 421
        for host in ("localhost:8787", "[::1]:8787", "127.0.0.1"):
            assert (await exchange(guard, scope(headers={"host": host})))[0] == 200, host

    async def test_without_a_session_only_the_sign_in_and_static_files_are_served(self) -> None:
        """A page redirects to /signin, a stream or a POST is 403; a session lets everything through."""
        gate = Gate(TOKEN)
        guard = Guard(echo, gate, loopback=False)
        status, headers, _ = await exchange(guard, scope("/items/1"))
        assert (status, headers["location"]) == (303, "/signin")
        assert (await exchange(guard, scope("/feed/events")))[0] == 403
        assert (await exchange(guard, scope("/connectors/x/restart", "POST")))[0] == 403
        assert (await exchange(guard, scope("/signin")))[0] == 200
        assert (await exchange(guard, scope("/static/console.js")))[0] == 200
        session = gate.sign_in(TOKEN, guard.clock())
        assert session is not None
        cookie = {"cookie": f"other=1; {COOKIE}={session}"}
        assert (await exchange(guard, scope("/items/1", headers=cookie)))[0] == 200
        assert (await exchange(guard, scope("/items/1", headers={"cookie": f"{COOKIE}=forged"})))[0] == 303
