"""One agent turn, in order: compile, hooks, backend, tools, record (docs/agents.md#turns).

    result = await run_turn(agent, wake, deps, state)   # a TurnResult: outcome, reason, cause, usage, ...

The steps, each delegated to the module that owns its rule:

1. `BeginTurn` gives the turn its id (store/operations.py): queued at once and
   awaited only after the first compile, before the first backend call, so it
   commits while the context is read and compiled (`turn_begun`); the speech
   routed meanwhile takes the id then, before anything of it is written.
2. The agent's rows come from the host's row cache (turns/row_cache.py: fed
   as they commit, else read), or store.items.context_rows; the one-time
   provenance notice is stored when the context needs it (turns/compiler.py),
   in the BeginTurn's commit or the one after, and joins the rows read. Then typing starts where the route is decided (speech/typing.py, stopped
   however the turn ends) and the waking addressed items are acknowledged in
   the background (agents/turns/acknowledge.py; docs/agents.md#typing-and-acknowledge).
3. Per backend call: hooks (`before_inference`), lifecycle `started`, the
   pure compile (`compile_request`), the backend, then exactly one terminal
   lifecycle phase (`completed`, `failed` or `aborted`) whatever happens.
4. Tool calls run in order through the agent's `ToolBox`; the calls and their
   results are stored as they happen (so a crash leaves a call the compiler
   closes with a synthetic `interrupted` result), at most `max_tool_rounds`.
5. The final prose, routed by mcplhost/agents/turns/reply.py (publishes with
   their outbox rows, or drafts and a `drafts` notice), `FinishTurn` and
   `SetCursor` commit in one write; the senders are notified after it.
   Prose a round writes before its tool calls is routed and queued before
   those calls run.
6. After each tool round, peer messages queued for the agent with dispatch
   `tool-end` are delivered into the turn (mcplhost/peers/service.py), so the
   next backend call reads them.

The turn returns its `TurnResult` (turns/record.py); every way it ends is a
`TurnEnding` value, written once with the turn's record and the cursor. A
failed turn stores a `turn-failed` notice and logs the cause; it never
raises (the runtime keeps serving every agent). A cancelled turn (host
shutdown, or a stop command) sends lifecycle `aborted` and records outcome
`aborted` in a shielded, bounded write, then lets the cancellation through.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import structlog

from mcplhost.agents.backends.answer_bounds import not_run_text, split_tool_calls
from mcplhost.agents.model import ModelResponse, Usage
from mcplhost.agents.turns.acknowledge import acknowledge_wake
from mcplhost.agents.turns.agent_rows import tool_call_row, tool_result_row
from mcplhost.agents.turns.compiler import Injections, compile_request, needs_notice
from mcplhost.agents.turns.hooks import before_inference, lifecycle
from mcplhost.agents.turns.record import (
    OUTCOME_ABORTED,
    OUTCOME_COMPLETED,
    OUTCOME_FAILED,
    OUTCOME_HELD,
    TurnEnding,
    TurnProgress,
    TurnResult,
    failed_end,
    failure_cause,
    write_end,
)
from mcplhost.agents.turns.reply import TurnSpeech
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.decision_recorder import decisions_of
from mcplhost.agents.wakes.rules import Wake
from mcplhost.config import AgentConfig
from mcplhost.inbound.notice import reader_text
from mcplhost.speech.streaming import Streamer, stream_targets
from mcplhost.speech.typing import Typing, typing_target
from mcplhost.store import NewItem, StoredItem
from mcplhost.store.items import ItemWritten
from mcplhost.store.operations import (
    BeginTurn,
    FailTurnPublishes,
    InsertItems,
    RecordWakeDecisions,
)
from mcplhost.store.own_rows import source_notice_row
from mcplhost.store.turns import (
    DAY_MS,
    REASON_SHUTDOWN,
    REASON_STOPPED,
    REASON_TOKEN_BUDGET,
)

log = structlog.get_logger()

#: Rows read for one compile; the compiler then bounds them by `context_chars`.
CONTEXT_ROWS = 2000
#: How long the final write of a cancelled turn (lifecycle aborted, outcome aborted) may take.
ABORT_WRITE_S = 5.0

class TokenBudgetSpent(Exception):
    """`max_tokens_per_day` is reached: the turn is held before its next backend call."""


async def run_turn(agent: AgentConfig, wake: Wake, deps: TurnDeps, state: AgentState, *,
                   cursor: Callable[[], int | None] | None = None,
                   stopped: Callable[[], bool] | None = None) -> TurnResult:
    """Run one turn for `wake`; return what it came to. Never raises except the cancellation of a shutdown.

    The turn's one exception boundary: whatever the turn raises ends it
    `failed`, recorded (turns/record.py). Its end and the cursor are written
    here, once, however it ends. `cursor`: asked when the turn's end is
    written, the agent's cursor to write with it (the scheduler's low-water
    mark, counting this turn as handled), or None to leave it. Without it (a
    turn run on its own), the cursor moves to the wake's highest id. A turn
    aborted by a shutdown never moves it. `stopped`: asked when the turn is
    cancelled; True means a stop command aborted it (docs/agents.md#stop):
    reason `stopped`, the cursor moves as for a handled turn, and its unsent
    outbox rows fail `stopped`.
    """
    started = anyio.current_time()
    progress = TurnProgress(conversation=wake_conversation(wake))
    new_cursor = cursor if cursor is not None else (lambda: max(wake.item_ids, default=None))
    outcome = OUTCOME_COMPLETED
    try:
        # Queued, not awaited: the context is read while it commits; the turn waits for its id only where it
        # needs it (turn_begun), before the first backend call.
        begin = BeginTurn(agent.name, tuple(wake.item_ids), deps.clock_ms())
        queued = await deps.writer.queue(begin)

        async def begun() -> int:
            return (await queued.committed())[begin]

        progress.begin = begun
        async with Typing(deps.handles, agent=agent.name) as progress.typing:  # "stop" on leaving, however the turn ends
            end = await _converse_to_end(agent, wake, deps, state, progress)
            outcome = end.outcome
            await _begun_before_call(progress)  # a turn held before its first call has not waited for its id yet
            committed = await write_end(deps, agent, progress, end, new_cursor)
        if progress.speech is not None:
            progress.speech.notify(end.first, committed)  # the final prose's publishes: wake their senders
    except anyio.get_cancelled_exc_class():
        outcome = OUTCOME_ABORTED
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_WRITE_S):
            await _close_inference(deps, agent, progress, "aborted")
            try:
                begun_id = await turn_begun(progress)
            except Exception:  # its write failed: there is no turn to record as aborted
                begun_id = 0
            if begun_id:
                await _write_aborted(deps, agent, progress, new_cursor, stop=stopped is not None and stopped())
        raise
    except Exception as exc:  # the turn's one boundary: a cancellation (or a group holding one) is the branch above
        outcome = OUTCOME_FAILED
        await _record_failure(agent, deps, progress, exc, new_cursor)
    finally:
        seconds = anyio.current_time() - started
        deps.timings.turn_ended(agent.name, outcome, seconds)
        log.info("agent.turn", agent=agent.name, turn=progress.turn_id, outcome=outcome, reason=progress.reason,
                 seconds=round(seconds, 3), model=progress.model, tokens=progress.tokens,
                 calls=progress.calls, wake=len(wake.item_ids) + wake.overflow)
    return progress.result(outcome, seconds)


async def _converse_to_end(agent: AgentConfig, wake: Wake, deps: TurnDeps, state: AgentState,
                           progress: TurnProgress) -> TurnEnding:
    """The turn's work and the end it comes to: completed with its final prose's writes, or held by the budget."""
    try:
        text = await _converse(agent, wake, deps, state, progress)
    except TokenBudgetSpent:
        if not state.budget_held:  # one warning per held spell, not one per wake
            state.budget_held = True
            log.warning("agent.tokens_per_day_reached", agent=agent.name, limit=agent.max_tokens_per_day)
        # The held items' decisions (for explain, docs/agents.md#explain) commit with the held turn's record.
        held_items = RecordWakeDecisions(decisions_of(agent.name, ((i, REASON_TOKEN_BUDGET) for i in wake.item_ids),
                                                      deps.clock_ms()))
        return TurnEnding(outcome=OUTCOME_HELD, reason=REASON_TOKEN_BUDGET, first=(held_items,))
    # The final prose is routed and queued in the same commit as the turn's end.
    final = await progress.speech.operations(text) if progress.speech is not None else []
    return TurnEnding(outcome=OUTCOME_COMPLETED, first=tuple(final))


async def _write_aborted(deps: TurnDeps, agent: AgentConfig, progress: TurnProgress,
                         cursor: Callable[[], int | None], *, stop: bool) -> None:
    """A cancelled turn's end (under the caller's shield): stopped, the cursor moves and nothing more of it is
    sent; or shut down, and the cursor stays (the wake was not handled: a restart's catch-up wakes for it again)."""
    if not stop:
        await write_end(deps, agent, progress, TurnEnding(outcome=OUTCOME_ABORTED, reason=REASON_SHUTDOWN,
                                                       moves_cursor=False), cursor)
        return
    unsent = FailTurnPublishes(progress.turn_id, deps.clock_ms(), REASON_STOPPED)
    committed = await write_end(deps, agent, progress, TurnEnding(outcome=OUTCOME_ABORTED, reason=REASON_STOPPED,
                                                               first=(unsent,)), cursor)
    log.info("agent.turn_stopped", agent=agent.name, turn=progress.turn_id, unsent_failed=len(committed[unsent]))


async def _converse(agent: AgentConfig, wake: Wake, deps: TurnDeps, state: AgentState, progress: TurnProgress) -> str:
    """Backend calls and tool rounds until the model stops asking for tools; the final prose."""
    rows = await _rows(agent, wake, deps)
    if needs_notice(rows, agent):
        # Written with (or right after) the turn's BeginTurn, and added to the rows read as stored: no second read.
        notice = _source_notice(agent, progress, deps.clock_ms())
        (written,) = await deps.writer.write(InsertItems([notice]))
        if deps.rows is not None:
            deps.rows.feed_written([notice], [written])
        rows = [*rows, _as_stored(notice, written.id)]
    system_prompt = state.system_prompt
    waking = await _waking_items(deps, wake, rows)
    rows = _merged(rows, waking)  # a waking item the window of newest rows missed (a flood) is still compiled
    user_message = _waking_text(waking)
    speech = progress.speech = TurnSpeech(agent, deps, progress.turn_id, [item.meta.source for item in waking],
                                          overflow=wake.overflow > 0, conversation=progress.conversation)
    if progress.typing is not None:
        progress.typing.start(typing_target(speech))  # the route is decided: "start", repeated until the turn ends
    acknowledge_wake(agent, deps.acknowledger, waking)
    await state.toolbox.judge_new_tools()
    tools = state.toolbox.specs()
    progress.turn_rows_after = max((row.id for row in rows), default=0)  # later rows are this turn's own
    for turn_index in range(agent.max_tool_rounds + 1):
        response = await _one_inference(agent, wake, deps, state, progress, rows=rows, system_prompt=system_prompt,
                                        tools=tools, turn_index=turn_index, waking_text=user_message,
                                        user_message=user_message if turn_index == 0 else None)
        if not response.tool_calls:
            return response.text
        if turn_index == agent.max_tool_rounds:
            log.warning("agent.tool_rounds_exhausted", agent=agent.name, turn=progress.turn_id,
                        rounds=agent.max_tool_rounds, ignored_calls=len(response.tool_calls))
            return response.text
        if response.text.strip():
            await speech.say(response.text)  # queued before this round's calls run
        await _tool_round(agent, deps, state, progress, response)
        await _deliver_at_tool_boundary(agent, deps, progress)
        rows = await _turn_rows(agent, wake, deps, progress, waking)
    return ""  # not reached: the last round returns above


async def _one_inference(agent: AgentConfig, wake: Wake, deps: TurnDeps, state: AgentState, progress: TurnProgress, *,
                         rows: list[StoredItem], system_prompt: str, tools: list[Any], turn_index: int,
                         user_message: str | None, waking_text: str) -> ModelResponse:
    """One backend call with its hooks and its lifecycle pair."""
    await _check_budget(agent, deps, state)
    inference_id = f"inf_{uuid.uuid4().hex[:16]}"
    conversation = wake_conversation(wake)
    injections: Injections = await before_inference(deps.handles, agent, state=deps.hooks,
                                                    inference_id=inference_id,
                                                    turn_index=turn_index, user_message=user_message,
                                                    conversation_id=conversation)
    compiled = compile_request(agent, system_prompt=system_prompt, rows=rows, wake_item_ids=list(wake.item_ids),
                               tools=tools, injections=injections, now_ms=deps.clock_ms(),
                               backend=agent.backend, rendered=None if deps.rows is None else deps.rows.rendered,
                               turn_rows_after=progress.turn_rows_after, no_author_line=state.no_author_line,
                               turn_id=progress.turn_id or None, delivered=deps.store.outbox.recent_delivered)
    await _begun_before_call(progress)  # compiled while the BeginTurn commits (no row of this turn exists before)
    if compiled.pieces_left_out:
        log.warning("agent.context_pieces_left_out", agent=agent.name, turn=progress.turn_id, turn_index=turn_index,
                    left_out=compiled.pieces_left_out, context_chars=agent.context_chars)
    if compiled.waking_left_out:
        log.warning("agent.waking_items_cut", agent=agent.name, turn=progress.turn_id, turn_index=turn_index,
                    left_out=compiled.waking_left_out, context_chars=agent.context_chars)
    # Set after the digest is taken: neither is sent to the model, and the digest stays the compiled request's.
    request = msgspec.structs.replace(compiled.request, waking_text=waking_text,
                                      max_output_chars=agent.max_output_chars)
    if progress.digest is None:
        progress.digest = compiled.digest  # the first compiled request is the one the turns row names
        progress.injections = msgspec.to_builtins(injections)
    await lifecycle(deps.handles, agent, state=deps.hooks, inference_id=inference_id, phase="started",
                    turn_index=turn_index, conversation_id=conversation)
    progress.open_inference = inference_id
    try:
        targets = stream_targets(progress.speech, deps.handles)  # routing decided: stream only there
        if targets:
            # One complete per channel, however it ends; a secret is never streamed (docs/agents.md#secrets).
            async with Streamer(deps.handles, inference_id, secrets=deps.store.secrets) as streamer:
                streamer.open(targets)
                response = await state.backend.complete(request, on_text=streamer.chunk)
        else:
            response = await state.backend.complete(request)
    except anyio.get_cancelled_exc_class():
        raise  # the caller sends `aborted` under its shield
    except BaseException:
        await _close_inference(deps, agent, progress, "failed")
        raise
    progress.calls += 1
    progress.add(response.usage)
    progress.model = response.model or compiled.request.model or progress.model
    await _close_inference(deps, agent, progress, "completed", usage=response.usage)
    return response


async def _close_inference(deps: TurnDeps, agent: AgentConfig, progress: TurnProgress, phase: str, *,
                           usage: Usage | None = None) -> None:
    """The terminal lifecycle phase of the open inference, once (`lifecycle` logs what a connector did not get)."""
    inference_id, progress.open_inference = progress.open_inference, None
    if inference_id is None:
        return
    await lifecycle(deps.handles, agent, state=deps.hooks, inference_id=inference_id, phase=phase, usage=usage)


async def _tool_round(agent: AgentConfig, deps: TurnDeps, state: AgentState, progress: TurnProgress,
                      response: ModelResponse) -> None:
    """Store the round's calls (its prose is stored as speech just before), run each in order, store each result.

    Only the first `max_tool_calls_per_round` run (docs/agents.md#bounds); the others are stored without their
    arguments, each with a result saying it was not run, in the same write as the calls.
    """
    run, skipped = split_tool_calls(response.tool_calls, agent.max_tool_calls_per_round)
    rows = [tool_call_row(agent.name, progress.turn_id, call, created_at=deps.clock_ms(),
                          conversation_id=progress.conversation) for call in [*run, *skipped]]
    if skipped:
        log.warning("agent.tool_calls_not_run", agent=agent.name, turn=progress.turn_id,
                    calls=len(response.tool_calls), limit=agent.max_tool_calls_per_round)
        not_run = [{"type": "text", "text": not_run_text(len(response.tool_calls), agent.max_tool_calls_per_round)}]
        rows += [tool_result_row(agent.name, progress.turn_id, call.id, call.name, not_run, True,
                                 created_at=deps.clock_ms(), conversation_id=progress.conversation)
                 for call in skipped]
    _fed(deps, rows, await deps.writer.write(InsertItems(rows)))
    for call in run:
        outcome = await state.toolbox.call(call, speech=progress.speech)
        result = tool_result_row(agent.name, progress.turn_id, call.id, call.name, outcome.blocks, outcome.is_error,
                                 created_at=deps.clock_ms(), conversation_id=progress.conversation)
        _fed(deps, [result], await deps.writer.write(InsertItems([result])))


def _fed(deps: TurnDeps, rows: list[NewItem], written: list[ItemWritten]) -> None:
    """The turn's own rows just committed, fed to the row cache (its next read need not read them)."""
    if deps.rows is not None:
        deps.rows.feed_written(rows, written)


async def _deliver_at_tool_boundary(agent: AgentConfig, deps: TurnDeps, progress: TurnProgress) -> None:
    """Peer messages queued for this agent with dispatch `tool-end` join the turn now (docs/peers.md#delivery).

    A failure to deliver is logged, never fails the turn: the messages stay
    queued and go in at the turn's end instead.
    """
    if deps.peers is None:
        return
    try:
        await deps.peers.deliver_at_tool_boundary(agent.name, progress.turn_id, progress.conversation)
    except Exception:
        log.error("agent.peer_delivery_failed", agent=agent.name, turn=progress.turn_id, exc_info=True)


async def _check_budget(agent: AgentConfig, deps: TurnDeps, state: AgentState) -> None:
    """Hold the turn when `max_tokens_per_day` is spent, read from the durable ledger before each call."""
    if agent.max_tokens_per_day <= 0:
        return
    spent = await deps.store.turns.usage_since(agent.name, deps.clock_ms() - DAY_MS)
    if spent >= agent.max_tokens_per_day:
        raise TokenBudgetSpent
    state.budget_held = False


def _source_notice(agent: AgentConfig, progress: TurnProgress, at: int) -> NewItem:
    """The one-time notice; under "conversation" scope it belongs to the conversation, so that scope's reads see it."""
    scoped = agent.context_scope == "conversation"
    return source_notice_row(agent.name, created_at=at, conversation_id=progress.conversation if scoped else None)


async def _begun_before_call(progress: TurnProgress) -> None:
    """The first backend call waits for the turn's id; its speech, routed already, takes it. A BeginTurn that
    failed fails the turn with no speech, as when it failed before the route was decided."""
    if progress.begin is None:
        return
    try:
        await turn_begun(progress)
    except BaseException:
        progress.speech = None
        raise
    if progress.speech is not None:
        progress.speech.turn_id = progress.turn_id


async def turn_begun(progress: TurnProgress) -> int:
    """The turn's id once its queued BeginTurn has committed (0: none was queued, or its write failed before)."""
    begin, progress.begin = progress.begin, None  # awaited once: a failed write is not waited for again
    if begin is not None:
        progress.turn_id = await begin()
    return progress.turn_id


def _as_stored(item: NewItem, item_id: int) -> StoredItem:
    """A host-made row just committed as `item_id`, as a read would return it (its text has no secret to redact)."""
    return StoredItem(id=item_id, agent=item.agent, participant=item.participant, role=item.role,
                      content=item.content, metadata=item.metadata, created_at=item.created_at)


def wake_conversation(wake: Wake) -> str | None:
    """The one conversation every item of the wake shares, or None (several, none, or an overflowed wake)."""
    if len(wake.conversations) == 1 and not wake.several_conversations:
        return wake.conversations[0]
    return None


async def _rows(agent: AgentConfig, wake: Wake, deps: TurnDeps) -> list[StoredItem]:
    """The rows the compiler chooses from: the agent's, or under "conversation" scope its conversation's."""
    if agent.context_scope == "conversation":
        rows: list[StoredItem] = await deps.store.items.context_rows(
            agent.name, limit=CONTEXT_ROWS, conversation_id=wake_conversation(wake))
        return rows
    if deps.rows is not None:  # every row up to the wake's newest item at least (fed, or read)
        return await deps.rows.rows_for(agent.name, through=max(wake.item_ids, default=0))
    return await deps.store.items.context_rows(agent.name, limit=CONTEXT_ROWS)


async def _turn_rows(agent: AgentConfig, wake: Wake, deps: TurnDeps, progress: TurnProgress,
                     waking: list[StoredItem]) -> list[StoredItem]:
    """The rows for a call after a tool round: the context's, and always the waking items and the rows this turn
    wrote (its calls and results), which a flood of newer items can push out of the window of newest rows."""
    rows = await _rows(agent, wake, deps)
    own = await deps.store.items.own_after(agent.name, progress.turn_rows_after or 0, limit=CONTEXT_ROWS)
    return _merged(rows, [*waking, *own])


def _merged(rows: list[StoredItem], more: list[StoredItem]) -> list[StoredItem]:
    """`rows` and those of `more` not among them (the compiler orders them by id)."""
    have = {row.id for row in rows}
    missing = [row for row in more if row.id not in have]
    return [*rows, *missing] if missing else rows


async def _waking_items(deps: TurnDeps, wake: Wake, rows: list[StoredItem]) -> list[StoredItem]:
    """The waking items by ascending id: taken from the context rows, or read once when one is not among them.

    What the turn's speech routing, the hooks' `userMessage` and the acknowledgements all read.
    """
    wanted = set(wake.item_ids)
    found = [row for row in rows if row.id in wanted]
    if len(found) < len(wanted):
        return await deps.store.items.get_many(sorted(wanted))
    return sorted(found, key=lambda item: item.id)


def _waking_text(items: list[StoredItem]) -> str:
    """The waking items' body text (no headers), for hooks' `userMessage`."""
    texts = [reader_text(item.content, item.meta.source_header) for item in items]
    return "\n\n".join(t for t in texts if t)


async def record_failed_turn(agent: AgentConfig, wake: Wake, deps: TurnDeps, exc: Exception, *,
                             cursor: Callable[[], int | None]) -> TurnResult:
    """A wake whose handling failed before its turn began (a bug in the caller): recorded as a failed turn.

    Like a turn that fails: logged with its cause, a `turn-failed` notice and
    the record, the cursor moved as `cursor` says; never raises.
    """
    progress = TurnProgress(conversation=wake_conversation(wake))
    await _record_failure(agent, deps, progress, exc, cursor, wake_ids=wake.item_ids)
    deps.timings.turn_ended(agent.name, OUTCOME_FAILED, 0.0)  # one observation per turns-ledger row
    log.info("agent.turn", agent=agent.name, turn=progress.turn_id, outcome=OUTCOME_FAILED, seconds=0.0,
             model=None, tokens=0, calls=0, wake=len(wake.item_ids) + wake.overflow)
    return progress.result(OUTCOME_FAILED, 0.0)


async def _record_failure(agent: AgentConfig, deps: TurnDeps, progress: TurnProgress, exc: Exception,
                          cursor: Callable[[], int | None], *, wake_ids: tuple[int, ...] = ()) -> None:
    """A failed turn: why, logged; then a `turn-failed` notice for the agent, its failure reply and the record, in
    one write (turns/record.py `failed_end`); a failing store is only logged."""
    cause, reason = failure_cause(agent, progress, exc)
    try:
        if not await turn_begun(progress):
            progress.turn_id = await deps.writer.write(BeginTurn(agent.name, wake_ids, deps.clock_ms()))
        end = failed_end(agent, progress, cause, reason, deps.clock_ms)
        committed = await write_end(deps, agent, progress, end, cursor)
        if end.first and progress.speech is not None:
            progress.speech.notify(end.first, committed)  # wake the sender: the reply goes out like any speech
    except Exception:  # the record's write, inside the turn's boundary: the store's failure is only logged
        log.error("agent.turn_record_failed", agent=agent.name, turn=progress.turn_id, exc_info=True)
