import json
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.logs import LINES_PER_WINDOW
from mcplhost.rpc import (
    ConnectionClosed,
    Deferred,
    LineTooLong,
    RemoteError,
    ReplyError,
    RequestTimeout,
    Session,
    SessionLimits,
)
from mcplhost.rpc.messages import INVALID_PARAMS

from ..properties import examples
from .wire import DeadPipe, Peer


async def echo(method: str, params: Any) -> Any:
    if method == "echo":
        return json.loads(bytes(params)) if params else None
    if method == "grow":  # an answer much longer than its request
        return "x" * json.loads(bytes(params))[0]
    if method == "bad-params":
        raise ReplyError(INVALID_PARAMS, "bad params", {"field": "x"})
    if method == "crash":
        raise RuntimeError("secret internals")
    if method == "slow":
        async def work() -> Any:
            await anyio.sleep(0.01)
            return "done"
        return Deferred(work)
    raise ReplyError(-32601, f"method not found: {method}")


def make(peer: Peer, **kwargs: Any) -> Session:
    return Session(peer.from_session, peer.to_session, on_request=echo, **kwargs)


class TestAnswering:
    async def test_every_kind_of_request_gets_one_answer(self) -> None:
        """Result, handler error, crash, unknown method and deferred work each answer once."""
        peer = Peer()
        session = make(peer)
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            for i, method in enumerate(["echo", "bad-params", "crash", "nope", "slow"]):
                await peer.write({"jsonrpc": "2.0", "id": i, "method": method, "params": {"v": i}})
            answers = {}
            for _ in range(5):
                message = await peer.read()
                answers[message["id"]] = message
            peer.close()
        assert answers[0]["result"] == {"v": 0}
        assert answers[1]["error"] == {"code": -32602, "message": "bad params", "data": {"field": "x"}}
        assert answers[2]["error"]["code"] == -32603 and "secret" not in json.dumps(answers[2])
        assert answers[3]["error"]["code"] == -32601
        assert answers[4]["result"] == "done"

    async def test_ids_come_back_unchanged_in_type(self) -> None:
        """A string id "1" and a number id 1 are two requests with two answers."""
        peer = Peer()
        async with anyio.create_task_group() as tg:
            await tg.start(make(peer).run)
            await peer.write({"jsonrpc": "2.0", "id": "1", "method": "echo", "params": ["s"]})
            await peer.write({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": ["n"]})
            first, second = await peer.read(), await peer.read()
            peer.close()
        assert (first["id"], first["result"]) == ("1", ["s"])
        assert (second["id"], second["result"]) == (1, ["n"])

    async def test_a_notification_never_gets_an_answer(self) -> None:
        """Not for unknown methods, not when its handler fails."""
        seen = []

        async def on_notification(method: str, params: Any) -> None:
            seen.append(method)
            raise RuntimeError("handler broke")

        peer = Peer()
        async with anyio.create_task_group() as tg:
            await tg.start(make(peer, on_notification=on_notification).run)
            await peer.write({"jsonrpc": "2.0", "method": "unknown/thing"})
            await peer.write({"jsonrpc": "2.0", "id": 9, "method": "echo"})
            answer = await peer.read()
            peer.close()
        assert answer["id"] == 9 and seen == ["unknown/thing"]

    async def test_malformed_requests_get_invalid_request(self) -> None:
        """A bool id or a missing jsonrpc member is answered -32600."""
        peer = Peer()
        async with anyio.create_task_group() as tg:
            await tg.start(make(peer).run)
            await peer.write(b'{"jsonrpc":"2.0","id":true,"method":"echo"}\n')
            await peer.write(b'{"id":4,"method":"echo"}\n')
            first, second = await peer.read(), await peer.read()
            peer.close()
        assert first == {"jsonrpc": "2.0", "id": None, "error": first["error"]}
        assert first["error"]["code"] == -32600
        assert second["id"] == 4 and second["error"]["code"] == -32600


class TestLeniency:
    async def test_junk_lines_are_skipped_with_rate_limited_warnings(self) -> None:
        """Non-JSON lines never end the connection; past the allowance they are counted, not logged one by one."""
        peer = Peer()
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                session = make(peer)
                await tg.start(session.run)
                for _ in range(100):
                    await peer.write(b"Logged in as bot#1234\n")
                await peer.write({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": [1]})
                assert (await peer.read())["result"] == [1]
                peer.close()
        junk = [entry for entry in logs if entry["event"] == "rpc.junk_line"]
        assert len(junk) == LINES_PER_WINDOW and session.stats["junk"] == 100
        (summary,) = [entry for entry in logs if entry["event"] == "log.suppressed"]  # when the session ended
        assert summary["suppressed_event"] == "rpc.junk_line" and summary["count"] == 100 - LINES_PER_WINDOW

    async def test_an_oversized_line_is_refused_and_the_connection_goes_on(self) -> None:
        """The line is dropped with a log line saying why; the next request is served."""
        peer = Peer()
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(make(peer, limits=SessionLimits(max_line_bytes=1024)).run)
                await peer.write({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": ["x" * 5000]})
                await peer.write({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": ["ok"]})
                answer = await peer.read()
                peer.close()
        assert answer["id"] == 2
        assert any(e["event"] == "rpc.line_too_long" and e["limit"] == 1024 for e in logs)


class TestOutgoingLineCap:
    async def test_our_request_and_notification_past_the_cap_are_never_written(self) -> None:
        """Each raises LineTooLong to its caller (logged, counted) and nothing of it reaches the peer; the next
        line goes out as usual."""
        peer = Peer()
        session = make(peer, limits=SessionLimits(max_line_bytes=1024))
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(session.run)
                with pytest.raises(LineTooLong) as caught:
                    await session.request("big", {"text": "x" * 2000})
                assert (caught.value.method, caught.value.limit) == ("big", 1024) and caught.value.size > 2000
                with pytest.raises(LineTooLong):
                    await session.notify("big/note", {"text": "x" * 2000})
                with pytest.raises(LineTooLong):
                    session.notify_nowait("big/note", {"text": "x" * 2000})
                await session.notify("small", {"text": "x" * 900})
                first = await peer.read()
                peer.close()
        assert first["method"] == "small"  # the first line the peer got: nothing of the three
        assert session.stats["outgoing_too_long"] == 3
        assert [e["method"] for e in logs if e["event"] == "rpc.outgoing_too_long"] == ["big", "big/note", "big/note"]

    async def test_an_answer_past_the_cap_becomes_an_error_saying_so(self) -> None:
        """The peer's request still gets exactly one answer: -32603 with reason too_large and the sizes."""
        peer = Peer()
        async with anyio.create_task_group() as tg:
            await tg.start(make(peer, limits=SessionLimits(max_line_bytes=1024)).run)
            await peer.write({"jsonrpc": "2.0", "id": 1, "method": "grow", "params": [5000]})
            await peer.write({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": ["ok"]})
            big, small = await peer.read(), await peer.read()
            peer.close()
        assert big["id"] == 1 and big["error"]["code"] == -32603
        assert big["error"]["data"]["reason"] == "too_large" and big["error"]["data"]["limit"] == 1024
        assert small == {"jsonrpc": "2.0", "id": 2, "result": ["ok"]}


class TestOurRequests:
    async def test_results_and_errors_reach_the_caller(self) -> None:
        """A matched result returns; a matched error raises RemoteError."""
        peer = Peer()
        session = make(peer)
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            results: list[Any] = []

            async def call() -> None:
                results.append(json.loads(bytes(await session.request("a", {}))))
                with pytest.raises(RemoteError) as caught:
                    await session.request("b")
                results.append(caught.value.code)

            tg.start_soon(call)
            first = await peer.read()
            await peer.write({"jsonrpc": "2.0", "id": first["id"], "result": {"ok": True}})
            second = await peer.read()
            await peer.write({"jsonrpc": "2.0", "id": second["id"], "error": {"code": -5, "message": "no"}})
            with anyio.fail_after(5):
                while len(results) < 2:
                    await anyio.sleep(0.001)
            peer.close()
        assert results == [{"ok": True}, -5]

    async def test_id_spaces_are_separate(self) -> None:
        """The peer's request id 1 is not an answer to our request id 1."""
        peer = Peer()
        session = make(peer)
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            outcome: list[Any] = []

            async def call() -> None:
                outcome.append(json.loads(bytes(await session.request("ours"))))

            tg.start_soon(call)
            ours = await peer.read()
            assert ours["id"] == 1
            await peer.write({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": ["theirs"]})
            assert (await peer.read())["result"] == ["theirs"]
            assert outcome == []
            await peer.write({"jsonrpc": "2.0", "id": 1, "result": "mine"})
            with anyio.fail_after(5):
                while not outcome:
                    await anyio.sleep(0.001)
            peer.close()
        assert outcome == ["mine"]

    async def test_timeout_then_late_and_unknown_answers_are_dropped(self) -> None:
        """A request times out; its late answer and an unknown id are logged and dropped."""
        peer = Peer()
        session = make(peer)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(session.run)
                with pytest.raises(RequestTimeout):
                    await session.request("never", timeout=0.05)
                sent = await peer.read()
                await peer.write({"jsonrpc": "2.0", "id": sent["id"], "result": 1})
                await peer.write({"jsonrpc": "2.0", "id": 999, "result": 1})
                await peer.write({"jsonrpc": "2.0", "id": 5, "method": "echo", "params": [5]})
                await peer.read()
                peer.close()
        dropped = [(e["id"], e["why"]) for e in logs if e["event"] == "rpc.response_dropped"]
        assert dropped == [(sent["id"], "late"), (999, "unknown")]
        stats = session.statistics()
        assert (stats["responses_late"], stats["responses_unknown"], stats["responses"]) == (1, 1, 2)

    async def test_stray_responses_past_the_allowance_are_counted_not_logged(self) -> None:
        """A flood of unknown ids leaves the allowance of lines, one summary, and the exact count in statistics()."""
        peer = Peer()
        session = make(peer)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(session.run)
                for n in range(500):
                    await peer.write({"jsonrpc": "2.0", "id": 10_000 + n, "result": 1})
                await peer.write({"jsonrpc": "2.0", "id": 5, "method": "echo", "params": [5]})
                await peer.read()
                peer.close()
        assert len([e for e in logs if e["event"] == "rpc.response_dropped"]) == LINES_PER_WINDOW
        (summary,) = [e for e in logs if e["event"] == "log.suppressed"]
        assert summary["count"] == 500 - LINES_PER_WINDOW and session.statistics()["responses_unknown"] == 500

    async def test_end_of_output_fails_waiting_callers(self) -> None:
        """When the peer's output ends, every outstanding request raises ConnectionClosed."""
        peer = Peer()
        session = make(peer)
        caught: list[BaseException] = []

        async def call() -> None:
            try:
                await session.request("x", timeout=10)
            except ConnectionClosed as exc:
                caught.append(exc)

        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            tg.start_soon(call)
            await peer.read()
            peer.close()
        assert len(caught) == 1
        with pytest.raises(ConnectionClosed):
            await session.request("after")


lines = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.builds(lambda i, m: json.dumps({"jsonrpc": "2.0", "id": i, "method": m}).encode(),
              st.one_of(st.integers(), st.text(max_size=5)), st.sampled_from(["echo", "crash", "x", "slow"])),
    st.builds(lambda m: json.dumps({"jsonrpc": "2.0", "method": m}).encode(), st.text(max_size=5)),
    st.builds(lambda i: json.dumps({"jsonrpc": "2.0", "id": i, "result": None}).encode(), st.integers()),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["id", "method", "jsonrpc", "params", "result", "error"]), inner, max_size=4),
                 max_leaves=8).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=30))
def test_fuzzed_input_never_crashes_and_every_request_is_answered_once(batch: list[bytes]) -> None:
    """Random JSON and garbage lines: the reader survives and answers each request exactly once."""

    def owed(line: bytes) -> bool:
        try:
            value = json.loads(line)
        except ValueError:
            return False
        return isinstance(value, dict) and "method" in value and "id" in value

    expected = sum(owed(line) for line in batch)

    async def main() -> int:
        peer = Peer()
        session = make(peer)
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            for line in batch:
                await peer.write(line + b"\n")
            peer.close()
        count = 0
        data = b""
        while True:
            with anyio.move_on_after(0.01):
                data += await peer.from_session.receive()
                continue
            break
        for line in data.splitlines():
            message = json.loads(line)
            assert ("result" in message) != ("error" in message)
            count += 1
        return count

    assert anyio.run(main) == expected


class TestAtReceipt:
    async def test_an_answer_takes_effect_before_the_next_message(self) -> None:
        """at_receipt runs in the read loop, so a request right behind the answer sees its effect."""
        state = {"ready": False}
        seen: list[bool] = []

        async def handler(method: str, params: Any) -> Any:
            seen.append(state["ready"])
            return {}

        def apply(outcome: Any) -> str:
            state["ready"] = True
            return "applied"

        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler)
        results: list[Any] = []
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)

            async def call() -> None:
                results.append(await session.request("policy", at_receipt=apply))

            tg.start_soon(call)
            sent = await peer.read()
            # The answer and the next request arrive in one chunk.
            await peer.write(json.dumps({"jsonrpc": "2.0", "id": sent["id"], "result": {}}).encode() + b"\n"
                             + json.dumps({"jsonrpc": "2.0", "id": 1, "method": "next"}).encode() + b"\n")
            await peer.read()
            peer.close()
        assert seen == [True] and results == ["applied"]

    async def test_an_exception_at_receipt_reaches_the_caller(self) -> None:
        """What at_receipt raises is raised by request(), not by the read loop."""
        peer = Peer()
        session = make(peer)

        def refuse(outcome: Any) -> Any:
            raise LookupError("refused")

        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            caught: list[BaseException] = []

            async def call() -> None:
                try:
                    await session.request("p", at_receipt=refuse)
                except LookupError as exc:
                    caught.append(exc)

            tg.start_soon(call)
            sent = await peer.read()
            await peer.write({"jsonrpc": "2.0", "id": sent["id"], "result": {}})
            await peer.write({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": [2]})
            assert (await peer.read())["result"] == [2]
            peer.close()
        assert len(caught) == 1


class TestDeferredWork:
    async def test_deferred_requests_run_concurrently_on_a_bounded_pool(self) -> None:
        """Many slow requests are all answered, at most max_concurrent running at once."""
        running = 0
        peak = 0
        release = anyio.Event()

        async def handler(method: str, params: Any) -> Any:
            async def work() -> Any:
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                await release.wait()
                running -= 1
                return "done"
            return Deferred(work)

        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler,
                          limits=SessionLimits(max_concurrent=4))
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            for i in range(20):
                await peer.write({"jsonrpc": "2.0", "id": i, "method": "slow"})
            with anyio.fail_after(5):
                while peak < 4:
                    await anyio.sleep(0.001)
            release.set()
            answers = [await peer.read() for _ in range(20)]
            peer.close()
        assert sorted(a["id"] for a in answers) == list(range(20))
        assert all(a["result"] == "done" for a in answers)
        assert peak == 4 and session.statistics()["workers"] == 4


    async def test_quick_work_read_behind_slow_work_gets_a_worker_of_its_own(self) -> None:
        """An idle worker left by earlier work takes the first of a burst straight from the queue: the burst's
        last item, a quick one, still gets its own worker and is answered while the slow ones wait (it was held
        until one of them ended: a push behind four inferences)."""
        release = anyio.Event()

        async def handler(method: str, params: Any) -> Any:
            async def work() -> Any:
                if method == "slow":
                    await release.wait()
                return method
            return Deferred(work)

        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=handler)
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await peer.write({"jsonrpc": "2.0", "id": "earlier", "method": "quick"})
            assert (await peer.read())["id"] == "earlier"  # its worker is idle now
            burst = [{"jsonrpc": "2.0", "id": i, "method": "slow"} for i in range(4)]
            burst.append({"jsonrpc": "2.0", "id": "push", "method": "quick"})
            await peer.write(b"".join(json.dumps(m).encode() + b"\n" for m in burst))  # one read
            first = await peer.read()
            release.set()
            rest = [await peer.read() for _ in range(4)]
            peer.close()
        assert first == {"jsonrpc": "2.0", "id": "push", "result": "quick"}
        assert sorted(a["id"] for a in rest) == [0, 1, 2, 3]


class TestClosedWhileWaiting:
    async def test_a_write_waiting_for_room_raises_connection_closed_when_the_session_closes(self) -> None:
        """A caller blocked on a full outgoing queue gets ConnectionClosed, not a stream error, when the write fails."""
        from mcplhost.rpc.session import MAX_QUEUED_LINES

        peer, stdin = Peer(), DeadPipe()
        session = Session(stdin, peer.to_session, on_request=echo)  # type: ignore[arg-type]
        caught: list[BaseException] = []
        returned = anyio.Event()

        async def blocked() -> None:
            try:
                await session.notify("one too many")
            except ConnectionClosed as exc:
                caught.append(exc)
            finally:
                returned.set()

        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            session.notify_nowait("taken")
            await anyio.wait_all_tasks_blocked()  # the writer holds "taken" in a write that does not return
            for _ in range(MAX_QUEUED_LINES):
                session.notify_nowait("fill")
            tg.start_soon(blocked)
            await anyio.wait_all_tasks_blocked()
            assert not returned.is_set()  # waiting for room
            stdin.break_()  # the peer's stdin goes away
            with anyio.fail_after(5):
                await returned.wait()
            peer.close()
        assert len(caught) == 1


class TestStopping:
    """The session's task cancelled (the host stopping) while deferred work runs."""

    @staticmethod
    def gated(started: anyio.Event, release: anyio.Event, calls: list[str] | None = None) -> Any:
        """A handler whose deferred work reports that it started, then waits for `release` (a commit)."""
        async def handler(method: str, params: Any) -> Any:
            async def work() -> Any:
                if calls is not None:
                    calls.append(method)
                started.set()
                await release.wait()
                return "committed"
            return Deferred(work)
        return handler

    @staticmethod
    async def run_in(scope: anyio.CancelScope, session: Session, stopped: anyio.Event | None = None) -> None:
        """Run the session under `scope`, so the test can cancel it and go on awaiting."""
        with scope:
            await session.run()
        if stopped is not None:
            stopped.set()

    async def test_work_that_completes_after_the_cancel_still_gets_its_answer_written(self) -> None:
        """A commit that lands after the session was cancelled is answered before `run` returns."""
        started, release, stopped = anyio.Event(), anyio.Event(), anyio.Event()
        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=self.gated(started, release))
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.run_in, scope, session, stopped)
            await peer.write({"jsonrpc": "2.0", "id": 1, "method": "store"})
            await started.wait()
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert not stopped.is_set()  # the session waits for work already started
            release.set()
            with anyio.fail_after(5):
                await stopped.wait()
        assert await peer.read(timeout=0.5) == {"jsonrpc": "2.0", "id": 1, "result": "committed"}

    async def test_work_that_outlasts_the_stop_bound_is_abandoned_with_a_warning(self, monkeypatch) -> None:
        """A commit that never lands holds the stop only for ANSWER_ON_STOP_S, and says so."""
        from mcplhost.rpc import session as session_module

        monkeypatch.setattr(session_module, "ANSWER_ON_STOP_S", 0.05)
        started, never = anyio.Event(), anyio.Event()
        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=self.gated(started, never))
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(session.run)
                await peer.write({"jsonrpc": "2.0", "id": 1, "method": "store"})
                await started.wait()
                with anyio.fail_after(5):
                    tg.cancel_scope.cancel()
        assert [e["method"] for e in logs if e["event"] == "rpc.answer_abandoned"] == ["store"]
        assert peer.pending_bytes() == b"" and peer.from_session.queued() == b""

    async def test_work_not_yet_started_never_starts_after_the_cancel(self) -> None:
        """Requests queued behind a busy pool are dropped on a stop: nothing of theirs reached a commit."""
        started, release = anyio.Event(), anyio.Event()
        calls: list[str] = []
        peer = Peer()
        session = Session(peer.from_session, peer.to_session, on_request=self.gated(started, release, calls),
                          limits=SessionLimits(max_concurrent=1))
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()
            tg.start_soon(self.run_in, scope, session)
            await peer.write({"jsonrpc": "2.0", "id": 1, "method": "first"})
            await peer.write({"jsonrpc": "2.0", "id": 2, "method": "second"})
            await started.wait()
            await anyio.wait_all_tasks_blocked()  # the second is read and queued behind the first
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            release.set()
        assert calls == ["first"]
        assert await peer.read(timeout=0.5) == {"jsonrpc": "2.0", "id": 1, "result": "committed"}
        assert peer.from_session.queued() == b""

    async def test_a_peer_that_stops_reading_holds_the_stop_only_for_the_flush_bound(self, monkeypatch) -> None:
        """With the peer's stdin full, the session still ends FLUSH_ON_STOP_S after a stop, and says so."""
        from mcplhost.rpc import session as session_module

        class Stuck:
            """A pipe whose reader went quiet: every write waits forever."""

            async def send(self, data: bytes) -> None:
                await anyio.sleep_forever()

        monkeypatch.setattr(session_module, "FLUSH_ON_STOP_S", 0.05)
        peer = Peer()
        session = Session(Stuck(), peer.to_session, on_request=echo)  # type: ignore[arg-type]
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(session.run)
                for i in range(3):
                    await peer.write({"jsonrpc": "2.0", "id": i, "method": "echo", "params": [i]})
                    await anyio.wait_all_tasks_blocked()  # one answer at a time reaches the writer
                with anyio.fail_after(5):
                    tg.cancel_scope.cancel()
        (abandoned,) = [e for e in logs if e["event"] == "rpc.flush_abandoned"]
        assert abandoned["queued"] == 2  # the first answer was being written; the other two waited behind it
