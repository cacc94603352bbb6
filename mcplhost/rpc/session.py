"""The only async part of the rpc layer: move lines, park callers, answer requests.

`Session.run` reads the peer's output until it ends. Each request the peer
sends gets exactly one answer: the handler's result, the error object it
raised (`ReplyError`), -32603 for any other failure, or -32600 when the
request itself was malformed. Notifications are handed to their handler and
never answered. Responses are matched against our own outstanding ids only.

Request handlers run in the read loop, so each sees the connection exactly as
the messages before it left it (checks "at receipt" mean just that); they must
never wait on the network. A handler with slow work (a database commit)
returns `Deferred(work)`: the work then runs in its own task, at most
`max_concurrent` at once, and its result becomes the answer. Past that bound
the read loop waits, which pushes back on the peer through the pipe.

Stopping (the session's task cancelled, or the peer's output ended): work
already started is not cut off, because it may have reached a commit that
happens whatever its caller does. It runs shielded until it has queued its
answer, bounded from the moment of the stop (`ANSWER_ON_STOP_S`, or
`HANDLER_DRAIN_S` after the peer's output ended), and the writer task, also
shielded, sends every queued line before the session ends (`FLUSH_ON_STOP_S`).
Work not yet started never starts. So when `run` returns, every answer that
could be given has been written, and the caller may close the pipe.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import anyio
import structlog
from anyio.abc import ByteReceiveStream, ByteSendStream, TaskStatus
from msgspec import UNSET, Raw, UnsetType

from mcplhost.logs import LimitedLog

from .errors import ConnectionClosed, RemoteError, ReplyError, RequestTimeout, error_for
from .framing import MAX_LINE_BYTES, LineBuffer, Oversized
from .messages import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    ErrorResponse,
    Invalid,
    Notification,
    Request,
    RequestId,
    Response,
    decode_line,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
)
from .table import RequestTable, Settled

#: The id of the peer's request whose handler is running (read in the handler, e.g. for `inference/chunk`).
CURRENT_REQUEST_ID: ContextVar[RequestId | None] = ContextVar("CURRENT_REQUEST_ID", default=None)


class _Raised:
    """An outcome for a waiting caller that is to be raised, not returned."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Deferred:
    """A handler's answer that needs slow work: `work()` runs in its own task."""

    __slots__ = ("work",)

    def __init__(self, work: Callable[[], Awaitable[Any]]) -> None:
        self.work = work


RequestHandler = Callable[[str, Raw | UnsetType], Awaitable[Any]]
NotificationHandler = Callable[[str, Raw | UnsetType], Awaitable[None]]

#: Requests from one peer handled at once before the read loop waits.
MAX_CONCURRENT_REQUESTS = 256
#: Default wait for an answer to one of our requests.
DEFAULT_TIMEOUT_S = 10.0
#: After the peer's output ends, how long in-flight handlers may take to finish.
HANDLER_DRAIN_S = 5.0
#: When the session is cancelled (the host stops), how long work already running
#: may take to finish and queue its answer. Its rows are usually in the group
#: writer's current or next commit (milliseconds; a second or so on a slow disk
#: under a flood), and a commit that reached aiosqlite happens even if we stop
#: waiting, so its answer must still go out. The bound keeps a stuck store from
#: holding the stop; it is below the writer's DRAIN_S, so the writer outlives it.
ANSWER_ON_STOP_S = 5.0
#: After the last answer is queued, how long the writer may take to send what is
#: queued: milliseconds to a peer that reads; one that does not cannot hold the stop.
FLUSH_ON_STOP_S = 2.0
#: Read size from the pipe.
READ_CHUNK = 65536
#: Outgoing lines waiting for the writer before senders wait too.
MAX_QUEUED_LINES = 4096


async def _no_requests(method: str, params: Raw | UnsetType) -> Any:
    raise ReplyError(METHOD_NOT_FOUND, f"method not found: {method}")


async def _no_notifications(method: str, params: Raw | UnsetType) -> None:
    return None


class Session:
    def __init__(
        self,
        send: ByteSendStream,
        receive: ByteReceiveStream,
        *,
        on_request: RequestHandler = _no_requests,
        on_notification: NotificationHandler = _no_notifications,
        log: Any = None,
        limited: LimitedLog | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_concurrent: int = MAX_CONCURRENT_REQUESTS,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._send = send
        self._receive = receive
        self.on_request = on_request
        self.on_notification = on_notification
        self.log = log if log is not None else structlog.get_logger()
        #: Lines the peer causes per message go through this limiter (mcplhost.logs). Whoever passes it in
        #: runs and closes it; one made here is closed when `run` ends (no window roll-over lines before).
        self.limited = limited if limited is not None else LimitedLog(self.log)
        self._owns_limited = limited is None
        self._buffer = LineBuffer(max_line_bytes)
        # Deferred work runs on a pool of worker tasks that grows on demand up
        # to `max_concurrent`: starting a task per request costs more (in
        # anyio) than the work it waits for. The queue holds as many again.
        self._max_workers = max_concurrent
        self._workers = 0
        self._idle_workers = 0
        self._deferred_send, self._deferred_receive = anyio.create_memory_object_stream[
            tuple[Request, Deferred]](max_concurrent)
        self.timeout = timeout
        self._table = RequestTable()
        self._waiters: dict[int, Any] = {}
        # Outgoing lines go through one writer task: no lock per line, and the
        # lines queued while the read loop works leave in one write.
        self._out_send, self._out_receive = anyio.create_memory_object_stream[bytes](MAX_QUEUED_LINES)
        self._closed = False
        # The shielded scopes of work running now, and the time they must end by
        # (infinite until the session stops): see `_bound_in_flight`.
        self._in_flight: set[anyio.CancelScope] = set()
        self._stop_deadline = float("inf")
        self._writer_scope = anyio.CancelScope(shield=True)
        #: Exact counts of what the peer sent (the log shows only the first lines of each kind).
        self.stats = {"lines": 0, "requests": 0, "notifications": 0, "responses": 0, "junk": 0, "oversized": 0,
                      "invalid_requests": 0, "responses_unknown": 0, "responses_late": 0,
                      "notifications_failed": 0, "handler_failures": 0, "replies_undeliverable": 0}

    def statistics(self) -> dict[str, int]:
        """A snapshot of the exact counts (`stats`), for the status and metrics."""
        return dict(self.stats)

    # --- our side ------------------------------------------------------------

    async def request(
        self,
        method: str,
        params: Any = UNSET,
        *,
        timeout: float | None = None,
        at_receipt: Callable[[Raw | RemoteError], Any] | None = None,
    ) -> Any:
        """Send a request and wait for its result; raise on error, timeout or close.

        With `at_receipt`, the answer is handed to that function in the read
        loop the moment it arrives, before any later message is handled, and
        its return value (or exception) is what this call returns (raises).
        That is how a state change carried by an answer (a policy receipt)
        takes effect exactly between the messages the peer sent around it.
        A late answer (after the timeout) is never handed over.
        """
        if self._closed:
            raise ConnectionClosed(f"connection closed before {method}")
        wait = self.timeout if timeout is None else timeout
        request_id = self._table.open(method)
        send, receive = anyio.create_memory_object_stream[Any](1)
        self._waiters[request_id] = (send, at_receipt)
        try:
            await self._write(encode_request(request_id, method, params))
            try:
                with anyio.fail_after(wait):
                    outcome = await receive.receive()
            except TimeoutError:
                self._table.abandon(request_id)
                raise RequestTimeout(method, wait, request_id) from None
        finally:
            self._waiters.pop(request_id, None)
            send.close()
            receive.close()
        if isinstance(outcome, _Raised):
            raise outcome.error
        return outcome

    async def notify(self, method: str, params: Any = UNSET) -> None:
        await self._write(encode_notification(method, params))

    def notify_nowait(self, method: str, params: Any = UNSET) -> None:
        """Queue a notification without waiting (e.g. from an `at_receipt` function).

        Lines leave in the order they were queued, so a notification queued at
        receipt goes out before any answer to the messages that follow.
        Raises ConnectionClosed if it cannot be queued.
        """
        if self._closed:
            raise ConnectionClosed("connection closed")
        try:
            self._out_send.send_nowait(encode_notification(method, params))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ConnectionClosed(f"cannot queue {method}") from None

    async def _write(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionClosed("connection closed")
        try:
            try:
                self._out_send.send_nowait(data)
            except anyio.WouldBlock:
                await self._out_send.send(data)  # may also find the stream closed meanwhile
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ConnectionClosed("connection closed") from None

    async def _writer(self) -> None:
        """Send queued lines, joining whatever is queued into one write, until the queue closes.

        Shielded: a cancelled write would lose the lines it had taken, and the
        answers queued during a stop must still leave. `run` closes the queue
        and bounds this scope when no more answers can come.
        """
        with self._writer_scope:
            async for data in self._out_receive:
                pending = [data]
                while True:
                    try:
                        pending.append(self._out_receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                try:
                    await self._send.send(b"".join(pending))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self.log.info("rpc.write_failed", error=repr(exc), lines=len(pending))
                    self._out_receive.close()  # a sender waiting for room learns the connection is closed
                    self._close_waiters(f"write failed: {exc!r}")
                    return
        if self._writer_scope.cancelled_caught:
            self.log.warning("rpc.flush_abandoned", queued=self._out_receive.statistics().current_buffer_used,
                             reason="the peer did not take our last lines within the stop's bound")

    # --- the peer's side -------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Read until the peer's output ends or we are cancelled; answer what was started; fail every waiting caller."""
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(self._writer)
                try:
                    async with anyio.create_task_group() as handlers:
                        task_status.started()
                        try:
                            await self._read_loop(handlers)
                        except anyio.get_cancelled_exc_class():
                            self._bound_in_flight(ANSWER_ON_STOP_S)  # a stop: started work still answers
                            raise
                        # Output ended: let in-flight handlers (and what is queued for them) finish, within a bound.
                        self._deferred_send.close()
                        self._bound_in_flight(HANDLER_DRAIN_S)
                        handlers.cancel_scope.deadline = self._stop_deadline
                finally:
                    # No answer can be queued any more: the writer sends what is queued and ends, within a bound.
                    self._out_send.close()
                    self._writer_scope.deadline = anyio.current_time() + FLUSH_ON_STOP_S
        finally:
            self._out_send.close()
            self._out_receive.close()
            self._deferred_send.close()
            self._deferred_receive.close()  # the workers' clones are closed by the workers
            self._close_waiters("the peer's output ended")
            if self._owns_limited:
                self.limited.close()

    def _bound_in_flight(self, seconds: float) -> None:
        """Work running now (and any started later) must end within `seconds` from now."""
        self._stop_deadline = min(self._stop_deadline, anyio.current_time() + seconds)
        for scope in self._in_flight:
            scope.deadline = self._stop_deadline

    def _close_waiters(self, why: str) -> None:
        self._closed = True
        for request_id in self._table.close():
            waiter = self._waiters.get(request_id)
            if waiter is not None:
                waiter[0].send_nowait(_Raised(ConnectionClosed(why)))

    async def _read_loop(self, handlers: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                chunk = await self._receive.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                items = self._buffer.close()
                for item in items:
                    await self._dispatch(item, handlers)
                return
            for item in self._buffer.feed(chunk):
                await self._dispatch(item, handlers)

    async def _dispatch(self, item: bytes | Oversized, handlers: anyio.abc.TaskGroup) -> None:
        if isinstance(item, Oversized):
            self.stats["oversized"] += 1
            self.limited.warning("rpc.line_too_long", size=item.size, limit=item.limit,
                                 action="dropped; the connection goes on")
            return
        stats = self.stats
        stats["lines"] += 1
        message = decode_line(item)
        kind = type(message)  # exact-type dispatch: this runs once per line
        if kind is Request:
            stats["requests"] += 1
            await self._answer(message, handlers)  # type: ignore[arg-type]
        elif kind is Notification:
            stats["notifications"] += 1
            try:
                await self.on_notification(message.method, message.params)  # type: ignore[union-attr]
            except Exception as exc:  # a notification never gets an answer
                stats["notifications_failed"] += 1
                self.limited.warning("rpc.notification_failed", method=message.method, error=repr(exc))  # type: ignore[union-attr]
        elif kind is Response or kind is ErrorResponse:
            stats["responses"] += 1
            self._settle(message)  # type: ignore[arg-type]
        else:
            assert isinstance(message, Invalid)
            stats["junk"] += 1
            if message.owes_reply:
                stats["invalid_requests"] += 1
                await self._reply_error(message.reply_id, INVALID_REQUEST, message.reason)
            else:
                self.limited.warning("rpc.junk_line", reason=message.reason[:200],
                                     sample=item[:120].decode("utf-8", "replace"))

    def _settle(self, message: Response | ErrorResponse) -> None:
        settled, method = self._table.settle(message.id)
        if settled is not Settled.MATCHED:
            self.stats["responses_late" if settled is Settled.LATE else "responses_unknown"] += 1
            self.limited.warning("rpc.response_dropped", id=message.id, why=settled.value, method=method)
            return
        waiter = self._waiters.get(message.id)  # type: ignore[arg-type]
        if waiter is None:
            return
        send, at_receipt = waiter
        outcome: Any = message.result if isinstance(message, Response) else RemoteError(message.error)
        if at_receipt is not None:
            try:
                outcome = at_receipt(outcome)
            except Exception as exc:
                outcome = exc
        send.send_nowait(_Raised(outcome) if isinstance(outcome, BaseException) else outcome)

    async def _answer(self, request: Request, handlers: anyio.abc.TaskGroup) -> None:
        token = CURRENT_REQUEST_ID.set(request.id)
        try:
            result = await self.on_request(request.method, request.params)
        except Exception as exc:
            await self._reply_failure(request, exc)
            return
        finally:
            CURRENT_REQUEST_ID.reset(token)
        if isinstance(result, Deferred):
            if self._idle_workers == 0 and self._workers < self._max_workers:
                self._workers += 1
                self._idle_workers += 1  # counted idle from now, so one request starts one worker
                handlers.start_soon(self._deferred_worker)
            try:
                self._deferred_send.send_nowait((request, result))  # no yield while there is room
            except anyio.WouldBlock:
                await self._deferred_send.send((request, result))  # back-pressure on the read loop
            return
        await self._reply_result(request, result)

    async def _deferred_worker(self) -> None:
        async with self._deferred_receive.clone() as receive:
            async for request, deferred in receive:
                self._idle_workers -= 1
                try:
                    await self._finish_deferred(request, deferred)
                finally:
                    self._idle_workers += 1

    async def _finish_deferred(self, request: Request, deferred: Deferred) -> None:
        # Commit, then answer, shielded (STYLE §15): the work may have handed rows
        # to a commit that happens even if we are cancelled, so the answer must be
        # queued too. Bounded only once the session stops (`_bound_in_flight`):
        # until then a commit may wait as long as the writer needs.
        with anyio.CancelScope(shield=True, deadline=self._stop_deadline) as scope:
            self._in_flight.add(scope)
            try:
                try:
                    result = await deferred.work()
                except Exception as exc:
                    await self._reply_failure(request, exc)
                    return
                await self._reply_result(request, result)
            finally:
                self._in_flight.discard(scope)
        if scope.cancelled_caught:
            self.log.warning("rpc.answer_abandoned", method=request.method,
                             reason="the work did not finish within the stop's bound")

    async def _reply_failure(self, request: Request, exc: Exception) -> None:
        error = error_for(exc)
        if error.code == INTERNAL_ERROR:
            self.stats["handler_failures"] += 1
            self.limited.error("rpc.handler_failed", method=request.method, error=repr(exc))
        await self._reply_error(request.id, error.code, error.message, error.data)

    async def _reply_result(self, request: Request, result: Any) -> None:
        try:
            data = encode_result(request.id, result)
        except (TypeError, ValueError) as exc:  # a handler returned something unencodable
            self.stats["handler_failures"] += 1
            self.limited.error("rpc.result_unencodable", method=request.method, error=repr(exc))
            await self._reply_error(request.id, INTERNAL_ERROR, "internal error")
            return
        await self._send_reply(data, request.method)

    async def _reply_error(self, request_id: RequestId | None, code: int, message: str, data: Any = UNSET) -> None:
        await self._send_reply(encode_error(request_id, code, message, data), None)

    async def _send_reply(self, data: bytes, method: str | None) -> None:
        try:
            await self._write(data)
        except ConnectionClosed:
            self.stats["replies_undeliverable"] += 1
            self.limited.info("rpc.reply_undeliverable", method=method)
