"""The connector handle's state rules, without processes: transitions, the mode it follows, refusals and waits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import pytest
import structlog
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from structlog.testing import capture_logs

from mcplhost.config import ConnectorConfig
from mcplhost.protocol.connection import McplConnection, Mode
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush
from mcplhost.supervisor.handle import SERVING, ConnectorHandle, ConnectorNotReady, ConnectorStopped, State
from mcplhost.supervisor.lifecycle import MODE_STATES, STATE_EVENTS, TRANSITIONS, allowed
from mcplhost.supervisor.traffic import StampingIntake

from ..harness import gone_session

SPEC = ConnectorConfig(name="unit", command=["true"])
#: The moves McplConnection makes between modes (protocol/connection.py's state order).
PROTOCOL_MOVES: dict[Mode, list[Mode]] = {
    Mode.HANDSHAKE: [Mode.POLICY_PENDING, Mode.MCP_ONLY],
    Mode.POLICY_PENDING: [Mode.READY, Mode.MCP_ONLY],
    Mode.READY: [Mode.READY, Mode.MCP_ONLY, Mode.CLOSED],
    Mode.MCP_ONLY: [],
    Mode.CLOSED: [],
}


#: Every connection a test built, so its job stream gets closed (unclosed streams warn, and warnings fail tests).
_BUILT: list[McplConnection] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    retire(_BUILT)


def retire(connections: list[McplConnection]) -> None:
    """Close the streams of connections that never had a process (outside any event loop)."""

    async def end_all() -> None:
        while connections:
            connection = connections.pop()
            connection.close_jobs()
            await connection.run_background()  # drains the closed stream and closes its other end
            await connection.session.run()  # its peer is gone: it ends at once and closes its streams

    anyio.run(end_all)


def connect(handle: ConnectorHandle, built: list[McplConnection] = _BUILT) -> McplConnection:
    connection = McplConnection(SPEC, gone_session(), None, structlog.get_logger(),  # type: ignore[arg-type]
                                on_mode=handle.life.mode_entered, on_channels=handle.life.channels_changed)
    built.append(connection)
    return connection


def live(handle: ConnectorHandle, pid: int = 4242) -> McplConnection:
    """Start a life on `handle` with a connection that has no process behind it."""
    handle.life.starting()
    connection = connect(handle)
    handle.life.spawned(pid, connection)
    return connection


def state_lines(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(previous, state) of every state-change line captured."""
    events = {event for event, _ in STATE_EVENTS.values()}
    return [(e["previous"], e["state"]) for e in logs if e["event"] in events and "previous" in e]


class TestTransitions:
    def test_every_state_has_its_transitions_and_its_line(self) -> None:
        """Each state appears in the transition table and has one canonical log event."""
        assert set(TRANSITIONS) == set(State) == set(STATE_EVENTS)

    def test_stopped_is_final(self) -> None:
        """Nothing follows stopped."""
        assert not TRANSITIONS[State.STOPPED]
        assert all(not allowed(State.STOPPED, s) for s in State if s is not State.STOPPED)

    def test_only_a_wait_leads_to_a_new_start(self) -> None:
        """starting follows only backoff and slow_lane: every restart went through the restart arithmetic."""
        assert {s for s in State if State.STARTING in TRANSITIONS[s]} == {State.BACKOFF, State.SLOW_LANE}

    def test_every_life_state_can_end_in_a_wait_or_a_stop(self) -> None:
        """From starting to mcp_only, the life may end at any moment."""
        for state in (State.STARTING, State.HANDSHAKING, State.POLICY_PENDING, State.READY, State.MCP_ONLY):
            assert {State.BACKOFF, State.SLOW_LANE, State.STOPPED} <= TRANSITIONS[state]

    def test_every_mode_but_closed_is_a_state(self) -> None:
        """The connection's modes map onto the live states; closed is left to the supervisor."""
        assert set(MODE_STATES) == set(Mode) - {Mode.CLOSED}


class TestFollowingTheConnection:
    def test_the_handle_follows_the_modes_the_connection_enters(self) -> None:
        """handshake → policy_pending → ready is logged once each, with the state before it."""
        handle = ConnectorHandle(SPEC)
        with capture_logs() as logs:
            connection = live(handle)
            connection.mode = Mode.POLICY_PENDING
            connection.mode = Mode.READY
            connection.mode = Mode.READY  # a later receipt: no change
        assert handle.state is State.READY
        assert state_lines(logs) == [("starting", "handshaking"), ("handshaking", "policy_pending"),
                                     ("policy_pending", "ready")]
        (up,) = [e for e in logs if e["event"] == "connector.up"]
        assert up["mode"] == "ready" and up["pid"] == 4242

    def test_a_past_lifes_connection_moves_nothing(self) -> None:
        """A connection of an ended life that changes mode leaves the handle alone."""
        handle = ConnectorHandle(SPEC)
        old = live(handle)
        handle.life.life_ending()
        handle.life.exited()
        handle.life.waiting(State.BACKOFF, delay_s=1.0)
        old.mode = Mode.READY
        assert handle.state is State.BACKOFF

    def test_a_close_by_policy_stops_calls_at_once(self) -> None:
        """When the connection closes by policy, the handle no longer shows its grant or channels."""
        handle = ConnectorHandle(SPEC)
        connection = live(handle)
        connection.grant = frozenset({"channels.incoming"})
        connection.mode = Mode.POLICY_PENDING
        connection.mode = Mode.READY
        assert handle.grant == {"channels.incoming"}
        connection.mode = Mode.CLOSED
        assert handle.grant == frozenset() and handle.channels() == []

    def test_restarts_count_the_lives_after_the_first(self) -> None:
        """statistics().restarts is the number of starts after the first; pid is None between lives."""
        handle = ConnectorHandle(SPEC)
        for pid in (10, 11, 12):
            live(handle, pid)
            assert handle.statistics().pid == pid
            handle.life.life_ending()
            handle.life.exited()
            handle.life.failed(f"the process {pid} exited with code 1")
            handle.life.waiting(State.BACKOFF)
        stats = handle.statistics()
        assert (stats.restarts, stats.pid, stats.last_error) == (2, None, "the process 12 exited with code 1")


class TestStatistics:
    def test_statistics_encode_with_the_status_socket_names(self) -> None:
        """Encoded, statistics() has docs/architecture.md's connector fields and values."""
        handle = ConnectorHandle(SPEC)
        handle.life.failed("spawn failed: no such file")
        encoded = msgspec.json.decode(msgspec.json.encode(handle.statistics(), order="deterministic"))
        assert encoded == {"name": "unit", "state": "starting", "pid": None, "restarts": 0,
                           "lastError": "spawn failed: no such file", "lastInboundAt": None, "channels": 0,
                           "grant": [], "lastPublishAt": None, "quiet": False}


class TestCalls:
    async def test_a_request_before_the_connector_serves_is_refused(self) -> None:
        """request() and notify() while starting or handshaking raise ConnectorNotReady."""
        handle = ConnectorHandle(SPEC)
        with pytest.raises(ConnectorNotReady, match="starting"):
            await handle.request("tools/list", {})
        live(handle)
        with pytest.raises(ConnectorNotReady, match="handshaking"):
            await handle.notify("notifications/cancelled", {})

    async def test_wait_ready_returns_when_the_connection_becomes_ready(self) -> None:
        """A waiter parked in wait_ready() goes on the moment the mode turns ready."""
        handle = ConnectorHandle(SPEC)
        connection = live(handle)
        done = anyio.Event()

        async def waiter() -> None:
            await handle.wait_ready()
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            connection.mode = Mode.POLICY_PENDING
            await anyio.wait_all_tasks_blocked()
            assert not done.is_set()
            connection.mode = Mode.READY
            with anyio.fail_after(5):
                await done.wait()

    async def test_wait_ready_on_a_stopped_connector_raises(self) -> None:
        """A waiter gets ConnectorStopped when the connector stops for good, instead of waiting forever."""
        handle = ConnectorHandle(SPEC)
        caught: list[BaseException] = []

        async def waiter() -> None:
            try:
                await handle.wait_ready()
            except ConnectorStopped as exc:
                caught.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            handle.life.stopped("restart policy is never")
        assert len(caught) == 1 and caught[0].state is State.STOPPED  # type: ignore[attr-defined]

    async def test_wait_ready_waits_on_while_a_ready_life_dies(self) -> None:
        """Once the output of a ready life ends, wait_ready() blocks until a new life is ready, not at once."""
        handle = ConnectorHandle(SPEC)
        connection = live(handle)
        connection.mode = Mode.POLICY_PENDING
        connection.mode = Mode.READY
        done = anyio.Event()

        async def waiter() -> None:
            await handle.wait_ready()
            done.set()

        async with anyio.create_task_group() as tg:
            handle.life.life_ending()
            assert handle.state is State.READY  # the label waits for the supervisor's decision
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not done.is_set()
            with pytest.raises(ConnectorNotReady):
                await handle.request("tools/list", {})
            handle.life.waiting(State.BACKOFF)
            again = live(handle)
            again.mode = Mode.POLICY_PENDING
            again.mode = Mode.READY
            with anyio.fail_after(5):
                await done.wait()

    async def test_wait_channel_returns_once_the_channel_is_registered_or_the_connector_gave_up(self) -> None:
        """Catch-up's wait (docs/agents.md#catch-up): True when the channel is registered, False on stopped."""
        handle = ConnectorHandle(SPEC)
        connection = live(handle)
        connection.mode = Mode.POLICY_PENDING
        connection.mode = Mode.READY
        answers: list[bool] = []

        async def waiter(channel: str) -> None:
            answers.append(await handle.wait_channel(channel))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "room")
            await anyio.wait_all_tasks_blocked()
            connection.registry.add([{"id": "other", "type": "t", "direction": "bidirectional", "address": {}}])
            await anyio.wait_all_tasks_blocked()
            assert answers == []
            connection.registry.add([{"id": "room", "type": "t", "direction": "bidirectional", "address": {}}])
        assert answers == [True]
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "gone")
            await anyio.wait_all_tasks_blocked()
            handle.life.stopped("restart policy is never")
        assert answers == [True, False]

    def test_a_second_stop_logs_nothing(self) -> None:
        """The host stopping after the supervisor gave up adds no line."""
        handle = ConnectorHandle(SPEC)
        with capture_logs() as logs:
            handle.life.stopped("restart policy is never")
            handle.life.stopped("the host is stopping", expected=True)
        assert [e["reason"] for e in logs if e["event"] == "connector.stopped"] == ["restart policy is never"]


class _Intake:
    """The smallest intake: accepts everything."""

    async def store_messages(self, server_id: str, lane: str, messages: list[AdmittedMessage]) -> list[Any]:
        return [{"accepted": True}] * len(messages)

    async def store_push(self, server_id: str, push: AdmittedPush) -> Any:
        return {"accepted": True}

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        return None


class TestInboundClock:
    async def test_each_admitted_item_stamps_the_time(self) -> None:
        """store_messages and store_push through the handle's intake set last_inbound_at; an empty batch does not."""
        now = [1000]
        handle = ConnectorHandle(SPEC, clock_ms=lambda: now[0])
        intake = StampingIntake(_Intake(), handle.traffic.inbound)
        await intake.store_messages("unit", "channels/incoming", [])
        assert handle.statistics().last_inbound_at is None
        message = AdmittedMessage(channel_id="c", label=None, message_id="m", content=[])
        assert await intake.store_messages("unit", "channels/incoming", [message]) == [{"accepted": True}]
        assert handle.statistics().last_inbound_at == 1000
        now[0] = 2000
        await intake.store_push("unit", AdmittedPush(event_id="e", feature_set="f", source_timestamp=None, content=[]))
        assert handle.statistics().last_inbound_at == 2000


class HandleMachine(RuleBasedStateMachine):
    """Drive a handle the way supervise does, lives and modes in any order the protocol allows.

    Phases: idle → spawning → live → ended (life over, undecided) → ladder (decided, the
    process still being stopped) → idle again, or stopped. A spawn failure skips live and ladder.
    """

    def __init__(self) -> None:
        super().__init__()
        self._capture = capture_logs()
        self.logs = self._capture.__enter__()
        self.handle = ConnectorHandle(SPEC)
        self.phase = "idle"
        self.process = False
        self.after_ladder = "idle"
        self.connection: McplConnection | None = None
        self.built: list[McplConnection] = []
        self.lives = 0

    @precondition(lambda self: self.phase == "idle")
    @rule()
    def start(self) -> None:
        self.handle.life.starting()
        self.lives += 1
        self.phase = "spawning"

    @precondition(lambda self: self.phase == "spawning")
    @rule()
    def spawn_fails(self) -> None:
        self.handle.life.failed("spawn failed")
        self.phase = "ended"

    @precondition(lambda self: self.phase == "spawning")
    @rule()
    def spawn(self) -> None:
        self.connection = connect(self.handle, self.built)
        self.handle.life.spawned(100 + self.lives, self.connection)
        self.phase, self.process = "live", True

    @precondition(lambda self: self.phase == "live" and self.connection is not None
                  and PROTOCOL_MOVES[self.connection.mode])
    @rule(data=st.data())
    def move(self, data: st.DataObject) -> None:
        assert self.connection is not None
        self.connection.mode = data.draw(st.sampled_from(PROTOCOL_MOVES[self.connection.mode]))

    @precondition(lambda self: self.phase == "live")
    @rule()
    def life_ends(self) -> None:
        self.handle.life.life_ending()
        self.handle.life.failed("the process exited with code 1")
        self.phase = "ended"

    @precondition(lambda self: self.phase == "ended")
    @rule(then=st.sampled_from([State.BACKOFF, State.SLOW_LANE, State.STOPPED]))
    def decide(self, then: State) -> None:
        if then is State.STOPPED:
            self.handle.life.stopped("restart policy is never")
        else:
            self.handle.life.waiting(then, delay_s=0.1)
        self.after_ladder = "stopped" if then is State.STOPPED else "idle"
        self.phase = "ladder" if self.process else self.after_ladder

    @precondition(lambda self: self.phase == "ladder")
    @rule()
    def ladder_done(self) -> None:
        self.handle.life.exited()
        self.phase, self.process = self.after_ladder, False

    @rule()
    def host_stops(self) -> None:  # also once stopped: a repeat must change nothing
        if self.process:
            self.handle.life.life_ending()
            self.handle.life.exited()
        self.handle.life.stopped("the host is stopping", expected=True)
        self.phase, self.process = "stopped", False

    @invariant()
    def only_allowed_transitions_happen(self) -> None:
        assert not [e for e in self.logs if e["event"] == "connector.state_unexpected"]
        lines = state_lines(self.logs)
        assert all(allowed(State(previous), State(state)) for previous, state in lines)
        assert all(a[1] == b[0] for a, b in zip(lines, lines[1:]))  # each line starts where the last ended

    @invariant()
    def statistics_agree_with_the_lives(self) -> None:
        stats = self.handle.statistics()
        assert stats.restarts == max(self.lives - 1, 0)
        assert (stats.pid is not None) == self.process
        assert stats.state is self.handle.state

    @invariant()
    def nothing_dead_looks_alive(self) -> None:
        if self.handle.state in SERVING:  # "ended" is the instant between a life's end and its decision
            assert self.phase in ("live", "ended")
        if self.phase != "live":
            assert self.handle.grant == frozenset() and self.handle.channels() == []

    def teardown(self) -> None:
        self._capture.__exit__(None, None, None)
        retire(self.built)


TestHandleMachine = HandleMachine.TestCase
