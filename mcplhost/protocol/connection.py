"""MCPL for one process life of one connector: handshake, policy, and every inbound method.

States, in order: HANDSHAKE → POLICY_PENDING → READY, or MCP_ONLY (no MCPL
manifest, or the policy was refused with fallback "mcp-only"), or a
`PolicyClosed` raised to the supervisor (fallback "close").

Every inbound request is authorized in the read loop against the grant in
force at that moment (`METHODS`); storing runs as `Deferred` work so the loop
keeps reading. Host-initiated follow-ups (opening channels, manifest
re-fetches, policy updates) go through one bounded job stream served by
`run_background`, one at a time, so policy updates are serialized.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import anyio
import msgspec
from msgspec import Raw, UnsetType

from mcplhost import __version__
from mcplhost.config import ConnectorConfig
from mcplhost.rpc import (
    ConnectionClosed,
    Deferred,
    RemoteError,
    RequestTimeout,
    Session,
)

from . import errors
from .admission import admit_message, admit_push
from .channels import Channel, ChannelRegistry
from .featuresets import FeatureSetState, derive_feature_sets, normalize_feature_sets
from .grants import advertised_paths, effective_grant
from .intake import Intake
from .manifest import ManifestTracker
from .methods import MCP_NOTIFICATIONS_PREFIX, rule_for
from .params import (
    Changed,
    IncomingBatch,
    InitializeResult,
    ManifestChanged,
    PushEvent,
    Register,
    WellFormedBatch,
    decode_incoming,
    decode_params,
)
from .policy import interim, judge_receipt, policy_params
from .tags import producer_implies

#: MCP protocol version we ask for; MCPL does not change MCP versioning (§3.1).
MCP_PROTOCOL_VERSION = "2024-11-05"
#: What this host implements, advertised in `initialize` (nothing more, RFC-002 §9.7).
HOST_MCPL_CAPABILITIES: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True, "lifecycle": True},
    "featureSets": True,
}
#: Host-initiated jobs waiting for the background worker.
MAX_PENDING_JOBS = 64


class Mode(Enum):
    HANDSHAKE = "handshake"
    POLICY_PENDING = "policy_pending"
    READY = "ready"
    MCP_ONLY = "mcp_only"
    CLOSED = "closed"  # refused a later policy with fallback "close": nothing is served any more


class PolicyClosed(Exception):
    """The connector refused our policy with fallback "close" (or we chose to close)."""


class HandshakeFailed(Exception):
    """`initialize` failed: no answer, an error, or an unusable result."""


class McplConnection:
    def __init__(self, spec: ConnectorConfig, intake: Intake, log: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.name = spec.name
        self.intake = intake
        self.log = log
        self.session: Session | None = None
        self.mode = Mode.HANDSHAKE
        self.legacy = spec.protocol == "0.4"
        self.capabilities: dict[str, Any] = {}
        self.manifest: dict[str, Any] | None = None
        self.grant: frozenset[str] = frozenset()
        self._requested: frozenset[str] = frozenset()  # the grant of the latest featureSets/update sent
        self.feature_sets: dict[str, FeatureSetState] = {}
        self.declared: dict[str, dict[str, Any]] = {}
        self.registry = ChannelRegistry(spec.channels)
        self.accepted_implies: dict[str, list[str]] | None = None
        self.tracker = ManifestTracker(clock)
        self._jobs_in, self._jobs_out = anyio.create_memory_object_stream[tuple[str, Any]](MAX_PENDING_JOBS)
        self._warned: set[str] = set()
        #: Set when a later policy is refused with fallback "close": the supervisor ends this life.
        self.closed_by_policy = anyio.Event()

    # --- handshake -----------------------------------------------------------

    def attach(self, session: Session) -> None:
        self.session = session

    async def handshake(self) -> Mode:
        """initialize → notifications/initialized → the initial featureSets/update."""
        session = self.session
        assert session is not None

        def initialized_at_receipt(outcome: Raw | RemoteError) -> InitializeResult:
            # Some connectors swallow whatever follows the initialize result unless
            # it is this notification (COMPAT.md): queue it in the read loop, before
            # the answer to anything the connector sent behind its result.
            if isinstance(outcome, RemoteError):
                raise outcome
            result = msgspec.json.decode(bytes(outcome), type=InitializeResult)
            session.notify_nowait("notifications/initialized")
            return result

        try:
            result = await session.request(
                "initialize",
                {
                    "protocolVersion": MCP_PROTOCOL_VERSION,
                    "capabilities": {"experimental": {"mcpl": HOST_MCPL_CAPABILITIES}},
                    "clientInfo": {"name": "mcplhost", "version": __version__},
                },
                timeout=self.spec.request_timeout_s,
                at_receipt=initialized_at_receipt,
            )
        except (RemoteError, RequestTimeout, ConnectionClosed, msgspec.ValidationError) as exc:
            raise HandshakeFailed(f"initialize failed: {exc}") from exc
        self.capabilities = result.capabilities
        manifest = _manifest_of(result.capabilities)
        version = manifest.get("version") if manifest is not None else None
        if manifest is None or (not isinstance(version, str) and self.spec.protocol == "auto"):
            why = "no MCPL manifest" if manifest is None else "manifest without a version string"
            return self._mcp_only(why)
        if self.spec.protocol == "auto":
            self.legacy = version != "0.5"
        self.manifest = manifest
        self.log.info("connector.initialized", server=result.serverInfo, mcpl_version=version, legacy=self.legacy)
        self._adopt_manifest(manifest)
        if self.spec.accept_tag_implications:
            self.accepted_implies = producer_implies(self.declared)
        grant = frozenset(effective_grant(self.capabilities, list(self.spec.grant)))
        self.mode = Mode.POLICY_PENDING
        try:
            return await self._send_policy(grant, initial=True)
        except ConnectionClosed as exc:
            raise HandshakeFailed(f"the connection ended before the policy receipt: {exc}") from exc

    def _adopt_manifest(self, manifest: dict[str, Any]) -> None:
        self.declared = normalize_feature_sets(manifest.get("featureSets"))
        if not self.tracker.adopt(manifest):
            # A conformance defect to log, never a reason to reject the manifest (§17.2).
            self.log.warning("connector.defect", defect="manifest revision does not match its content")

    def _derive(self, grant: frozenset[str]) -> dict[str, FeatureSetState]:
        selection = self.spec.feature_sets
        return derive_feature_sets(self.declared, grant, selection.enabled, list(selection.disabled))

    async def _send_policy(self, grant: frozenset[str], *, initial: bool) -> Mode:
        """Send featureSets/update as a Request; narrowing applies first, widening at the receipt.

        The receipt is applied in the read loop the moment it arrives
        (`at_receipt`), so a privileged request the connector sends right
        after its receipt already meets the new state.
        """
        assert self.session is not None
        states = self._derive(grant)
        if not initial:
            # Security never waits on the receipt: what narrows applies now.
            self._apply(*interim(self.grant, self.feature_sets, grant, self._derive))
        self._requested = grant
        try:
            return await self.session.request(
                "featureSets/update",
                policy_params(self.capabilities, grant, states,
                              selection_given=self.spec.feature_sets.enabled is not None),
                timeout=self.spec.policy_timeout_s,
                at_receipt=lambda outcome: self._apply_receipt(outcome, *self._still_requested(grant, states),
                                                               initial=initial),
            )
        except RequestTimeout:
            return self._fallback(self.spec.policy_fallback, "no answer to the policy")

    def _still_requested(self, grant: frozenset[str], states: dict[str, FeatureSetState],
                         ) -> tuple[frozenset[str], dict[str, FeatureSetState]]:
        """What a receipt may put in force: its grant, less what a later update has revoked since.

        Updates can overlap (a narrowing sent while a widening awaits its
        receipt); the late receipt of the earlier one must not undo the later
        revocation.
        """
        if grant <= self._requested:
            return grant, states
        kept = grant & self._requested
        return kept, self._derive(kept)

    def _apply_receipt(self, outcome: Raw | RemoteError, grant: frozenset[str],
                       states: dict[str, FeatureSetState], *, initial: bool) -> Mode:
        verdict = judge_receipt(outcome, legacy=self.legacy, initial=initial, strict=self.spec.protocol == "0.5",
                                operator_fallback=self.spec.policy_fallback)
        for defect in verdict.defects:
            self.log.warning("connector.defect", defect=defect)
        if not verdict.ready:
            assert verdict.fallback is not None
            return self._fallback(verdict.fallback, verdict.why)
        if verdict.legacy_ack:
            self.legacy = True
            if initial:
                self.log.info("connector.legacy_policy", detail="featureSets/update answered -32601")
        else:
            self.log.info("connector.policy_receipt", mode=verdict.mode, unavailable=verdict.unavailable)
        return self._ready(grant, states)

    def _apply(self, grant: frozenset[str], states: dict[str, FeatureSetState]) -> None:
        """Put a grant and the feature-set states derived from it in force.

        A channel registered under a grant that has since lost
        channels.register keeps no authority (HOST-DIGEST §3.2): the registry goes with it.
        """
        self.grant, self.feature_sets = grant, states
        if "channels.register" not in grant:
            self.registry.clear()

    def _ready(self, grant: frozenset[str], states: dict[str, FeatureSetState]) -> Mode:
        self._apply(grant, states)
        self.mode = Mode.READY
        self.log.info("connector.ready", grant=sorted(grant), legacy=self.legacy,
                      feature_sets={n: s.reason or "enabled" for n, s in states.items()})
        return self.mode

    def _mcp_only(self, why: str) -> Mode:
        self.grant, self.mode = frozenset(), Mode.MCP_ONLY
        self.registry.clear()
        self.log.warning("connector.mcp_only", reason=why)
        return self.mode

    def _fallback(self, fallback: str, why: str) -> Mode:
        if fallback == "close":
            self.grant = frozenset()
            raise PolicyClosed(why)
        return self._mcp_only(why)

    # --- authorization ---------------------------------------------------------

    def _require(self, capability: str) -> None:
        if self.mode in (Mode.HANDSHAKE, Mode.POLICY_PENDING):
            raise errors.capability_denied(capability, "policy_pending")
        if self.mode is Mode.MCP_ONLY:
            raise errors.capability_denied(capability, "mcp_only")
        if self.mode is Mode.CLOSED:
            raise errors.capability_denied(capability, "closed")
        if capability not in self.grant:
            raise errors.capability_denied(capability)

    # --- inbound ---------------------------------------------------------------

    async def on_request(self, method: str, params: Raw | UnsetType) -> Any:
        """Answer one request from the connector; every refusal is also audit-logged (§13.2)."""
        try:
            return await self._serve(method, params)
        except errors.ConnectorProtocolError as exc:
            self._audit_refusal(method, params, exc)
            raise

    def _audit_refusal(self, method: str, params: Raw | UnsetType, exc: errors.ConnectorProtocolError) -> None:
        data = exc.data if isinstance(exc.data, dict) else {}
        claimed = _claims(params) if method in ("push/event", "inference/request") else {}
        feature_set = data.get("featureSet", claimed.get("featureSet"))
        self.log.info("mcpl.refused", method=method, code=exc.code, featureSet=feature_set,
                      eventId=claimed.get("eventId"), capability=data.get("capability"), reason=data.get("reason"))
        if data.get("reason") == errors.DECLARATION_MISMATCH:
            self.log.warning("connector.declaration_mismatch", featureSet=feature_set,
                             capability=data.get("capability"), method=method)

    async def _serve(self, method: str, params: Raw | UnsetType) -> Any:
        rule = rule_for(method)
        if rule is None:
            raise errors.method_not_found(method)
        if rule.capability is not None:
            self._require(rule.capability)
        match method:
            case "ping":
                return {}
            case "channels/register":
                return self._register(decode_params(params, Register, method))
            case "channels/changed":
                return self._changed(decode_params(params, Changed, method))
            case "channels/list":
                return {"channels": [c.descriptor() for c in self.registry.channels()]}
            case "channels/incoming":
                return self._incoming(decode_incoming(params, method))
            case "push/event":
                return self._push(decode_params(params, PushEvent, method))
            case "model/info" | "inference/request":
                # Granted, but this host has no model for connectors yet.
                raise errors.capability_denied(rule.capability or method, "unsupported")
            case "mcpl/manifestChanged":
                raise errors.method_not_found(method)  # a notification, never a request
        raise errors.method_not_found(method)

    async def on_notification(self, method: str, params: Raw | UnsetType) -> None:
        if method.startswith(MCP_NOTIFICATIONS_PREFIX):
            return
        rule = rule_for(method)
        if rule is None:
            self._warn_once(f"notification:{method}", "connector.unknown_notification", method=method)
            return
        try:
            if rule.capability is not None:
                self._require(rule.capability)
            if method == "channels/changed":
                results = self._changed(decode_params(params, Changed, method))["results"]
                for entry in results:
                    if not entry["accepted"]:
                        # A refused item in a Notification cannot be answered: never filter silently.
                        self.log.warning("channels.descriptor_refused", channel=entry["id"], reason=entry.get("reason"),
                                         detail="refused in a channels/changed notification")
            elif method == "channels/incoming":
                self._warn_once("incoming-notification", "connector.defect",
                                defect="channels/incoming sent as a notification (AMB-19)")
                deferred = self._incoming(decode_incoming(params, method))
                await deferred.work()
            elif method == "mcpl/manifestChanged":
                self._manifest_changed(params)
            else:
                self._warn_once(f"notification:{method}", "connector.unexpected_notification", method=method)
        except errors.ConnectorProtocolError as exc:
            self.log.warning("connector.notification_refused", method=method, code=exc.code,
                             data=None if exc.data is msgspec.UNSET else exc.data)

    def _register(self, params: Register) -> dict[str, Any]:
        results, accepted = self.registry.add(params.channels)
        self._after_accept(accepted)
        self._audit_channels("channels/register", results)
        return {"results": results}

    def _changed(self, params: Changed) -> dict[str, Any]:
        added, accepted_added = self.registry.add(params.added)
        updated, _ = self.registry.add(params.updated, must_exist=True)  # an update opens nothing
        removed = self.registry.remove(params.removed)
        self._after_accept(accepted_added)
        self._audit_channels("channels/changed", added + updated + removed)
        return {"results": added + updated + removed}

    def _audit_channels(self, method: str, results: list[dict[str, Any]]) -> None:
        accepted = sum(1 for r in results if r["accepted"])
        self.log.info("mcpl.channels", method=method, accepted=accepted, refused=len(results) - accepted)

    def _after_accept(self, channels: list[Channel]) -> None:
        if "channels.lifecycle" not in self.grant:
            return
        for channel in channels:
            if channel.initiallyOpen:
                self._schedule("open", channel)

    def _incoming(self, batch: IncomingBatch | WellFormedBatch) -> Deferred:
        results: list[dict[str, Any] | None] = []
        admitted = []
        for raw in batch.messages:
            outcome = admit_message(raw, self.registry, self.accepted_implies)
            if isinstance(outcome, dict):
                results.append(outcome)
            else:
                results.append(None)
                admitted.append(outcome)

        async def store() -> dict[str, Any]:
            stored = iter(await self.intake.store_messages(self.name, "channels/incoming", admitted) if admitted else [])
            final = [entry if entry is not None else next(stored) for entry in results]
            # Debug, not info: each stored item is itself the audit record of a
            # message (connector, source, acceptedAt), and a line per request
            # would cost more than storing it on a busy connector.
            self.log.debug("mcpl.incoming", messages=len(final), accepted=sum(1 for r in final if r.get("accepted")))
            return {"results": final}

        return Deferred(store)

    def _push(self, push: PushEvent) -> Deferred:
        problem = self.intake.content_problem(push.payload.content)
        if problem is not None:  # a params problem: checked before the feature set (§3.1)
            raise errors.invalid_params(f"push payload refused: {problem}", {"reason": problem})
        admitted = admit_push(push, self.registry, self.feature_sets, legacy=self.legacy,
                              accepted_implies=self.accepted_implies)

        async def store() -> dict[str, Any]:
            try:
                answer = await self.intake.store_push(self.name, admitted)
            except errors.ConnectorProtocolError as exc:
                self.log.info("mcpl.refused", method="push/event", code=exc.code, featureSet=admitted.feature_set,
                              eventId=admitted.event_id, capability=None,
                              reason=exc.data.get("reason") if isinstance(exc.data, dict) else None)
                raise
            self.log.info("mcpl.push", featureSet=admitted.feature_set, eventId=admitted.event_id,
                          channel=admitted.channel_id, outcome=answer)
            return answer

        return Deferred(store)

    def _manifest_changed(self, params: Raw | UnsetType) -> None:
        decode_params(params, ManifestChanged, "mcpl/manifestChanged")
        if self.mode is not Mode.READY:
            # No MCPL in force (MCP-only, closed, or still negotiating): nothing a
            # manifest could change, and a policy sent now could make a fallen
            # connection ready again.
            self._warn_once("hint-not-ready", "connector.manifest_hint_ignored", mode=self.mode.value)
            return
        dropped = self.tracker.dropped
        if self.tracker.should_fetch():
            self._schedule("manifest", None)
        elif self.tracker.dropped > dropped:  # over the cap (a hint merged into a pending fetch is not dropped)
            self.log.warning("connector.manifest_fetch_dropped", reason="rate limit",
                             dropped=self.tracker.dropped)

    def _schedule(self, job: str, arg: Any) -> None:
        try:
            self._jobs_in.send_nowait((job, arg))
        except anyio.WouldBlock:
            self.log.warning("connector.job_dropped", job=job, reason="queue full")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.log.info("connector.job_dropped", job=job, reason="connection ending")

    def _warn_once(self, key: str, event: str, **fields: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.log.warning(event, **fields)

    # --- host-initiated work -----------------------------------------------------

    async def run_background(self) -> None:
        """Serve host-initiated jobs one at a time until the connection ends."""
        async with self._jobs_out:
            async for job, arg in self._jobs_out:
                try:
                    if job == "open":
                        if self.registry.get(arg.id) != arg:
                            # Removed or replaced while the job waited: nothing of ours to open.
                            self.log.info("connector.job_skipped", job=job, channel=arg.id, reason="not_registered")
                            continue
                        await self.open_channel(arg)
                    elif job == "manifest":
                        await self.refresh_manifest()
                except (RemoteError, RequestTimeout) as exc:
                    self.log.warning("connector.job_failed", job=job, error=str(exc))
                except errors.ConnectorProtocolError as exc:
                    # The grant narrowed while the job waited (e.g. channels.lifecycle revoked).
                    self.log.info("connector.job_skipped", job=job, code=exc.code,
                                  data=None if exc.data is msgspec.UNSET else exc.data)
                except ConnectionClosed:
                    return  # the connector is gone; its life ends without us
                except PolicyClosed as exc:
                    self._close_by_policy(str(exc))

    def _close_by_policy(self, why: str) -> None:
        """A later policy was refused with fallback "close": serve nothing more.

        Every privileged method is refused from now on, and `closed_by_policy`
        tells the supervisor to end this process life.
        """
        self.grant, self.feature_sets, self.mode = frozenset(), {}, Mode.CLOSED
        self.registry.clear()
        self.log.warning("connector.policy_closed", reason=why)
        self.closed_by_policy.set()

    def close_jobs(self) -> None:
        self._jobs_in.close()

    async def open_channel(self, channel: Channel) -> None:
        """channels/open for a channel; the returned descriptor is judged like a registration."""
        assert self.session is not None
        if "channels.lifecycle" not in self.grant:
            raise errors.capability_denied("channels.lifecycle")
        raw = await self.session.request(
            "channels/open",
            {"type": channel.type, "address": channel.address, "metadata": channel.metadata or {}},
            timeout=self.spec.request_timeout_s,
        )
        result = msgspec.json.decode(bytes(raw))
        descriptor = result.get("channel") if isinstance(result, dict) else None
        if descriptor is not None:
            if "channels.register" in self.grant:  # the grant at the answer, not at the registration
                results, _ = self.registry.add([descriptor])
            else:
                ident = descriptor.get("id") if isinstance(descriptor, dict) else None
                results = [{"id": ident, "accepted": False, "reason": "capability_denied"}]
            if not results[0]["accepted"]:
                self.log.warning("channels.descriptor_refused", channel=results[0]["id"],
                                 reason=results[0].get("reason"), detail="returned by channels/open")
        self.log.info("channels.opened", channel=channel.id)

    async def close_channel(self, channel_id: str) -> None:
        assert self.session is not None
        if "channels.lifecycle" not in self.grant:
            raise errors.capability_denied("channels.lifecycle")
        await self.session.request("channels/close", {"channelId": channel_id}, timeout=self.spec.request_timeout_s)
        self.log.info("channels.closed", channel=channel_id)

    async def update_policy(self, grant: frozenset[str]) -> Mode:
        """Change the grant: narrowing applies at once, widening only after a valid receipt."""
        if self.mode is not Mode.READY:
            raise errors.capability_denied("featureSets", "not_ready")
        # Never grant what the server did not advertise (§5.4), whatever the caller asks for.
        try:
            return await self._send_policy(frozenset(grant) & advertised_paths(self.capabilities), initial=False)
        except PolicyClosed as exc:
            self._close_by_policy(str(exc))
            raise

    async def refresh_manifest(self) -> None:
        """mcpl/manifest, then apply what changed: removals now, additions pending (§17)."""
        if self.mode is not Mode.READY:
            # Queued before the connection fell back (or never got MCPL): there is
            # nothing to refresh, and a policy sent now could make it ready again.
            self.log.info("connector.job_skipped", job="manifest", mode=self.mode.value)
            return
        assert self.session is not None and self.manifest is not None
        self.tracker.fetched()
        try:
            raw = await self.session.request("mcpl/manifest", {}, timeout=self.spec.request_timeout_s)
            fetched = msgspec.json.decode(bytes(raw))
        except (RemoteError, RequestTimeout, msgspec.DecodeError) as exc:
            self.tracker.failed()
            self.log.warning("connector.manifest_fetch_failed", error=str(exc), failures=self.tracker.failures)
            return
        change = self.tracker.diff(self.manifest, fetched, self.capabilities, self.grant, list(self.spec.grant),
                                   self.feature_sets, self.spec.feature_sets)
        if change is None:
            self.log.warning("connector.manifest_unusable", failures=self.tracker.failures)
            return
        self.manifest = change.manifest
        self.capabilities = change.capabilities
        self.declared = change.declared
        if change.ontology_changed and self.accepted_implies is not None:
            self.accepted_implies = None  # a changed ontology cancels the operator's acceptance
        self.log.info("connector.manifest_change", impacts=change.impacts)
        if change.grant != self.grant or change.feature_sets_changed:
            await self._send_policy(change.grant, initial=False)


def _claims(params: Raw | UnsetType) -> dict[str, Any]:
    """What a refused request's params claim (featureSet, eventId), for the audit line only."""
    try:
        decoded = msgspec.json.decode(bytes(params)) if isinstance(params, Raw) else None
    except msgspec.DecodeError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {k: decoded[k] for k in ("featureSet", "eventId") if isinstance(decoded.get(k), str)}


def _manifest_of(capabilities: dict[str, Any]) -> dict[str, Any] | None:
    experimental = capabilities.get("experimental")
    manifest = experimental.get("mcpl") if isinstance(experimental, dict) else None
    return manifest if isinstance(manifest, dict) else None
