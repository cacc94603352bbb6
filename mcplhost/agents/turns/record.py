"""How a turn ends: its progress so far, the end it comes to as a value, and the one write that records it.

    progress = TurnProgress(conversation=...)            # filled in as the turn goes
    committed = await write_end(deps, agent, progress, TurnEnding(outcome=OUTCOME_COMPLETED, first=final), cursor)
    result = progress.result(seconds)                     # what run_turn returns (agents/turns/runner.py)

Every way a turn ends (completed, held by the token budget, failed, aborted
by a shutdown or a stop) is a `TurnEnding`: its outcome, why, and the writes that
lead the record (the final prose's publishes, the held items' decisions, the
`turn-failed` notice and the failure reply, the stopped turn's unsent
publishes). `write_end` commits them with `FinishTurn` and, unless the end
leaves it, `SetCursor`, in one transaction (docs/agents.md#turns). A failed
turn's end is built by `failed_end`, once `failure_cause` has logged why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from mcplhost.agents.model import BackendError, Usage
from mcplhost.agents.turns.failure_reply import failure_reply
from mcplhost.agents.turns.reply import TurnSpeech
from mcplhost.agents.turns.turn_services import TurnDeps
from mcplhost.config import AgentConfig
from mcplhost.speech.typing import Typing
from mcplhost.store import NewItem
from mcplhost.store.operations import FinishTurn, InsertItems, Operation, SetCursor
from mcplhost.store.own_rows import notice_row
from mcplhost.store.rows import TurnFailedNotice
from mcplhost.store.turns import REASON_BACKEND_ERROR, REASON_INTERNAL_ERROR
from mcplhost.store.writer import Committed
from mcplhost.tracebacks import bounded_traceback

log = structlog.get_logger()

OUTCOME_COMPLETED = "completed"
OUTCOME_FAILED = "failed"
OUTCOME_ABORTED = "aborted"
OUTCOME_HELD = "held"


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one turn came to, as its turns row records it: returned by `run_turn`, which never raises for it."""

    turn_id: int  # 0: the turn ended before it was begun (its record could not be written)
    outcome: str
    reason: str | None = None  # why it ended other than completed (the turns row's `reason`)
    cause: str | None = None  # a failed turn's finer cause (the turns row's `cause`)
    model: str | None = None
    calls: int = 0  # backend calls made
    usage: Usage = Usage()
    seconds: float = 0.0


class TurnEnding(msgspec.Struct, frozen=True, kw_only=True):
    """How a turn ends, before it is written: its outcome, why, and the writes that lead its record."""

    outcome: str
    reason: str | None = None
    cause: str | None = None
    first: tuple[Operation[Any], ...] = ()  # lead the write: publishes, decisions, failed publishes
    rows: tuple[NewItem, ...] = ()  # the turn's last rows (a failed turn's notice)
    moves_cursor: bool = True  # False: the wake was not handled (a shutdown), the cursor stays


@dataclass
class TurnProgress:
    """What the turn has done so far, for the record whatever way it ends."""

    turn_id: int = 0
    model: str | None = None
    digest: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0
    open_inference: str | None = None  # an inference with `started` sent and no terminal phase yet
    injections: Any = None  # the hook injections of the first request (JSON-able), kept with the turn
    conversation: str | None = None  # the wake's one conversation, which the turn's rows belong to
    speech: TurnSpeech | None = None  # the turn's speech routing, once the waking items are read
    turn_rows_after: int | None = None  # the newest row id when the turn began: rows above it are its own
    typing: Typing | None = None  # the turn's typing indicator (speech/typing.py), started once routing is decided
    end: TurnEnding | None = None  # how it ended, once its end is written
    #: The turn's `BeginTurn`, queued and not yet awaited: returns its id once committed (runner.py `turn_begun`).
    begin: Callable[[], Awaitable[int]] | None = None

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_tokens += usage.cached_tokens

    def usage(self) -> dict[str, int] | None:
        if not self.calls:
            return None
        return {"inputTokens": self.input_tokens, "outputTokens": self.output_tokens,
                "cachedTokens": self.cached_tokens}

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def reason(self) -> str | None:
        return self.end.reason if self.end is not None else None

    def result(self, outcome: str, seconds: float) -> TurnResult:
        end = self.end
        return TurnResult(turn_id=self.turn_id, outcome=outcome, reason=end.reason if end else None,
                          cause=end.cause if end else None, model=self.model, calls=self.calls,
                          usage=Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                                      cached_tokens=self.cached_tokens), seconds=seconds)


async def write_end(deps: TurnDeps, agent: AgentConfig, progress: TurnProgress, end: TurnEnding,
                    cursor: Callable[[], int | None] | None) -> Committed:
    """The turn's end: its leading writes, its last rows, its turns record and the agent's cursor, in one commit.

    `cursor` is asked here, just before the write: the cursor it gives
    counts what was handled up to now (None, or an end that leaves the
    cursor: no SetCursor).
    """
    operations: list[Operation[Any]] = list(end.first)
    if end.rows:
        operations.append(InsertItems(list(end.rows)))
    ended = deps.clock_ms()
    progress.end = end
    operations.append(FinishTurn(progress.turn_id, ended, end.outcome, progress.model, progress.usage(),
                                 progress.digest, injections=progress.injections, reason=end.reason,
                                 cause=end.cause))
    position = cursor() if cursor is not None and end.moves_cursor else None
    if position is not None:
        operations.append(SetCursor(agent.name, position, ended))
    committed = await deps.writer.submit(*operations)
    if deps.rows is not None:
        deps.rows.feed_committed(operations, committed)
    return committed


def failure_cause(agent: AgentConfig, progress: TurnProgress, exc: Exception) -> tuple[str, str]:
    """Log why the turn failed (a bounded traceback for anything but a BackendError); its cause and its reason.

    The cause (the exception's reason or type) is the notice's and the log
    line's; the reason (`backend_error` or `internal_error`) the turns row's.
    """
    cause = exc.reason if isinstance(exc, BackendError) else type(exc).__name__
    detail = {} if isinstance(exc, BackendError) else {"traceback": bounded_traceback(exc)}
    log.warning("agent.turn_failed", agent=agent.name, turn=progress.turn_id, reason=cause, **detail)
    return cause, REASON_BACKEND_ERROR if isinstance(exc, BackendError) else REASON_INTERNAL_ERROR


def failed_end(agent: AgentConfig, progress: TurnProgress, cause: str, reason: str, clock_ms: Callable[[], int],
               ) -> TurnEnding:
    """A failed (and begun) turn's end: a `turn-failed` notice for the agent and its failure reply
    (agents/turns/failure_reply.py) in the same write as its record."""
    notice = notice_row(agent.name, TurnFailedNotice(reason=cause), failure_notice_text(cause, progress),
                        created_at=clock_ms(), conversation_id=progress.conversation)
    reply = failure_reply(agent, progress.speech, turn_id=progress.turn_id, at=clock_ms())
    return TurnEnding(outcome=OUTCOME_FAILED, reason=reason, cause=cause, first=tuple(reply), rows=(notice,))


def failure_notice_text(reason: str, progress: TurnProgress) -> str:
    """What a failed turn's notice tells the agent: prose queued before an earlier round's tool calls was sent."""
    queued = progress.speech.queued if progress.speech is not None else 0
    if not queued:
        return f"Your last turn failed ({reason}); nothing of it was sent."
    said = "the publish" if queued == 1 else f"the {queued} publishes"
    return f"Your last turn failed ({reason}); {said} queued before the failure went out, the rest was not sent."
