"""The inbound method handlers: what each method a connector sends does, once it is authorized.

`methods.INBOUND` names each handler beside the capability it needs; the
connection checks readiness and the grant before calling one, so a handler
only decodes, admits and answers. Request handlers return the result or a
`Deferred` (storing runs off the read loop); notification handlers answer
nothing and log what a notification cannot be told.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Raw, UnsetType

from mcplhost.jsonobject import JsonObject
from mcplhost.rpc import Deferred

from . import errors, jobs
from .admission import admit_message, admit_push
from .channels import CHANNEL_LIMIT, Channel
from .context import Inbound
from .featuresets import check_feature_set
from .params import Changed, InferenceRequest, ManifestChanged, PushEvent, Register, decode_incoming, decode_params
from .ports import InferenceInvalid, InferenceRefused


def ping(conn: Inbound, params: Raw | UnsetType) -> JsonObject:
    return {}


# --- channels ------------------------------------------------------------------


def register(conn: Inbound, params: Raw | UnsetType) -> JsonObject:
    decoded = decode_params(params, Register, "channels/register")
    results, accepted = conn.registry.add(decoded.channels)
    _after_accept(conn, accepted, results)
    _audit_channels(conn, "channels/register", results)
    return {"results": results}


def changed(conn: Inbound, params: Raw | UnsetType) -> JsonObject:
    decoded = decode_params(params, Changed, "channels/changed")
    added, accepted_added = conn.registry.add(decoded.added)
    updated, _ = conn.registry.add(decoded.updated, must_exist=True)  # an update opens nothing
    removed = conn.registry.remove(decoded.removed)
    results = added + updated + removed
    _after_accept(conn, accepted_added, results)
    _audit_channels(conn, "channels/changed", results)
    return {"results": results}


async def changed_notification(conn: Inbound, params: Raw | UnsetType) -> None:
    for entry in changed(conn, params)["results"]:
        if not entry["accepted"]:
            # A refused item in a Notification cannot be answered: never filter silently.
            conn.limited.warning("channels.descriptor_refused", channel=entry["id"], reason=entry.get("reason"),
                                 detail="refused in a channels/changed notification")


def list_channels(conn: Inbound, params: Raw | UnsetType) -> JsonObject:
    return {"channels": [c.descriptor() for c in conn.registry.channels()]}


def _audit_channels(conn: Inbound, method: str, results: list[dict[str, Any]]) -> None:
    accepted = sum(1 for r in results if r["accepted"])
    conn.limited.info("mcpl.channels", method=method, accepted=accepted, refused=len(results) - accepted)


def _after_accept(conn: Inbound, channels: list[Channel], results: list[dict[str, Any]]) -> None:
    if any(r.get("reason") == CHANNEL_LIMIT for r in results):
        conn.warn_once("channel-limit", "channels.limit_reached", limit=conn.registry.limit,
                       detail="further registrations are refused until channels are removed")
    if "channels.lifecycle" not in conn.grant:
        return
    for channel in channels:
        if channel.initiallyOpen:
            conn.schedule(jobs.OPEN, channel)


# --- inbound items ---------------------------------------------------------------


def incoming(conn: Inbound, params: Raw | UnsetType) -> Deferred:
    batch = decode_incoming(params, "channels/incoming")
    results: list[dict[str, Any] | None] = []
    admitted = []
    for raw in batch.messages:
        outcome = admit_message(raw, conn.registry, conn.accepted_implies)
        if isinstance(outcome, dict):
            results.append(outcome)
        else:
            results.append(None)
            admitted.append(outcome)
    _log_invalid(conn, [r for r in results if r is not None and "field" in r])

    async def store() -> JsonObject:
        stored = iter(await conn.intake.store_messages(conn.name, "channels/incoming", admitted) if admitted else [])
        final = [entry if entry is not None else next(stored) for entry in results]
        refused = sum(1 for r in final if not r.get("accepted"))
        conn.counts.item("channels/incoming", refused)
        # Debug, not info: each stored item is itself the audit record of a
        # message (connector, source, acceptedAt), and a line per request
        # would cost more than storing it on a busy connector.
        conn.log.debug("mcpl.incoming", messages=len(final), accepted=len(final) - refused)
        return {"results": final}

    return Deferred(store)


def _log_invalid(conn: Inbound, invalid: list[dict[str, Any]]) -> None:
    """One warning per request with malformed messages: the first one's field and problem, and how many."""
    if invalid:
        first = invalid[0]
        conn.limited.warning("mcpl.message_invalid", messageId=first.get("messageId"), field=first["field"],
                             problem=first["problem"], refused=len(invalid))


async def incoming_notification(conn: Inbound, params: Raw | UnsetType) -> None:
    conn.warn_once("incoming-notification", "connector.defect",
                   defect="channels/incoming sent as a notification")
    await incoming(conn, params).work()


def push_event(conn: Inbound, params: Raw | UnsetType) -> Deferred:
    push = decode_params(params, PushEvent, "push/event")
    problem = conn.intake.content_problem(push.payload.content)
    if problem is not None:  # a params problem: checked before the feature set (docs/connectors.md §8)
        raise errors.invalid_params(f"push payload refused: {problem}", {"reason": problem})
    admitted = admit_push(push, conn.registry, conn.feature_sets, legacy=conn.legacy,
                          accepted_implies=conn.accepted_implies)
    named = admitted.named_channel
    if admitted.channel_id is None and named is not None:
        conn.warn_once(f"push-unregistered:{named}", "mcpl.push_channel_unregistered", channel=named,
                       detail="origin.mcplChannelId names no registered channel: stored unscoped")

    async def store() -> JsonObject:
        try:
            stored = await conn.intake.store_push(conn.name, admitted)
        except errors.ConnectorProtocolError as exc:
            conn.count_refusal("push/event", exc.code)
            conn.limited.info("mcpl.refused", method="push/event", code=exc.code, featureSet=admitted.feature_set,
                              eventId=admitted.event_id, capability=None,
                              reason=exc.data.get("reason") if isinstance(exc.data, dict) else None)
            raise
        if stored.duplicate:
            conn.limited.info("mcpl.push_duplicate", featureSet=admitted.feature_set, eventId=admitted.event_id,
                              channel=admitted.channel_id, original=stored.item_id, outcome=stored.answer)
        else:
            conn.limited.info("mcpl.push", featureSet=admitted.feature_set, eventId=admitted.event_id,
                              channel=admitted.channel_id, item=stored.item_id, outcome=stored.answer)
        return stored.answer

    return Deferred(store)


# --- server-initiated inference (SPEC §11) ---------------------------------------

STREAMING = "inferenceRequest.streaming"
#: The loop guard's refusal reason (-32600), and its message.
HOOK_PENDING = "hook_pending"
HOOK_PENDING_DETAIL = "a context/beforeInference call to this connector is outstanding"


def inference_request(conn: Inbound, params: Raw | UnsetType) -> Deferred:
    """inference/request: checked at receipt (streaming grant, feature set, loop guard, params), then the model."""
    service = conn.inference
    if service is None:  # never granted without [inference]; the answer should that ever change
        raise errors.capability_denied("inferenceRequest")
    request = decode_params(params, InferenceRequest, "inference/request")
    if request.stream and STREAMING not in conn.grant:
        raise errors.capability_denied(STREAMING)
    refused = check_feature_set(conn.feature_sets, request.featureSet, "inferenceRequest", legacy=conn.legacy)
    if refused is not None:
        raise refused
    if conn.hooks.hook_pending(conn.name):
        # The loop guard (docs/connectors.md §13): a hook may not wait on the model it is hooking.
        raise errors.ConnectorProtocolError(errors.INVALID_REQUEST, HOOK_PENDING_DETAIL, {"reason": HOOK_PENDING})
    try:
        call = service.admit(conn.name, request)  # the place is taken now, at receipt: a burst cannot overrun it
    except InferenceInvalid as exc:
        raise errors.invalid_params(str(exc), {"field": "messages"}) from None
    except InferenceRefused as exc:
        raise errors.ConnectorProtocolError(errors.INTERNAL_ERROR, exc.detail, {"reason": exc.reason}) from None
    session = conn.session
    request_id = session.current_request_id
    conn.limited.info("mcpl.inference_request", featureSet=request.featureSet, stream=request.stream,
                      messages=len(request.messages))

    async def send_chunk(chunk: dict[str, Any]) -> None:
        await session.notify("inference/chunk", chunk)

    async def infer() -> JsonObject:
        try:
            return await call.run(request_id=request_id, send_chunk=send_chunk)
        except InferenceRefused as exc:
            raise errors.ConnectorProtocolError(errors.INTERNAL_ERROR, "Inference failed",
                                                {"reason": exc.reason}) from None
        finally:
            call.release()

    # Cancellable: no commit in it, so the connector's notifications/cancelled may cut it off.
    return Deferred(infer, discard=call.release, cancellable=True)


def model_info(conn: Inbound, params: Raw | UnsetType) -> JsonObject:
    """model/info: the `[inference]` backend's ModelInfo (MUST answer, docs/connectors.md)."""
    if conn.inference is None:
        raise errors.capability_denied("modelInfo")
    return conn.inference.model_info()


# --- MCP notifications ------------------------------------------------------------


class Cancelled(msgspec.Struct, frozen=True):
    """notifications/cancelled params (MCP); unknown members are tolerated."""

    requestId: int | str
    reason: str | None = None


async def cancelled(conn: Inbound, params: Raw | UnsetType) -> None:
    """notifications/cancelled: the connector gives up on one of its own requests.

    Only its own session is asked, so the id can name nothing of another
    connector's. Work that may be cut off (inference) ends without an answer,
    as MCP asks of a cancelled request; anything else (a commit) is answered
    as usual, which MCP allows.
    """
    try:
        notice = msgspec.json.decode(bytes(params), type=Cancelled) if isinstance(params, Raw) else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        notice = None
    if notice is None:
        conn.warn_once("cancelled-malformed", "connector.notification_refused", method="notifications/cancelled",
                       reason="params need a requestId string or integer")
        return
    if conn.session.cancel_peer_request(notice.requestId):
        conn.log.info("mcpl.request_cancelled", id=notice.requestId, reason=(notice.reason or "")[:200])


async def tools_list_changed(conn: Inbound, params: Raw | UnsetType) -> None:
    """notifications/tools/list_changed: the handle lists the tools again (if `tools` is granted)."""
    conn.limited.info("connector.tools_changed")
    conn.list_tools_soon()


# --- manifest ----------------------------------------------------------------------


async def manifest_changed(conn: Inbound, params: Raw | UnsetType) -> None:
    decode_params(params, ManifestChanged, "mcpl/manifestChanged")
    if not conn.is_ready:
        # No MCPL in force (MCP-only, closed, or still negotiating): nothing a
        # manifest could change, and a policy sent now could make a fallen
        # connection ready again.
        conn.warn_once("hint-not-ready", "connector.manifest_hint_ignored", mode=conn.mode.value)
        return
    dropped = conn.tracker.dropped
    if conn.tracker.should_fetch():
        conn.schedule(jobs.MANIFEST, None)
    elif conn.tracker.dropped > dropped:  # over the cap (a hint merged into a pending fetch is not dropped)
        conn.limited.warning("connector.manifest_fetch_dropped", reason="rate limit", dropped=conn.tracker.dropped)

