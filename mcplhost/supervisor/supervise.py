"""One owner task per connector: spawn, handshake, serve, and restart by the policy.

`supervise` runs inside the host's task group for as long as the host runs.
It hands out the connector's `ConnectorHandle` (handle.py), the one object
that outlives every restart, through `task_status.started(handle)` once the
first start has finished its handshake (ready or MCP-only) or failed, which
is what READY=1 waits for. It is the only writer of the handle's
`Lifecycle` (lifecycle.py): every state change goes through it and is
logged there, once. Each life's connection gets the intake through a
`StampingIntake` (traffic.py), which notes when items come in.
A crashing, hanging or chatty connector only ever affects its own task.

What counts as a failure (docs/operations.md): every exit the host did not
ask for, whether or not the handshake had finished, plus a failed spawn or
handshake. A connection the host closed because the connector refused its
policy with fallback "close" is restarted only under `policy = "always"`.
A life the host ended because the connector left a `ping` unanswered
(`deaf`, watch.py) is a failure like any other.
A restart asked for (`ConnectorHandle.restart()`, `mcplhost restart-connector`)
is no failure: the life (or the wait) is cut short through the same shielded
ladder as a stop, the policy is reset, and the next start follows at once.

Exception boundary: each connector's life is one. An unexpected exception
in the host's own code for that connector (the session, the protocol, often
set off by what the connector sent) ends that life as a crash (`crashed`):
logged once with its traceback, the child stopped by the shutdown ladder,
and the restart policy applied as for any failure. It never reaches the
host's task group, so every other connector goes on. Only `Exception` is
caught: a cancellation (the host stopping), alone or in an exception group,
always goes through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import structlog
from anyio.abc import Process, TaskStatus

from mcplhost.config import ConnectorConfig
from mcplhost.envfile import EnvFileError
from mcplhost.errors import HostStateError
from mcplhost.logs import LimitedLog
from mcplhost.protocol.connection import OFFERED, HandshakeFailed, McplConnection, Mode, PolicyClosed
from mcplhost.protocol.intake import Intake
from mcplhost.protocol.ports import State
from mcplhost.rpc import ConnectionClosed, RequestTimeout, Session, SessionLimits
from mcplhost.tracebacks import bounded_traceback

from .handle import ConnectorHandle
from .lifecycle import Lifecycle
from .policy import GiveUp, Restart, RestartPolicy
from .process import CHILD_PROCESSES, Launcher, drain_stderr, exit_description, wait_exited
from .traffic import StampingIntake
from .watch import ping_until_deaf, watch_quiet

log = structlog.get_logger()


class Life:
    """How one process life ended."""

    SPAWN_FAILED = "spawn_failed"
    HANDSHAKE_FAILED = "handshake_failed"
    EXITED = "exited"
    POLICY_CLOSED = "policy_closed"
    CRASHED = "crashed"  # an unexpected exception in the host's code for this connector (a bug of ours)
    DEAF = "deaf"  # it left a ping unanswered for ping_timeout_s (docs/operations.md#quiet-and-deaf-connectors)


#: After the connection dies mid-handshake, how long to wait for the child's exit code:
#: "exited with code 3" explains the failure, a broken pipe only describes it.
EXIT_CODE_WAIT_S = 1.0
#: Characters of a crash's exception text kept in `last_error` (the log line has the whole traceback).
CRASH_ERROR_CHARS = 300


async def supervise(
    spec: ConnectorConfig,
    intake: Intake,
    *,
    handle: ConnectorHandle | None = None,
    launcher: Launcher = CHILD_PROCESSES,
    task_status: TaskStatus[ConnectorHandle] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the connector for as long as the host runs; hand out its handle once the first start is over.

    Each life is started and ended by `launcher` (a child process by default).
    """
    handle = handle if handle is not None else ConnectorHandle(spec)
    clog = log.bind(connector=spec.name)
    if not spec.grant:
        # Once per connector and run, not per restart: the config will not change meanwhile.
        clog.warning("connector.grant_empty",
                     detail="the grant is empty: nothing this connector sends can be accepted")
    intake = StampingIntake(intake, handle.traffic.inbound)
    life = handle.life
    policy = RestartPolicy(spec.restart)
    reported = False

    def report_started() -> None:
        nonlocal reported
        if not reported:
            reported = True
            task_status.started(handle)

    began = 0.0
    decision: Restart | GiveUp | None = None

    def life_ended(ended: str) -> None:
        # Decided the moment the life ends, before its shutdown ladder, so the
        # handle never shows a dead life as ready while the ladder runs.
        nonlocal decision
        now = anyio.current_time()
        decision = next_step(spec, policy, ended, uptime=now - began, now=now)
        announce(life, spec, decision, ended)

    try:
        while True:
            began, decision = anyio.current_time(), None
            life.starting()
            with life.restartable():  # restart-connector ends the life here, through its shielded ladder
                await run_life(spec, intake, clog, handle, on_ready=report_started, on_end=life_ended,
                               launcher=launcher)
            report_started()
            if life.take_restart():
                policy.reset()  # as `supervisorctl restart`: a fresh budget, no delay
                continue
            if not isinstance(decision, Restart):
                return
            with life.restartable():
                await anyio.sleep(decision.delay)
            if life.take_restart():
                policy.reset()
    finally:
        life.stopped("the host is stopping", expected=True)  # a no-op after a return above


def next_step(spec: ConnectorConfig, policy: RestartPolicy, ended: str, *, uptime: float,
              now: float) -> Restart | GiveUp:
    """What follows a life that ended as `ended` at `now`, after `uptime` seconds."""
    if ended == Life.POLICY_CLOSED and spec.restart.policy != "always":
        return GiveUp("closed after the connector refused the policy")
    if uptime >= spec.restart.window_s:
        policy.reset()
    return policy.failed(now)


def announce(life: Lifecycle, spec: ConnectorConfig, decision: Restart | GiveUp, ended: str) -> None:
    """Move the connector to the state the decision means; that logs it."""
    if isinstance(decision, GiveUp):
        life.stopped(decision.reason, last=ended)
    elif decision.slow_lane:
        life.waiting(State.SLOW_LANE, failures=decision.consecutive, delay_s=round(decision.delay, 3),
                       detail=f"crash loop: one start every {spec.restart.backoff_max_s:g} s until it stays up")
    else:
        life.waiting(State.BACKOFF, failures=decision.consecutive, delay_s=round(decision.delay, 3))


async def run_life(spec: ConnectorConfig, intake: Intake, clog: Any, handle: ConnectorHandle, *,
                   on_ready: Callable[[], None] = lambda: None,
                   on_end: Callable[[str], None] = lambda ended: None,
                   launcher: Launcher = CHILD_PROCESSES) -> str:
    """One process life: spawn, handshake, serve until the child ends, then the shutdown ladder.

    `on_end(ended)` runs once the life has ended on its own, before the
    ladder; not when the host cancels it.
    """
    life = handle.life
    try:
        process = await launcher.spawn(spec)
    except (OSError, EnvFileError) as exc:  # a missing command, cwd or env file fails this connector alone
        clog.error("connector.spawn_failed", command=spec.command, error=str(exc))
        life.failed(f"spawn failed: {exc}")
        on_end(Life.SPAWN_FAILED)
        return Life.SPAWN_FAILED
    plog = clog.bind(pid=process.pid)
    # The lines this life causes per message: a few per event and window, then counts (kept in the host's totals).
    limited = LimitedLog(plog, tally=handle.suppressed.tally_for(spec.name))
    connection: McplConnection | None = None
    ended = Life.EXITED
    try:
        try:
            connection = McplConnection(spec, _session(spec, process, plog, limited), intake, plog,
                                        on_mode=life.mode_entered, inference=handle.inference, hooks=handle.hooks,
                                        limited=limited, counts=handle.refusals, on_channels=life.channels_changed,
                                        offered=OFFERED if handle.offered is None else handle.offered)
            life.spawned(process.pid, connection, command=spec.command)
            ended = await _serve_life(spec, process, connection, plog, limited, handle, on_ready)
        except Exception as exc:  # the boundary: only Exception, so a cancellation (or a group holding one) goes on
            ended = Life.CRASHED
            error = crash_error(exc)
            plog.error("connector.crashed", error=error, traceback=bounded_traceback(exc))
            life.failed(f"internal error: {error}")
        # Reached only when the life ended on its own: a host stop cancels past this line.
        life.life_ending()
        if ended == Life.EXITED:
            life.failed(_exit_error(process.returncode))
        on_end(ended)
    finally:
        life.life_ending()
        if connection is not None:
            connection.close_jobs()
        how = await launcher.stop(process, spec, plog)
        life.exited()
        limited.close()  # what the life's last windows held back, before its last line
        plog.info("connector.exited", returncode=process.returncode, how=how, ended=ended)
    return ended


def _session(spec: ConnectorConfig, process: Process, plog: Any, limited: LimitedLog) -> Session:
    """The JSON-RPC session over the child's pipes, under the connector's bounds; not running yet."""
    if process.stdin is None or process.stdout is None:  # spawn opens both pipes
        raise HostStateError(f"connector {spec.name} was spawned without its stdin and stdout pipes")
    return Session(
        process.stdin,
        process.stdout,
        log=plog,
        limited=limited,
        limits=SessionLimits(max_line_bytes=spec.max_line_bytes, timeout=spec.request_timeout_s),
    )


async def _serve_life(spec: ConnectorConfig, process: Process, connection: McplConnection, plog: Any,
                      limited: LimitedLog, handle: ConnectorHandle, on_ready: Callable[[], None]) -> str:
    """The session, the handshake and serving, until the life ends on its own; how it ended."""
    session = connection.session
    ended = Life.EXITED
    deaf = False
    handshaken = False
    async with anyio.create_task_group() as tg:

        async def end_if_deaf(interval: float) -> None:
            nonlocal deaf
            error = await ping_until_deaf(handle, interval, spec.ping_timeout_s)
            if error is not None:
                deaf = True
                plog.warning("connector.deaf", error=error, ping_interval_s=interval,
                             ping_timeout_s=spec.ping_timeout_s)
                handle.life.failed(error)
                tg.cancel_scope.cancel()

        drained = anyio.Event()
        tg.start_soon(_drain, process, plog, drained)
        tg.start_soon(_serve_until_output_ends, session, process, drained, spec, handle.life, tg.cancel_scope)
        tg.start_soon(connection.run_background)
        tg.start_soon(limited.run)
        try:
            await connection.handshake()
        except HandshakeFailed as exc:
            error = await _handshake_failure(exc, connection.mode, process)
            plog.error("connector.handshake_failed", error=error)
            handle.life.failed(error)
            ended = Life.HANDSHAKE_FAILED
            tg.cancel_scope.cancel()
        except PolicyClosed as exc:
            plog.warning("connector.policy_closed", reason=str(exc))
            handle.life.failed(f"closed after the connector refused the policy: {exc}")
            ended = Life.POLICY_CLOSED
            tg.cancel_scope.cancel()
        else:
            handshaken = True
            on_ready()
            if spec.expect_traffic_within_s is not None:
                tg.start_soon(watch_quiet, handle, plog)
            if spec.ping_interval_s is not None:
                tg.start_soon(end_if_deaf, spec.ping_interval_s)
            # Serve until the child's output ends (which cancels this scope), or
            # until the connector refuses a later policy with fallback "close".
            await connection.closed_by_policy.wait()
            handle.life.failed("closed after the connector refused a later policy")
            ended = Life.POLICY_CLOSED
            tg.cancel_scope.cancel()
    if ended == Life.EXITED and not handshaken:
        # The output's end ended the life (the scope cancelled) before the handshake's task resumed with its own
        # failure: the same outcome as that failure, whichever task got there first.
        error = _ended_unanswered(process.returncode, connection.mode)
        plog.error("connector.handshake_failed", error=error)
        handle.life.failed(error)
        return Life.HANDSHAKE_FAILED
    return Life.DEAF if deaf and ended == Life.EXITED else ended


def crash_error(exc: BaseException) -> str:
    """`Type: message` of the exception that crashed a life (the first of a group), bounded for `last_error`."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= CRASH_ERROR_CHARS else text[:CRASH_ERROR_CHARS] + "…"


def _exit_error(returncode: int | None) -> str:
    """Why a life whose output ended is over (the child normally exits right after closing its output)."""
    if returncode is None:
        return "the process closed its output"
    return f"the process {exit_description(returncode)}"


def _ended_unanswered(returncode: int | None, mode: Mode) -> str:
    """Why a handshake failed when the child's output ended first: what it left unanswered."""
    unanswered = "initialize" if mode is Mode.HANDSHAKE else "featureSets/update"
    return f"{_exit_error(returncode)} before answering {unanswered}"


async def _handshake_failure(exc: HandshakeFailed, mode: Mode, process: Process) -> str:
    """Why the handshake failed, in the operator's terms.

    A connection that died mid-handshake surfaces as a broken pipe or an
    ended output; the real cause is the process's exit, so say that.
    """
    if isinstance(exc.__cause__, ConnectionClosed) and await wait_exited(process, EXIT_CODE_WAIT_S):
        return _ended_unanswered(process.returncode, mode)
    if isinstance(exc.__cause__, RequestTimeout) and mode is Mode.HANDSHAKE:
        return f"{exc}{UNFLUSHED_HINT}"
    return str(exc)


#: A live connector that never answers initialize has most often written its answer into a stdout buffer that a
#: pipe (unlike a terminal) flushes only when full.
UNFLUSHED_HINT = ("; a connector must flush stdout after each line it writes (a pipe is not a terminal: "
                  "docs/connectors.md#1-wire-rules)")


#: After the child's output ends, how long its last stderr lines (often the traceback) may take.
STDERR_TAIL_S = 1.0


async def _drain(process: Process, plog: Any, drained: anyio.Event) -> None:
    try:
        await drain_stderr(process, plog)
    finally:
        drained.set()


async def _serve_until_output_ends(session: Session, process: Process, drained: anyio.Event,
                                   spec: ConnectorConfig, life: Lifecycle, scope: anyio.CancelScope) -> None:
    """Read the child's output; when it ends, let the child exit and its stderr drain, then end the life."""
    await session.run()
    life.life_ending()  # no call can reach it any more: refuse them now, not after the waits below
    await wait_exited(process, spec.stop_grace_s)
    with anyio.move_on_after(STDERR_TAIL_S):
        await drained.wait()
    scope.cancel()
