"""The session as the hostile-input boundary: deep lines, bursts, stalled writes, the byte budget, cancellation."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.rpc import Deferred, RequestTimeout, Session, SessionLimits
from mcplhost.rpc.limits import MAX_NESTING_DEPTH

from ..properties import examples
from .wire import Peer

DEEP = "[" * 2000 + "]" * 2000


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


async def echo(method: str, params: Any) -> Any:
    return json.loads(bytes(params)) if params else None


class TestDeepLines:
    async def test_deep_requests_and_notifications_get_a_parse_error_and_the_session_goes_on(self) -> None:
        """-32700 to id null for each, counted and logged; the next request is answered as usual."""
        notified: list[str] = []

        async def on_notification(method: str, params: Any) -> None:
            notified.append(method)

        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=echo, on_notification=on_notification)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(session.run)
                await peer.write(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":' + DEEP.encode() + b"}\n")
                await peer.write(b'{"jsonrpc":"2.0","method":"note","params":{"a":' + DEEP.encode() + b"}}\n")
                await peer.write({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": ["after"]})
                answers = [await peer.read() for _ in range(3)]
                peer.close()
        assert [a["error"]["code"] for a in answers[:2]] == [-32700, -32700]
        assert [a["id"] for a in answers[:2]] == [None, None]
        assert str(MAX_NESTING_DEPTH) in answers[0]["error"]["message"]
        assert answers[2] == {"jsonrpc": "2.0", "id": 2, "result": ["after"]}
        assert notified == []
        assert session.statistics()["too_deep"] == 2
        assert len([e for e in logs if e["event"] == "rpc.line_refused"]) == 2


class TestBursts:
    async def test_requests_read_in_one_chunk_run_at_once(self) -> None:
        """20 deferred requests in one write: all 20 run at the same time (each waits until all have started)."""
        count = 20
        running = 0
        all_running = anyio.Event()

        async def handler(method: str, params: Any) -> Any:
            async def work() -> Any:
                nonlocal running
                running += 1
                if running == count:
                    all_running.set()
                await all_running.wait()  # would never return if the burst ran one at a time
                return "done"
            return Deferred(work)

        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler)
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await peer.write(b"".join(line({"jsonrpc": "2.0", "id": i, "method": "w"}) for i in range(count)))
            with anyio.fail_after(5):
                await all_running.wait()
            answers = [await peer.read() for _ in range(count)]
            peer.close()
        assert sorted(a["id"] for a in answers) == list(range(count))
        assert session.statistics()["workers"] == count


class Stuck:
    """A pipe whose reader went quiet: every write waits until `release` is set, and records what it sent."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.written: list[bytes] = []

    async def send(self, data: bytes) -> None:
        await self.release.wait()
        self.written.append(data)


class TestStalledWrites:
    async def test_a_request_times_out_while_its_line_waits_and_that_line_is_never_written(self) -> None:
        """The timeout covers queueing and writing; a line still queued at its timeout is skipped."""
        pipe = Stuck()
        peer = Peer()
        session = Session(pipe, peer.to_session)  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            session.notify_nowait("first")  # the writer takes it and waits on the pipe
            await anyio.wait_all_tasks_blocked()
            with anyio.fail_after(3), pytest.raises(RequestTimeout):
                await session.request("late", timeout=0.2)
            session.notify_nowait("after")
            pipe.release.set()
            with anyio.fail_after(3):
                while len(pipe.written) < 2:
                    await anyio.sleep(0.01)
            peer.close()
        sent = b"".join(pipe.written)
        assert b'"first"' in sent and b'"after"' in sent and b'"late"' not in sent

    async def test_a_request_behind_a_full_queue_times_out(self) -> None:
        """With the outgoing queue full, request(timeout) still returns at its timeout (it waited forever before)."""
        from mcplhost.rpc.limits import MAX_QUEUED_LINES

        pipe = Stuck()
        peer = Peer()
        session = Session(pipe, peer.to_session)  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            session.notify_nowait("taken")
            await anyio.wait_all_tasks_blocked()  # the writer holds it, waiting on the pipe
            for _ in range(MAX_QUEUED_LINES):
                session.notify_nowait("fill")
            with anyio.fail_after(3), pytest.raises(RequestTimeout):
                await session.request("blocked", timeout=0.2)
            pipe.release.set()
            peer.close()

    async def test_a_write_that_stalls_past_its_bound_breaks_the_connection(self) -> None:
        """run returns by itself, waiting callers get ConnectionClosed, and the break is counted and logged."""
        from mcplhost.rpc import ConnectionClosed

        pipe = Stuck()
        peer = Peer()
        session = Session(pipe, peer.to_session, limits=SessionLimits(write_stall_s=0.2))  # type: ignore[arg-type]
        outcome: list[BaseException] = []

        async def caller() -> None:
            try:
                await session.request("never", timeout=10)
            except ConnectionClosed as exc:
                outcome.append(exc)

        with capture_logs() as logs:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(caller)
                    await session.run()  # returns although the peer's output never ends
        assert len(outcome) == 1
        assert session.statistics()["write_stalls"] == 1
        assert [e for e in logs if e["event"] == "rpc.connection_broken"]


class TestBudget:
    async def test_past_the_budget_the_reader_pauses_and_resumes_once_answers_free_it(self) -> None:
        """Held requests fill the byte budget; reading stops (counted, paused) until they finish; then all answer."""
        release = anyio.Event()
        started = 0

        async def handler(method: str, params: Any) -> Any:
            async def work() -> Any:
                nonlocal started
                started += 1
                await release.wait()
                return "done"
            return Deferred(work)

        budget = 10_000
        payload = "x" * 900  # each line is about 1 KB: ten fit
        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler,
                          limits=SessionLimits(max_pending_bytes=budget))
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await peer.write(b"".join(line({"jsonrpc": "2.0", "id": i, "method": "w", "params": [payload]})
                                      for i in range(50)))
            with anyio.fail_after(5):
                while not session.statistics()["reading_paused"]:
                    await anyio.sleep(0.01)
            await anyio.wait_all_tasks_blocked()
            stats = session.statistics()
            assert stats["pending_bytes"] <= budget and started == stats["requests"] < 50
            assert stats["budget_pauses"] >= 1
            release.set()
            answers = [await peer.read() for _ in range(50)]
            peer.close()
        assert sorted(a["id"] for a in answers) == list(range(50))
        assert session.statistics()["pending_bytes"] == 0


class TestOutgoingBytes:
    async def test_answers_a_peer_does_not_read_stop_the_reader_at_the_byte_bound(self) -> None:
        """Big answers to a peer that stops reading queue up to the bound; then nothing more is read, until it reads."""
        pipe = Stuck()
        peer = Peer()
        big = "y" * 3000

        async def handler(method: str, params: Any) -> Any:
            return big

        bound = 10_000
        session = Session(pipe, peer.to_session, on_request=handler,  # type: ignore[arg-type]
                          limits=SessionLimits(max_outgoing_bytes=bound))
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await peer.write(b"".join(line({"jsonrpc": "2.0", "id": i, "method": "big"}) for i in range(20)))
            await anyio.wait_all_tasks_blocked()
            stats = session.statistics()
            assert stats["outgoing_bytes"] <= bound and stats["requests"] < 20
            pipe.release.set()
            with anyio.fail_after(5):
                while sum(chunk.count(b"\n") for chunk in pipe.written) < 20:
                    await anyio.sleep(0.01)
            peer.close()
        assert session.statistics()["outgoing_bytes"] == 0


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=3000), st.booleans()), min_size=1, max_size=40),
       st.integers(min_value=4000, max_value=20_000))
def test_the_budget_is_never_exceeded_and_always_given_back(requests: list[tuple[int, bool]], budget: int) -> None:
    """Any mix of sizes, deferred or answered at once, in one write: every request answered, the bytes held
    never over the budget (a line alone always fits: it is smaller than any budget here), all given back."""
    peak = 0
    session: Session

    async def handler(method: str, params: Any) -> Any:
        nonlocal peak
        peak = max(peak, session.statistics()["pending_bytes"])
        if method == "now":
            return "now"

        async def work() -> Any:
            nonlocal peak
            peak = max(peak, session.statistics()["pending_bytes"])
            await anyio.sleep(0)
            return "later"
        return Deferred(work)

    async def main() -> None:
        nonlocal session
        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler,
                          limits=SessionLimits(max_pending_bytes=budget, max_concurrent=4))
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await peer.write(b"".join(line({"jsonrpc": "2.0", "id": i, "method": "later" if deferred else "now",
                                            "params": ["x" * size]}) for i, (size, deferred) in enumerate(requests)))
            answers = [await peer.read() for _ in requests]
            peer.close()
        assert sorted(a["id"] for a in answers) == list(range(len(requests)))
        assert all(a["result"] == ("later" if requests[a["id"]][1] else "now") for a in answers)
        assert peak <= budget and session.statistics()["pending_bytes"] == 0

    anyio.run(main)


class TestCancellation:
    async def test_cancelled_work_ends_with_no_answer_and_gives_back_its_reservation(self) -> None:
        """A cancellable request is cut off with no answer; one that may not be cut off still answers."""
        started = anyio.Event()
        release = anyio.Event()
        discarded: list[str] = []

        async def handler(method: str, params: Any) -> Any:
            async def work() -> Any:
                if method == "cut":
                    started.set()
                await release.wait()
                return method
            return Deferred(work, discard=lambda: discarded.append(method), cancellable=method != "commit")

        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler,
                          limits=SessionLimits(max_concurrent=1))
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await peer.write({"jsonrpc": "2.0", "id": 1, "method": "cut"})
            await started.wait()
            await peer.write({"jsonrpc": "2.0", "id": 2, "method": "queued"})  # waits for the one worker
            await peer.write({"jsonrpc": "2.0", "id": 3, "method": "commit"})
            await anyio.wait_all_tasks_blocked()
            assert session.cancel_peer_request(1) and session.cancel_peer_request(2)
            assert not session.cancel_peer_request(3) and not session.cancel_peer_request(99)
            release.set()
            answer = await peer.read()
            peer.close()
        assert answer == {"jsonrpc": "2.0", "id": 3, "result": "commit"}
        assert discarded == ["queued"] and peer.pending_bytes() == b""
        assert session.statistics()["cancelled"] == 2 and session.statistics()["pending_bytes"] == 0
