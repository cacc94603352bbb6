"""The MCPL side of one inference: `context/beforeInference` hooks and `inference/lifecycle` (docs/agents.md#hooks-and-lifecycle).

Both go only to connectors the agent hears (its `hears`, by connector name)
and only under the grant:

- `before_inference` asks every ready connector holding at least one hook
  leaf, in parallel, `HOOK_TIMEOUT_S` each, fail-open (a timeout, an error or
  a malformed answer costs that connector's contribution, never the turn).
  `userMessage` is the waking text only under `observe`, else null (the key
  is always there). Each injection is kept only if
  `contextHooks.beforeInference.inject.<position>` is in the grant in force
  **when the answer arrived** (read in the read loop), whatever featureSet
  or namespace the answer claims. Connector order, then array order.
- `lifecycle` sends `started` and then exactly one terminal phase per
  inference id to the connectors holding `inferenceLifecycle`: metadata
  only, never content; `model` only under `modelInfo`, `usage` only with
  `completed`. A terminal without a `started`, or a second one, is not sent.

Decisions the spec leaves open: `conversationId` is the turn's conversation
when the caller names one, else `agent:<name>` (the agent's one context
under `context_scope = "agent"`); an injection's content becomes text (a
string, or its text blocks joined by newlines; media is left out) and is
marked like a sender's words, since a connector could imitate a header, and
framed as the connector's: a line that reads like the host's (`[host]`,
`Guidance from`, `from:`) gets one backslash (inbound/author.py
`escape_host_lines`); an injection longer than `MAX_INJECTION_CHARS` is
dropped whole, never cut.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import structlog
from msgspec import Raw

from mcplhost.agents.hearing import heard_connectors
from mcplhost.agents.model import Usage
from mcplhost.agents.turns.compiler import Injections
from mcplhost.config import AgentConfig
from mcplhost.inbound import mark_openings
from mcplhost.inbound.author import escape_host_lines
from mcplhost.jsonobject import JsonObject
from mcplhost.protocol.answers import (
    ContentBlock,
    HookAnswer,
    Injection,
    MalformedAnswer,
    decode_answer,
    decode_each,
)
from mcplhost.protocol.grants import HOOK_PATHS
from mcplhost.protocol.ports import NOTIFY_FAILURES, ConnectorNotReady, HookPort, State
from mcplhost.rpc import LineTooLong, RemoteError, RequestTimeout

log = structlog.get_logger()

#: Each connector's `context/beforeInference` answer is awaited this long (docs/mcpl-checklist.md item 38).
HOOK_TIMEOUT_S = 5.0
#: A lifecycle notification that cannot be queued within this long is given up (logged).
LIFECYCLE_SEND_TIMEOUT_S = 1.0
#: Injections read from one answer; the rest are dropped (logged).
MAX_INJECTIONS_PER_ANSWER = 32
#: Characters of one injection's text; a longer one is dropped whole (logged), never cut.
MAX_INJECTION_CHARS = 20_000
#: Inferences remembered between `started` and their terminal phase (the oldest is forgotten past this).
MAX_OPEN_INFERENCES = 1024
#: ModelInfo's contextWindow is in tokens; the agent's bound is in characters (a rough, stated estimate).
CHARS_PER_TOKEN = 4

HOOK_METHOD = "context/beforeInference"
OBSERVE = "contextHooks.beforeInference.observe"
INJECT_PREFIX = "contextHooks.beforeInference.inject."
LIFECYCLE = "inferenceLifecycle"
MODEL_INFO = "modelInfo"
POSITIONS = ("system", "beforeUser", "afterUser")
TERMINAL_PHASES = frozenset({"completed", "aborted", "failed"})
PHASES = TERMINAL_PHASES | {"started"}

def conversation_of(agent: AgentConfig, conversation_id: str | None) -> str:
    """The correlation id hooks and lifecycle carry: the turn's conversation, or the agent's one context."""
    return conversation_id if conversation_id is not None else f"agent:{agent.name}"


def model_info(agent: AgentConfig) -> JsonObject:
    """ModelInfo for the agent's backend, from the config alone.

    Sent in every beforeInference (the spec's table does not gate it)
    and in lifecycle only under `modelInfo`.
    """
    backend = agent.backend
    return {"id": backend.model or backend.kind, "vendor": backend.kind,
            "contextWindow": agent.context_chars // CHARS_PER_TOKEN, "capabilities": ["tools"]}


# --- context/beforeInference -----------------------------------------------------


def hook_targets(handles: Mapping[str, HookPort], agent: AgentConfig) -> list[HookPort]:
    """Ready connectors the agent hears that hold at least one hook leaf now."""
    return [h for h in heard_connectors(handles, agent) if h.state is State.READY and h.grant & HOOK_PATHS]


def hook_params(*, inference_id: str, conversation_id: str, turn_index: int, user_message: str | None,
                grant: frozenset[str], model: dict[str, Any]) -> JsonObject:
    """The params for one connector: `userMessage` only under observe, else null (present either way)."""
    return {"inferenceId": inference_id, "conversationId": conversation_id, "turnIndex": turn_index,
            "userMessage": user_message if OBSERVE in grant else None, "model": model}


def injection_text(content: str | list[Raw]) -> str | None:
    """An injection's content as text (a string, or text blocks joined by newlines), marked and its host-like
    lines escaped; None if malformed.

    Non-text blocks of a known shape are left out (hooks add words, not
    media); a block that is not an object with a string `type`, or a text
    block without a string `text`, makes the whole injection malformed.
    """
    if isinstance(content, str):  # the Struct's union: a string, or blocks
        blocks = [{"type": "text", "text": content}]
    else:
        blocks = []
        for block in decode_each(content, ContentBlock):
            if block is None:
                return None
            if block.type == "text":
                if block.text is None:
                    return None
                blocks.append({"type": "text", "text": block.text})
    # A connector's words could imitate a host header: marked like any sender's text (docs/provenance.md §4),
    # and each line that reads like a host notice, a parent's guidance or the speaker line escaped.
    text = escape_host_lines("\n".join(b["text"] for b in mark_openings(blocks)))
    return text if text.strip() else None


def decoded_answer(raw: Raw | bytes) -> HookAnswer | MalformedAnswer:
    """The answer as the host reads it (protocol/answers.py `HookAnswer`), or why it is not one."""
    try:
        return decode_answer(raw, HookAnswer, HOOK_METHOD)
    except MalformedAnswer as exc:
        return exc


def judged_answer(raw: Raw | bytes, grant: frozenset[str],
                  ) -> tuple[HookAnswer | MalformedAnswer, tuple[list[tuple[str, str]], list[dict[str, Any]]]]:
    """The answer as decoded and its `authorized_injections` (pure: safe in a worker thread)."""
    answer = decoded_answer(raw)
    return answer, authorized_injections(answer, grant)


def authorized_injections(answer: HookAnswer | MalformedAnswer,
                          grant: frozenset[str]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """(position, text) of each injection the grant at receipt permits, in array order, and each drop's reason.

    Pure. Each injection is judged on its own: malformed ones (position,
    namespace, content) and those whose position is not granted are dropped;
    the answer's `featureSet` and each `namespace` authorize nothing.
    """
    kept: list[tuple[str, str]] = []
    dropped: list[dict[str, Any]] = []
    if isinstance(answer, MalformedAnswer):
        return kept, [{"reason": "malformed_answer", "detail": answer.detail}]
    for index, raw in enumerate(answer.contextInjections):
        if index >= MAX_INJECTIONS_PER_ANSWER:
            dropped.append({"index": index, "reason": "too_many"})
            continue
        try:
            injection = decode_answer(raw, Injection, HOOK_METHOD)
        except MalformedAnswer:
            dropped.append({"index": index, "reason": "malformed"})
            continue
        position = injection.position
        if position not in POSITIONS:
            dropped.append({"index": index, "reason": "bad_position"})
            continue
        if injection.namespace is None:
            dropped.append({"index": index, "position": position, "reason": "no_namespace"})
            continue
        if INJECT_PREFIX + position not in grant:
            dropped.append({"index": index, "position": position, "reason": "not_granted"})
            continue
        text = injection_text(injection.content) if injection.content is not None else None
        if text is None:
            dropped.append({"index": index, "position": position, "reason": "bad_content"})
            continue
        if len(text) > MAX_INJECTION_CHARS:
            dropped.append({"index": index, "position": position, "reason": "too_long"})
            continue
        kept.append((position, text))
    return kept, dropped


def merged(contributions: Iterable[list[tuple[str, str]]]) -> Injections:
    """Injections grouped by position: connector order, then array order."""
    by_position: dict[str, list[str]] = {position: [] for position in POSITIONS}
    for contribution in contributions:
        for position, text in contribution:
            by_position[position].append(text)
    return Injections(system=by_position["system"], before_user=by_position["beforeUser"],
                      after_user=by_position["afterUser"])


async def _ask(state: HookState, handle: HookPort, agent: AgentConfig, params: dict[str, Any],
               inference_id: str) -> list[tuple[str, str]]:
    """One connector's authorized injections; nothing (logged) on a timeout, an error or a refusal."""
    clog = log.bind(agent=agent.name, connector=handle.name, inferenceId=inference_id)
    try:
        raw, grant = await state.request_hook(handle, params)
    except RequestTimeout as exc:
        clog.warning("agent.hook_timeout", timeout_s=HOOK_TIMEOUT_S)
        await _cancel(handle, exc, "beforeInference timed out")
        return []
    except RemoteError as exc:
        clog.warning("agent.hook_error", code=exc.code, error=exc.message)
        return []
    except (ConnectorNotReady, LineTooLong) as exc:  # LineTooLong: a userMessage past the connector's line cap
        clog.info("agent.hook_skipped", reason=str(exc))
        return []
    # In a worker thread: the cost of a hostile answer (a million blocks) is the connector's, not the loop's.
    answer, (kept, dropped) = await anyio.to_thread.run_sync(judged_answer, raw, grant, abandon_on_cancel=True)
    for drop in dropped:
        clog.info("agent.injection_dropped", **drop)
    clog.info("agent.hook_answered", featureSet=answer.featureSet if isinstance(answer, HookAnswer) else None,
              kept=len(kept), dropped=len(dropped))
    return kept


async def _cancel(handle: HookPort, exc: RequestTimeout, reason: str) -> None:
    """MCP notifications/cancelled for a request we stopped waiting for (best effort)."""
    if exc.request_id is None:
        return
    try:
        with anyio.move_on_after(LIFECYCLE_SEND_TIMEOUT_S):
            await handle.notify("notifications/cancelled", {"requestId": exc.request_id, "reason": reason})
    except ConnectorNotReady:
        pass  # gone meanwhile: nothing left to cancel


async def before_inference(handles: Mapping[str, HookPort], agent: AgentConfig, *, state: HookState,
                           inference_id: str, turn_index: int, user_message: str | None,
                           conversation_id: str | None = None) -> Injections:
    """Ask every hook holder the agent hears, in parallel; the injections their grants permitted at receipt."""
    state.ledger.note_turn_index(inference_id, turn_index)
    targets = hook_targets(handles, agent)
    if not targets:
        return Injections()
    conversation = conversation_of(agent, conversation_id)
    model = model_info(agent)
    answers: list[list[tuple[str, str]]] = [[] for _ in targets]

    async def ask(index: int, handle: HookPort) -> None:
        params = hook_params(inference_id=inference_id, conversation_id=conversation, turn_index=turn_index,
                             user_message=user_message, grant=handle.grant, model=model)
        answers[index] = await _ask(state, handle, agent, params, inference_id)

    async with anyio.create_task_group() as tg:
        for index, handle in enumerate(targets):
            tg.start_soon(ask, index, handle)
    return merged(answers)


# --- inference/lifecycle -----------------------------------------------------------


class _Open:
    __slots__ = ("conversation_id", "recipients", "turn_index")

    def __init__(self, conversation_id: str, turn_index: int, recipients: tuple[str, ...]) -> None:
        self.conversation_id = conversation_id
        self.turn_index = turn_index
        self.recipients = recipients


class InferenceLedger:
    """Per inference id: its turn index (from the hooks) and who heard `started`, until its terminal phase.

    The pairing guard of docs/mcpl-checklist.md item 13, bounded: at most `limit` entries
    of each kind, the oldest forgotten first.
    """

    def __init__(self, limit: int = MAX_OPEN_INFERENCES) -> None:
        self.limit = limit
        self._turn_index: OrderedDict[str, int] = OrderedDict()
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def note_turn_index(self, inference_id: str, turn_index: int) -> None:
        self._turn_index[inference_id] = turn_index
        self._bound(self._turn_index)

    def start(self, inference_id: str, conversation_id: str, turn_index: int | None,
              recipients: tuple[str, ...]) -> _Open | None:
        """Record a `started`; None when this inference already started (a second `started` is not sent)."""
        if inference_id in self._open:
            return None
        index = turn_index if turn_index is not None else self._turn_index.pop(inference_id, 0)
        self._open[inference_id] = entry = _Open(conversation_id, index, recipients)
        self._bound(self._open)
        return entry

    def finish(self, inference_id: str) -> _Open | None:
        """The `started` this terminal pairs with, forgotten now; None if there is none (nothing is sent)."""
        self._turn_index.pop(inference_id, None)
        return self._open.pop(inference_id, None)

    def _bound(self, table: OrderedDict[str, Any]) -> None:
        while len(table) > self.limit:
            table.popitem(last=False)


class HookState:
    """One host's hook and lifecycle bookkeeping (no module globals: two hosts in one process share nothing).

    The host builds one and hands it to its agents and to its connectors'
    `inference/request` port, which asks `hook_pending`.
    """

    def __init__(self, ledger_limit: int = MAX_OPEN_INFERENCES) -> None:
        #: Connectors with a `context/beforeInference` call outstanding, by name and count: while one is, that
        #: connector's `inference/request` is refused -32600 (the loop guard, docs/mcpl-checklist.md item 31).
        #: Zero counts are removed.
        self._pending: Counter[str] = Counter()
        self.ledger = InferenceLedger(ledger_limit)

    def hook_pending(self, server_id: str) -> bool:
        """Whether a `context/beforeInference` call to this connector is outstanding now."""
        return self._pending.get(server_id, 0) > 0

    async def request_hook(self, handle: HookPort, params: dict[str, Any]) -> tuple[Raw, frozenset[str]]:
        """The `context/beforeInference` call, counted as pending while it is outstanding; its answer undecoded."""
        self._pending[handle.name] += 1
        try:
            return await handle.request_with_grant(HOOK_METHOD, params, timeout=HOOK_TIMEOUT_S, result_type=Raw)
        finally:
            self._pending[handle.name] -= 1
            if self._pending[handle.name] <= 0:
                del self._pending[handle.name]


def lifecycle_params(*, inference_id: str, conversation_id: str, turn_index: int, phase: str,
                     grant: frozenset[str], model: dict[str, Any], usage: Usage | None) -> JsonObject:
    """Metadata only (docs/mcpl-checklist.md item 12): model under modelInfo, usage only with completed."""
    params: dict[str, Any] = {"inferenceId": inference_id, "conversationId": conversation_id,
                              "turnIndex": turn_index, "phase": phase}
    if MODEL_INFO in grant:
        params["model"] = model
    if phase == "completed" and usage is not None:
        params["usage"] = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}
    return params


#: A lifecycle phase a connector did not get: not sent (NOTIFY_FAILURES) or not within LIFECYCLE_SEND_TIMEOUT_S.
_LIFECYCLE_FAILURES: tuple[type[Exception], ...] = (*NOTIFY_FAILURES, TimeoutError)


async def lifecycle(handles: Mapping[str, HookPort], agent: AgentConfig, *, state: HookState,
                    inference_id: str, phase: str, usage: Usage | None = None, turn_index: int | None = None,
                    conversation_id: str | None = None) -> None:
    """Send one lifecycle phase to the lifecycle holders the agent hears; never raises for a connector.

    `started` goes to every ready holder now; a terminal phase to those of
    them that still serve and hold `inferenceLifecycle` (a denied capability
    is never used), once. `turn_index` None: the one `before_inference` was
    given for this inference id (else 0).
    """
    if phase not in PHASES:
        raise ValueError(f"unknown lifecycle phase {phase!r}")
    ledger = state.ledger
    if phase == "started":
        recipients = tuple(h.name for h in heard_connectors(handles, agent)
                           if h.state is State.READY and LIFECYCLE in h.grant)
        entry = ledger.start(inference_id, conversation_of(agent, conversation_id), turn_index, recipients)
        if entry is None:
            log.warning("agent.lifecycle_repeated", agent=agent.name, inferenceId=inference_id, phase=phase)
            return
    else:
        entry = ledger.finish(inference_id)
        if entry is None:
            log.warning("agent.lifecycle_unpaired", agent=agent.name, inferenceId=inference_id, phase=phase)
            return
    targets = [handles[name] for name in entry.recipients
               if name in handles and handles[name].state is State.READY and LIFECYCLE in handles[name].grant]
    if not targets:
        return  # nobody to tell: no task group, whose exit would yield to the loop on the way to the backend call
    model = model_info(agent)

    async def send(handle: HookPort) -> None:
        params = lifecycle_params(inference_id=inference_id, conversation_id=entry.conversation_id,
                                  turn_index=entry.turn_index, phase=phase, grant=handle.grant, model=model,
                                  usage=usage)
        try:
            with anyio.fail_after(LIFECYCLE_SEND_TIMEOUT_S):
                await handle.notify("inference/lifecycle", params)
        except _LIFECYCLE_FAILURES as exc:
            log.info("agent.lifecycle_not_sent", agent=agent.name, connector=handle.name, phase=phase,
                     inferenceId=inference_id, reason=str(exc) or "timeout")

    async with anyio.create_task_group() as tg:
        for handle in targets:
            tg.start_soon(send, handle)
