"""One owner task per connector: spawn, handshake, serve, and restart by the policy.

`supervise` runs inside the host's task group for as long as the host runs.
It reports `task_status.started()` once the first start has finished its
handshake (ready or MCP-only) or failed, which is what READY=1 waits for.
A crashing, hanging or chatty connector only ever affects its own task.

What counts as a failure (INTERFACES.md): every exit the host did not ask
for, whether or not the handshake had finished, plus a failed spawn or
handshake. A connection the host closed because the connector refused its
policy with fallback "close" is restarted only under `policy = "always"`.
"""

from __future__ import annotations

from typing import Any

import anyio
import structlog
from anyio.abc import Process, TaskStatus

from mcplhost.config import ConnectorConfig
from mcplhost.protocol.connection import HandshakeFailed, McplConnection, PolicyClosed
from mcplhost.protocol.intake import Intake
from mcplhost.rpc import Session

from .policy import GiveUp, RestartPolicy
from .process import child_environment, drain_stderr, spawn, stop, wait_exited

log = structlog.get_logger()


class Life:
    """How one process life ended."""

    SPAWN_FAILED = "spawn_failed"
    HANDSHAKE_FAILED = "handshake_failed"
    EXITED = "exited"
    POLICY_CLOSED = "policy_closed"


async def supervise(
    spec: ConnectorConfig,
    intake: Intake,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    clog = log.bind(connector=spec.name)
    policy = RestartPolicy(spec.restart)
    reported = False

    def report_started() -> None:
        nonlocal reported
        if not reported:
            reported = True
            task_status.started()

    while True:
        began = anyio.current_time()
        ended = await run_life(spec, intake, clog, on_ready=report_started)
        report_started()
        uptime = anyio.current_time() - began
        if ended == Life.POLICY_CLOSED and spec.restart.policy != "always":
            clog.warning("connector.stopped", reason="closed after the connector refused the policy")
            return
        if uptime >= spec.restart.window_s:
            policy.reset()
        decision = policy.failed(anyio.current_time())
        if isinstance(decision, GiveUp):
            clog.warning("connector.stopped", reason=decision.reason, last=ended)
            return
        if decision.slow_lane:
            clog.warning("connector.slow_lane", failures=decision.consecutive, delay_s=round(decision.delay, 3),
                         detail=f"crash loop: one start every {spec.restart.backoff_max_s:g} s until it stays up")
        else:
            clog.info("connector.restart_scheduled", failures=decision.consecutive, delay_s=round(decision.delay, 3))
        await anyio.sleep(decision.delay)


async def run_life(spec: ConnectorConfig, intake: Intake, clog: Any, *, on_ready: Any = lambda: None) -> str:
    """One process life: spawn, handshake, serve until the child ends, then the shutdown ladder."""
    try:
        process = await spawn(spec.command, env=child_environment(spec.env), cwd=spec.cwd)
    except OSError as exc:
        clog.error("connector.spawn_failed", command=spec.command, error=str(exc))
        return Life.SPAWN_FAILED
    plog = clog.bind(pid=process.pid)
    plog.info("connector.spawned", command=spec.command)
    connection = McplConnection(spec, intake, plog)
    session = Session(
        process.stdin,  # type: ignore[arg-type]
        process.stdout,  # type: ignore[arg-type]
        on_request=connection.on_request,
        on_notification=connection.on_notification,
        log=plog,
        max_line_bytes=spec.max_line_bytes,
        timeout=spec.request_timeout_s,
    )
    connection.attach(session)
    ended = Life.EXITED
    try:
        async with anyio.create_task_group() as tg:
            drained = anyio.Event()
            tg.start_soon(_drain, process, plog, drained)
            tg.start_soon(_serve_until_output_ends, session, process, drained, spec, tg.cancel_scope)
            tg.start_soon(connection.run_background)
            try:
                mode = await connection.handshake()
            except HandshakeFailed as exc:
                plog.error("connector.handshake_failed", error=str(exc))
                ended = Life.HANDSHAKE_FAILED
                tg.cancel_scope.cancel()
            except PolicyClosed as exc:
                plog.warning("connector.policy_closed", reason=str(exc))
                ended = Life.POLICY_CLOSED
                tg.cancel_scope.cancel()
            else:
                plog.info("connector.up", mode=mode.value)
                on_ready()
                # Serve until the child's output ends (which cancels this scope), or
                # until the connector refuses a later policy with fallback "close".
                await connection.closed_by_policy.wait()
                ended = Life.POLICY_CLOSED
                tg.cancel_scope.cancel()
    finally:
        connection.close_jobs()
        how = await stop(process, stdin_grace=spec.stop_grace_s, term_grace=spec.term_grace_s, log=plog)
        plog.info("connector.exited", returncode=process.returncode, how=how, ended=ended)
    return ended


#: After the child's output ends, how long its last stderr lines (often the traceback) may take.
STDERR_TAIL_S = 1.0


async def _drain(process: Process, plog: Any, drained: anyio.Event) -> None:
    try:
        await drain_stderr(process, plog)
    finally:
        drained.set()


async def _serve_until_output_ends(session: Session, process: Process, drained: anyio.Event,
                                   spec: ConnectorConfig, scope: anyio.CancelScope) -> None:
    """Read the child's output; when it ends, let the child exit and its stderr drain, then end the life."""
    await session.run()
    await wait_exited(process, spec.stop_grace_s)
    with anyio.move_on_after(STDERR_TAIL_S):
        await drained.wait()
    scope.cancel()
