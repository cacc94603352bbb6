"""The only async part of the rpc layer: move lines, park callers, answer requests.

`Session.run` reads the peer's output until it ends. Each request the peer
sends gets exactly one answer: the handler's result, the error object it
raised (`ReplyError`), -32603 for any other failure, or -32600 when the
request itself was malformed; the one exception is cancellable work the peer
cancelled (below). A line nested too deep, or one the decoder fails on, gets
-32700 to id null (`messages.decode_line`). Notifications are handed to their
handler and never answered. Responses are matched against our own
outstanding ids only.

Request handlers run in the read loop, so each sees the connection exactly as
the messages before it left it (checks "at receipt" mean just that); they must
never wait on the network. A handler with slow work (a database commit)
returns `Deferred(work)`: the work then runs on a worker, at most
`max_concurrent` at once (requests read together start together), and its
result becomes the answer. Past that bound the read loop waits, which pushes
back on the peer through the pipe; so does the byte budget (`max_pending_bytes`):
the lines of requests queued or running, and of the line being handled, count
until their answer is queued, and a line that would overflow it is not
handled (nor more read) until enough is answered.

A `Deferred(..., cancellable=True)` (work with no commit in it, e.g. an
inference) ends without an answer when the peer cancels its request
(`cancel_peer_request`, MCP's notifications/cancelled); `discard` runs for
deferred work that never starts, so what its handler reserved is given back.

Outgoing lines wait in one queue for the writer, bounded in lines and in
bytes (`max_outgoing_bytes`); past either, senders wait (the read loop too, for
its answers), so a peer that does not read its answers stops being read.

Our requests: `request(timeout)` bounds queueing, writing and the answer
together. A line still queued when its request times out is never written.

Our lines are bounded like the peer's (`max_line_bytes`): a request or
notification whose line would be longer is never written and raises
`LineTooLong` to its caller; an answer that would be longer is replaced by
a -32603 error saying so (`data.reason` "too_large"), so the peer's request
still gets exactly one answer.
A write the peer does not take within `write_stall_s` breaks the connection
(the line may be cut in the middle, so nothing more can follow it): `run`
returns as if the peer's output had ended.

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
from typing import Any, TypeVar, overload

import anyio
import structlog
from anyio.abc import ByteReceiveStream, ByteSendStream, TaskStatus
from msgspec import UNSET, Raw, UnsetType

from mcplhost.logs import LimitedLog

from .errors import ConnectionClosed, LineTooLong, RemoteError, ReplyError, RequestTimeout, error_for
from .framing import LineBuffer, Oversized
from .limits import DEFAULT_LIMITS, MAX_QUEUED_LINES, READ_CHUNK, SessionLimits
from .messages import (
    INTERNAL_ERROR,
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
    valid_id,
)
from .outgoing import OutgoingLines
from .table import RequestTable, Settled

#: The reason an answer too long to write is replaced by (-32603, docs/connectors.md §15).
TOO_LARGE = "too_large"


#: What a request's `at_receipt` makes of its answer, and so what the request returns.
_Received = TypeVar("_Received")


class _Raised:
    """An outcome for a waiting caller that is to be raised, not returned."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Deferred:
    """A handler's answer that needs slow work: `work()` runs on a worker.

    `discard` is called instead when the work will never start (the session
    stopped first, or the peer cancelled it); `cancellable` work may be cut
    off by the peer's cancellation, so it must not hold a commit.
    """

    __slots__ = ("work", "discard", "cancellable")

    def __init__(self, work: Callable[[], Awaitable[Any]], *, discard: Callable[[], None] | None = None,
                 cancellable: bool = False) -> None:
        self.work = work
        self.discard = discard
        self.cancellable = cancellable

    def dropped(self) -> None:
        if self.discard is not None:
            self.discard()


class _Queued:
    """One peer request handed to the workers: its deferred work and the budget its line holds."""

    __slots__ = ("request", "deferred", "size", "cancelled", "scope")

    def __init__(self, request: Request, deferred: Deferred, size: int) -> None:
        self.request, self.deferred, self.size = request, deferred, size
        self.cancelled = False
        self.scope: anyio.CancelScope | None = None


class _RequestLine:
    """One of our request lines in the outgoing queue; a timed-out one is skipped, never written."""

    __slots__ = ("data", "abandoned")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.abandoned = False


RequestHandler = Callable[[str, Raw | UnsetType], Awaitable[Any]]
NotificationHandler = Callable[[str, Raw | UnsetType], Awaitable[None]]

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
        limits: SessionLimits = DEFAULT_LIMITS,
    ) -> None:
        max_concurrent = limits.max_concurrent
        self._send = send
        self._receive = receive
        self.on_request = on_request
        self.on_notification = on_notification
        self.log = log if log is not None else structlog.get_logger()
        #: Lines the peer causes per message go through this limiter (mcplhost.logs). Whoever passes it in
        #: runs and closes it; one made here is closed when `run` ends (no window roll-over lines before).
        self.limited = limited if limited is not None else LimitedLog(self.log)
        self._owns_limited = limited is None
        self._buffer = LineBuffer(limits.max_line_bytes)
        #: The id of the peer's request whose handler is running, None between handlers (read in the handler,
        #: e.g. for `inference/chunk`). An attribute, not a ContextVar: handlers run one at a time in the read loop.
        self.current_request_id: RequestId | None = None
        self.max_line_bytes = limits.max_line_bytes  # our own lines too: a longer one is never written
        # Deferred work runs on a pool of worker tasks that grows on demand up
        # to `max_concurrent`: starting a task per request costs more (in
        # anyio) than the work it waits for. The queue holds as many again.
        self._max_workers = max_concurrent
        self._workers = 0
        self._idle_workers = 0
        self._untaken = 0  # items queued for the workers that no worker has taken yet
        self._deferred_send, self._deferred_receive = anyio.create_memory_object_stream[_Queued](max_concurrent)
        # Cancellable work by the peer's request id, queued or running (`cancel_peer_request`).
        self._cancellable: dict[RequestId, _Queued] = {}
        self._max_pending_bytes = limits.max_pending_bytes
        self._pending_bytes = 0
        self._budget_freed = anyio.Event()
        self._reading_paused = False
        self.timeout = limits.timeout
        self.write_stall_s = limits.write_stall_s
        self._broken = False
        self._read_scope = anyio.CancelScope()
        self._table = RequestTable()
        self._waiters: dict[int, Any] = {}
        # Outgoing lines go through one writer task: no lock per line, and the
        # lines queued while the read loop works leave in one write.
        self._outgoing = OutgoingLines[bytes | _RequestLine](MAX_QUEUED_LINES)
        self._max_outgoing_bytes = limits.max_outgoing_bytes
        self._outgoing_bytes = 0
        self._outgoing_room = anyio.Event()
        self._closed = False
        # The shielded scopes of work running now, and the time they must end by
        # (infinite until the session stops): see `_bound_in_flight`.
        self._in_flight: set[anyio.CancelScope] = set()
        self._stop_deadline = float("inf")
        self._writer_scope = anyio.CancelScope(shield=True)
        #: Exact counts of what the peer sent (the log shows only the first lines of each kind).
        self.stats = {"lines": 0, "requests": 0, "notifications": 0, "responses": 0, "junk": 0, "oversized": 0,
                      "too_deep": 0, "undecodable": 0, "cancelled": 0, "budget_pauses": 0, "write_stalls": 0,
                      "invalid_requests": 0, "responses_unknown": 0, "responses_late": 0,
                      "notifications_failed": 0, "handler_failures": 0, "replies_undeliverable": 0,
                      "outgoing_too_long": 0}

    def statistics(self) -> dict[str, int | bool]:
        """The exact counts (`stats`), and the budget as it stands: bytes held, and whether reading waits for it."""
        return {**self.stats, "pending_bytes": self._pending_bytes, "reading_paused": self._reading_paused,
                "outgoing_bytes": self._outgoing_bytes, "workers": self._workers}

    # --- our side ------------------------------------------------------------

    @overload
    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      at_receipt: None = None) -> Any: ...

    @overload
    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      at_receipt: Callable[[Raw | RemoteError], _Received]) -> _Received: ...

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
        data = encode_request(request_id, method, params)
        if self._too_long(data, method):
            self._table.forget(request_id)
            raise LineTooLong(method, len(data) - 1, self.max_line_bytes)
        send, receive = anyio.create_memory_object_stream[Any](1)
        self._waiters[request_id] = (send, at_receipt)
        line = _RequestLine(data)
        try:
            try:
                with anyio.fail_after(wait):  # the whole request: queueing, writing, the answer
                    await self._write(line)
                    outcome = await receive.receive()
            except TimeoutError:
                line.abandoned = True  # still queued: never written
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
        """Send a notification; LineTooLong (nothing written) when its line would pass the cap."""
        await self._write(self._notification(method, params))

    def _notification(self, method: str, params: Any) -> bytes:
        data = encode_notification(method, params)
        if self._too_long(data, method):
            raise LineTooLong(method, len(data) - 1, self.max_line_bytes)
        return data

    def _too_long(self, data: bytes, method: str | None) -> bool:
        """Whether `data` (one line, its newline included) is longer than the cap; counted and logged if so."""
        if len(data) - 1 <= self.max_line_bytes:
            return False
        self.stats["outgoing_too_long"] += 1
        self.limited.warning("rpc.outgoing_too_long", method=method, bytes=len(data) - 1, limit=self.max_line_bytes)
        return True

    def notify_nowait(self, method: str, params: Any = UNSET) -> None:
        """Queue a notification without waiting (e.g. from an `at_receipt` function).

        Lines leave in the order they were queued, so a notification queued at
        receipt goes out before any answer to the messages that follow.
        Raises ConnectionClosed if it cannot be queued, LineTooLong if its line would pass the cap.
        """
        if self._closed:
            raise ConnectionClosed("connection closed")
        data = self._notification(method, params)
        try:
            self._outgoing.put_nowait(data)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ConnectionClosed(f"cannot queue {method}") from None
        self._outgoing_bytes += len(data)  # not held back by the byte bound: these are small and must go first

    def _queued_nowait(self, data: bytes) -> bool:
        """Queue one line if that needs no wait (room in lines and bytes, the connection open); False: use `_write`."""
        size = len(data)
        if self._closed or self._outgoing_bytes + size > self._max_outgoing_bytes or not self._outgoing.offer(data):
            return False
        self._outgoing_bytes += size
        return True

    async def _write(self, data: bytes | _RequestLine) -> None:
        """Queue one line; wait while the queue is full, in lines or in bytes (one line always fits)."""
        size = len(data) if type(data) is bytes else len(data.data)  # type: ignore[union-attr]
        if self._outgoing_bytes + size > self._max_outgoing_bytes:
            while self._outgoing_bytes and self._outgoing_bytes + size > self._max_outgoing_bytes \
                    and not self._closed:
                if self._outgoing_room.is_set():
                    self._outgoing_room = anyio.Event()
                await self._outgoing_room.wait()
        if self._closed:
            raise ConnectionClosed("connection closed")
        try:
            try:
                self._outgoing.put_nowait(data)
            except anyio.WouldBlock:
                await self._outgoing.put(data)  # may also find the queue closed meanwhile
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ConnectionClosed("connection closed") from None
        self._outgoing_bytes += size

    def _written(self, size: int) -> None:
        self._outgoing_bytes -= size
        self._outgoing_room.set()

    async def _writer(self) -> None:
        """Send queued lines, joining whatever is queued into one write, until the queue closes.

        Shielded: a cancelled write would lose the lines it had taken, and the
        answers queued during a stop must still leave. `run` closes the queue
        and bounds this scope when no more answers can come.
        """
        with self._writer_scope:
            while lines := await self._outgoing.take():
                pending: list[bytes] = []
                taken = 0
                for item in lines:
                    if type(item) is _RequestLine:
                        taken += len(item.data)
                        if not item.abandoned:
                            pending.append(item.data)
                    else:
                        taken += len(item)  # type: ignore[arg-type]
                        pending.append(item)  # type: ignore[arg-type]
                if not pending:
                    self._written(taken)
                    continue
                try:
                    with anyio.move_on_after(self.write_stall_s) as stall:
                        await self._send.send(b"".join(pending))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self.log.info("rpc.write_failed", error=repr(exc), lines=len(pending))
                    self._outgoing.abandon()  # a sender waiting for room learns the connection is closed
                    self._close_waiters(f"write failed: {exc!r}")
                    return
                if stall.cancelled_caught:
                    self._break(f"the peer took no write for {self.write_stall_s:g} s", lines=len(pending))
                    return
                self._written(taken)
        if self._writer_scope.cancelled_caught:
            self.log.warning("rpc.flush_abandoned", queued=len(self._outgoing),
                             reason="the peer did not take our last lines within the stop's bound")

    def _break(self, why: str, **fields: Any) -> None:
        """The connection cannot go on (a write cut in the middle): fail every caller, stop reading."""
        self.stats["write_stalls"] += 1
        self.log.warning("rpc.connection_broken", reason=why, **fields)
        self._broken = True
        self._outgoing.abandon()
        self._close_waiters(why)
        self._read_scope.cancel()

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
                            with self._read_scope:
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
                    self._outgoing.close()
                    self._writer_scope.deadline = anyio.current_time() + FLUSH_ON_STOP_S
        finally:
            self._outgoing.close()
            self._outgoing.abandon()
            self._deferred_send.close()
            self._discard_queued()
            self._deferred_receive.close()  # the workers' clones are closed by the workers
            self._close_waiters("the connection is broken" if self._broken else "the peer's output ended")
            if self._owns_limited:
                self.limited.close()

    def _discard_queued(self) -> None:
        """Work that never started gives back what its handler reserved."""
        while True:
            try:
                queued = self._deferred_receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            self._done_with(queued)
            queued.deferred.dropped()

    def _bound_in_flight(self, seconds: float) -> None:
        """Work running now (and any started later) must end within `seconds` from now."""
        self._stop_deadline = min(self._stop_deadline, anyio.current_time() + seconds)
        for scope in self._in_flight:
            scope.deadline = self._stop_deadline

    def _close_waiters(self, why: str) -> None:
        self._closed = True
        self._outgoing_room.set()  # a sender waiting for room learns the connection is closed
        for request_id in self._table.close():
            waiter = self._waiters.get(request_id)
            if waiter is not None:
                waiter[0].send_nowait(_Raised(ConnectionClosed(why)))

    async def _read_loop(self, handlers: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                chunk = await self._receive.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                await self._dispatch(self._buffer.close(), handlers)
                return
            await self._dispatch(self._buffer.feed(chunk), handlers)

    async def _dispatch(self, items: list[bytes | Oversized], handlers: anyio.abc.TaskGroup) -> None:
        """Handle the lines of one read in order (one call for them all: this is the loop every line takes)."""
        stats = self.stats
        stats["lines"] += len(items)  # an oversized report is taken back below
        outgoing = self._outgoing
        # Read once a read, not once a line: set before `run`, and constant while it runs.
        on_request, max_line_bytes, max_outgoing_bytes = self.on_request, self.max_line_bytes, self._max_outgoing_bytes
        for item in items:
            if isinstance(item, Oversized):
                stats["lines"] -= 1
                stats["oversized"] += 1
                self.limited.warning("rpc.line_too_long", size=item.size, limit=item.limit,
                                     action="dropped; the connection goes on")
                continue
            size = len(item)
            if self._pending_bytes + size > self._max_pending_bytes:
                await self._wait_for_budget(size)
            # The line's bytes count while it is handled here, and past that while its deferred
            # work runs. Given back here with no event: only this task ever waits for the budget.
            self._pending_bytes += size
            message = decode_line(item)
            # Exact-type dispatch (this runs once per line); `type(x) is C` also narrows for the type checker.
            if type(message) is Request:
                # Answered here, in as few awaits as it takes (this runs once per request): the handler's
                # own, and a wait for the writer only when its queue is full.
                stats["requests"] += 1
                self.current_request_id = message.id
                try:
                    result = await on_request(message.method, message.params)
                except Exception as exc:
                    self.current_request_id = None
                    await self._reply_failure(message, exc)
                else:
                    self.current_request_id = None
                    if type(result) is Deferred:
                        if await self._defer(message, result, handlers, size):
                            continue  # handed to a worker, which gives the bytes back
                    else:
                        # `_result_line`, inlined for the usual answer: it is called only when that one cannot go.
                        try:
                            data = encode_result(message.id, result)
                        except (TypeError, ValueError):
                            data = self._result_line(message, result)
                        if len(data) - 1 > max_line_bytes:
                            data = self._result_line(message, result)
                        # `_queued_nowait`, inlined: no wait, so no coroutine for the write.
                        out = len(data)
                        if (not self._closed and self._outgoing_bytes + out <= max_outgoing_bytes
                                and outgoing.offer(data)):
                            self._outgoing_bytes += out
                        else:
                            await self._send_reply(data, message.method)
            elif type(message) is Notification:
                stats["notifications"] += 1
                try:
                    await self.on_notification(message.method, message.params)
                except Exception as exc:  # a notification never gets an answer
                    stats["notifications_failed"] += 1
                    self.limited.warning("rpc.notification_failed", method=message.method, error=repr(exc))
            elif type(message) is Response or type(message) is ErrorResponse:
                stats["responses"] += 1
                self._settle(message)
            else:
                assert isinstance(message, Invalid)
                stats[message.stat] += 1
                if message.stat != "junk":  # hostile rather than a banner: said, within the limiter
                    self.limited.warning("rpc.line_refused", reason=message.reason[:200], size=size)
                if message.owes_reply:
                    stats["invalid_requests"] += 1
                    await self._reply_error(message.reply_id, message.code, message.reason)
                else:
                    self.limited.warning("rpc.junk_line", reason=message.reason[:200],
                                         sample=item[:120].decode("utf-8", "replace"))
            self._pending_bytes -= size

    async def _wait_for_budget(self, size: int) -> None:
        """Stop reading until `size` more bytes fit (a line alone always fits: the budget is at least one line)."""
        self.stats["budget_pauses"] += 1
        self._reading_paused = True
        try:
            while self._pending_bytes and self._pending_bytes + size > self._max_pending_bytes:
                self._budget_freed = anyio.Event()
                await self._budget_freed.wait()
        finally:
            self._reading_paused = False

    def _done_with(self, queued: _Queued) -> None:
        """A worker is done with `queued` (or it never ran): its bytes go back, waking a waiting reader."""
        self._pending_bytes -= queued.size
        if self._reading_paused:
            self._budget_freed.set()
        if self._cancellable.get(queued.request.id) is queued:
            del self._cancellable[queued.request.id]

    def cancel_peer_request(self, request_id: Any) -> bool:
        """The peer cancelled its request `request_id`: end its cancellable work, with no answer.

        False when no such work is queued or running (unknown, finished, or
        work that may not be cut off): the request is answered as usual.
        """
        if not valid_id(request_id):
            return False
        queued = self._cancellable.get(request_id)
        if queued is None or queued.cancelled:
            return False
        queued.cancelled = True
        self.stats["cancelled"] += 1
        if queued.scope is not None:
            queued.scope.cancel()
        return True

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

    async def _defer(self, request: Request, result: Deferred, handlers: anyio.abc.TaskGroup, size: int) -> bool:
        """Hand `request`'s deferred work to the workers (True: its `size` is then theirs to release)."""
        queued = _Queued(request, result, size)
        if result.cancellable:
            self._cancellable.setdefault(request.id, queued)
        try:
            self._deferred_send.send_nowait(queued)  # no yield while there is room
        except anyio.WouldBlock:
            await self._deferred_send.send(queued)  # back-pressure on the read loop
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._done_with(queued)
            result.dropped()
            return True
        # One worker per queued item not yet taken: requests read in one chunk start together, and a
        # quick one is never left behind slow ones (a push written after inferences). A worker
        # counts as idle until it takes an item, and an item as untaken until then, also one handed
        # straight to a waiting worker (the stream's buffer never holds that one).
        self._untaken += 1
        if self._untaken > self._idle_workers and self._workers < self._max_workers:
            self._workers += 1
            self._idle_workers += 1
            handlers.start_soon(self._deferred_worker)
        return True

    async def _deferred_worker(self) -> None:
        async with self._deferred_receive.clone() as receive:
            async for queued in receive:
                self._untaken -= 1
                self._idle_workers -= 1
                try:
                    if queued.cancelled:
                        queued.deferred.dropped()
                    else:
                        await self._finish_deferred(queued)
                finally:
                    self._done_with(queued)
                    self._idle_workers += 1

    async def _finish_deferred(self, queued: _Queued) -> None:
        request, deferred = queued.request, queued.deferred
        # Commit, then answer, shielded: the work may have handed rows
        # to a commit that happens even if we are cancelled, so the answer must be
        # queued too. Bounded only once the session stops (`_bound_in_flight`):
        # until then a commit may wait as long as the writer needs.
        with anyio.CancelScope(shield=True, deadline=self._stop_deadline) as scope:
            queued.scope = scope  # the peer's cancellation cancels this scope itself, shield or not
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
        if queued.cancelled:
            self.limited.info("rpc.request_cancelled", method=request.method, id=request.id)
        elif scope.cancelled_caught:
            self.log.warning("rpc.answer_abandoned", method=request.method,
                             reason="the work did not finish within the stop's bound")

    async def _reply_failure(self, request: Request, exc: Exception) -> None:
        error = error_for(exc)
        if error.code == INTERNAL_ERROR:
            self.stats["handler_failures"] += 1
            self.limited.error("rpc.handler_failed", method=request.method, error=repr(exc))
        await self._reply_error(request.id, error.code, error.message, error.data)

    async def _reply_result(self, request: Request, result: Any) -> None:
        await self._send_reply(self._result_line(request, result), request.method)

    def _result_line(self, request: Request, result: Any) -> bytes:
        """The answer's line: `result`, or -32603 when the handler returned something unencodable or too long."""
        try:
            data = encode_result(request.id, result)
        except (TypeError, ValueError) as exc:
            self.stats["handler_failures"] += 1
            self.limited.error("rpc.result_unencodable", method=request.method, error=repr(exc))
            return encode_error(request.id, INTERNAL_ERROR, "internal error")
        if len(data) - 1 > self.max_line_bytes and self._too_long(data, request.method):  # a call only when long
            return encode_error(request.id, INTERNAL_ERROR, "result too large to send",
                                {"reason": TOO_LARGE, "bytes": len(data) - 1, "limit": self.max_line_bytes})
        return data

    async def _reply_error(self, request_id: RequestId | None, code: int, message: str, data: Any = UNSET) -> None:
        line = encode_error(request_id, code, message, data)
        if self._too_long(line, None):  # a handler's error data: the bare error still answers the request
            line = encode_error(request_id, code, "error too large to send", {"reason": TOO_LARGE})
        await self._send_reply(line, None)

    async def _send_reply(self, data: bytes, method: str | None) -> None:
        if self._queued_nowait(data):  # the usual case: no wait, so no coroutine for the write
            return
        try:
            await self._write(data)
        except ConnectionClosed:
            self.stats["replies_undeliverable"] += 1
            self.limited.info("rpc.reply_undeliverable", method=method)
