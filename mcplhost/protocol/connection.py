"""MCPL for one process life of one connector: handshake, policy, and authorizing every inbound method.

States, in order: HANDSHAKE → POLICY_PENDING → READY, or MCP_ONLY (no MCPL
manifest, or the policy was refused with fallback "mcp-only"), or a
`PolicyClosed` raised to the supervisor (fallback "close").

Every inbound request is authorized in the read loop against the grant in
force at that moment, through the one method table (`methods.INBOUND`);
what each method does lives in `handlers`, and storing runs as `Deferred`
work so the loop keeps reading. Host-initiated follow-ups (opening
channels, manifest re-fetches, policy updates) go through one bounded job
stream served by `run_background` (`jobs`), one at a time, so policy
updates are serialized.

A connection is built with its session, before the session runs, and
answers what that session reads (it installs `on_request` and
`on_notification`); it lasts one process life. Handlers and jobs see it
through the Protocols of `context`, not as this class.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from msgspec import Raw, UnsetType

from mcplhost import __version__
from mcplhost.config import ConnectorConfig
from mcplhost.jsonobject import JsonObject
from mcplhost.logs import LimitedLog
from mcplhost.rpc import (
    ConnectionClosed,
    RemoteError,
    RequestTimeout,
    Session,
)

from . import errors, jobs
from .answers import ListedTool, OpenedChannel
from .channels import Channel, ChannelRegistry
from .counts import RefusalCounts
from .featuresets import FeatureSetState, derive_feature_sets, normalize_feature_sets
from .grants import (
    IMPLEMENTED,
    advertised_paths,
    effective_grant,
    host_capabilities,
    mcp_only_grant,
    missing_grant_hint,
    offered_paths,
)
from .intake import Intake
from .manifest import ManifestChange, ManifestTracker
from .methods import INBOUND, MCP_NOTIFICATIONS, MCP_NOTIFICATIONS_PREFIX, REMOVED, method_for
from .params import InitializeResult
from .policy import interim, judge_receipt, policy_params
from .ports import InferenceService, NoPendingHooks, PendingHooks
from .states import HandshakeFailed, Mode, PolicyClosed
from .tags import producer_implies

__all__ = ["HOST_MCPL_CAPABILITIES", "HandshakeFailed", "McplConnection", "Mode", "PolicyClosed"]

#: MCP protocol version we ask for; MCPL does not change MCP versioning (SPEC §3.1).
MCP_PROTOCOL_VERSION = "2024-11-05"
#: The MCPL version this host speaks.
MCPL_VERSION = "0.5"
#: What this host may grant by default: what it implements (no inference is configured yet).
OFFERED: frozenset[str] = offered_paths(IMPLEMENTED)
#: What this host advertises in `initialize`: exactly what it implements (RFC-002 §9.7).
HOST_MCPL_CAPABILITIES: dict[str, Any] = host_capabilities(OFFERED, MCPL_VERSION)
#: Host-initiated jobs waiting for the background worker.
MAX_PENDING_JOBS = 64
#: Distinct once-only warnings remembered per connection (the keys are connector-chosen strings).
MAX_WARNED_KEYS = 1024
#: The method label counts use for a method this host does not know (the name is the connector's, unbounded).
UNKNOWN_METHOD = "(unknown)"


class McplConnection:
    def __init__(self, spec: ConnectorConfig, session: Session, intake: Intake, log: Any, *,
                 clock: Callable[[], float] = time.monotonic, offered: frozenset[str] = OFFERED,
                 inference: InferenceService | None = None, hooks: PendingHooks | None = None,
                 on_mode: Callable[[McplConnection, Mode], None] | None = None,
                 limited: LimitedLog | None = None, counts: RefusalCounts | None = None,
                 on_channels: Callable[[], None] | None = None) -> None:
        self._on_mode = on_mode
        #: The `[inference]` service inference/request and model/info use, None when none is configured.
        self.inference = inference
        #: What the loop guard asks: whether this connector's own beforeInference is outstanding.
        self.hooks: PendingHooks = hooks if hooks is not None else NoPendingHooks()
        self._mode = Mode.HANDSHAKE
        self.spec = spec
        self.name = spec.name
        self.intake = intake
        self.log = log
        self.session = session
        session.on_request, session.on_notification = self.on_request, self.on_notification
        #: Lines the connector causes per message (refusals...): limited per event (mcplhost.logs).
        self.limited = limited if limited is not None else LimitedLog(log)
        #: Exact counts behind those lines, e.g. refused[(method, code)] (unknown methods as UNKNOWN_METHOD).
        self.refused: dict[tuple[str, int], int] = {}
        self.notifications_refused: dict[tuple[str, int], int] = {}
        self.notifications_unknown = 0
        #: The connector's refusals across all its lives (its handle's; a fresh one when built alone).
        self.counts = counts if counts is not None else RefusalCounts()
        self.offered = offered
        self.legacy = spec.protocol == "0.4"
        self.capabilities: dict[str, Any] = {}
        self.manifest: dict[str, Any] | None = None
        self.grant: frozenset[str] = frozenset()
        self._requested: frozenset[str] = frozenset()  # the grant of the latest featureSets/update sent
        self.feature_sets: dict[str, FeatureSetState] = {}
        self.declared: dict[str, dict[str, Any]] = {}
        #: `on_channels` hears every change of the registered channels (the handle's waiters, catch-up's routes).
        self.registry = ChannelRegistry(spec.channels, on_change=on_channels)
        #: The connector's MCP tools as its latest `tools/list` gave them (None: not listed in this life).
        self.tools: list[ListedTool] | None = None
        self.accepted_implies: dict[str, list[str]] | None = None
        self.tracker = ManifestTracker(clock)
        self._jobs_in, self._jobs_out = anyio.create_memory_object_stream[tuple[str, Any]](MAX_PENDING_JOBS)
        self._warned: set[str] = set()
        self._warned_capped = False
        #: Set when a later policy is refused with fallback "close": the supervisor ends this life.
        self.closed_by_policy = anyio.Event()

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        # The observer (the supervisor's handle) sees each change in the read loop, the moment it happens.
        changed = mode is not self._mode
        self._mode = mode
        if changed and self._on_mode is not None:
            self._on_mode(self, mode)

    @property
    def is_ready(self) -> bool:
        return self.mode is Mode.READY

    def list_tools_soon(self) -> None:
        """Queue a `tools/list` (after each ready handshake and on list_changed) while `tools` is granted."""
        if "tools" in self.grant:
            self.schedule(jobs.TOOLS, None)

    # --- handshake -----------------------------------------------------------

    async def handshake(self) -> Mode:
        """initialize → notifications/initialized → the initial featureSets/update."""
        session = self.session

        def initialized_at_receipt(outcome: Raw | RemoteError) -> InitializeResult:
            # Some connectors swallow whatever follows the initialize result unless
            # it is this notification (docs/mcpl-compat.md): queue it in the read loop, before
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
                    "capabilities": {"experimental": {"mcpl": host_capabilities(self.offered, MCPL_VERSION)}},
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
            self.legacy = version != MCPL_VERSION
        self.manifest = manifest
        self.log.info("connector.initialized", server=result.serverInfo, mcpl_version=version, legacy=self.legacy)
        self._adopt_manifest(manifest)
        if self.spec.accept_tag_implications:
            self.accepted_implies = producer_implies(self.declared)
        grant = self._initial_grant()
        self.mode = Mode.POLICY_PENDING
        try:
            return await self.send_policy(grant, initial=True)
        except ConnectionClosed as exc:
            raise HandshakeFailed(f"the connection ended before the policy receipt: {exc}") from exc

    def _initial_grant(self) -> frozenset[str]:
        """The SPEC §5.4 grant, less what this host does not implement (logged once: configured but inert)."""
        configured = frozenset(effective_grant(self.capabilities, list(self.spec.grant)))
        unimplemented = configured - self.offered
        if unimplemented:
            self.log.warning("connector.grant_unimplemented", paths=sorted(unimplemented),
                             detail="configured and advertised, but this host does not implement them yet")
        return configured & self.offered

    def _adopt_manifest(self, manifest: dict[str, Any]) -> None:
        self.declared = normalize_feature_sets(manifest.get("featureSets"))
        if not self.tracker.adopt(manifest):
            # A conformance defect to log, never a reason to reject the manifest (SPEC §17.2).
            self.log.warning("connector.defect", defect="manifest revision does not match its content")

    def adopt_change(self, change: ManifestChange) -> None:
        """Put a re-fetched manifest in force (its grant and feature sets follow through `send_policy`)."""
        self.manifest = change.manifest
        self.capabilities = change.capabilities
        self.declared = change.declared
        if change.ontology_changed and self.accepted_implies is not None:
            self.accepted_implies = None  # a changed ontology cancels the operator's acceptance

    # --- policy ----------------------------------------------------------------

    def _derive(self, grant: frozenset[str]) -> dict[str, FeatureSetState]:
        selection = self.spec.feature_sets
        return derive_feature_sets(self.declared, grant, selection.enabled, list(selection.disabled))

    async def send_policy(self, grant: frozenset[str], *, initial: bool) -> Mode:
        """Send featureSets/update as a Request; narrowing applies first, widening at the receipt.

        The receipt is applied in the read loop the moment it arrives
        (`at_receipt`), so a privileged request the connector sends right
        after its receipt already meets the new state.
        """
        states = self._derive(grant)
        if not initial:
            # Security never waits on the receipt: what narrows applies now.
            self._apply(*interim(self.grant, self.feature_sets, grant, self._derive))
        self._requested = grant
        try:
            return await self.session.request(
                "featureSets/update",
                policy_params(self.capabilities, grant, states, legacy=self.legacy,
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
        if verdict.fallback is not None:  # not ready: every such verdict names its fallback (policy.py)
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
        channels.register keeps no authority (SPEC §14): the registry goes with it.
        """
        self.grant, self.feature_sets = grant, states
        if "channels.register" not in grant:
            self.registry.clear()

    def _ready(self, grant: frozenset[str], states: dict[str, FeatureSetState]) -> Mode:
        self._apply(grant, states)
        self.mode = Mode.READY
        self.log.info("connector.ready", grant=sorted(grant), legacy=self.legacy,
                      feature_sets={n: s.reason or "enabled" for n, s in states.items()})
        self.list_tools_soon()
        return self.mode

    def _mcp_only(self, why: str) -> Mode:
        # Plain MCP keeps MCP's own `tools` when advertised and granted; nothing of MCPL.
        self.grant = mcp_only_grant(self.capabilities, list(self.spec.grant), self.offered)
        self.mode = Mode.MCP_ONLY
        self.registry.clear()
        self.log.warning("connector.mcp_only", reason=why)
        self.list_tools_soon()
        return self.mode

    def _fallback(self, fallback: str, why: str) -> Mode:
        if fallback == "close":
            self.grant = frozenset()
            raise PolicyClosed(why)
        return self._mcp_only(why)

    def close_by_policy(self, why: str) -> None:
        """A later policy was refused with fallback "close": serve nothing more.

        Every privileged method is refused from now on, and `closed_by_policy`
        tells the supervisor to end this process life.
        """
        self.grant, self.feature_sets, self.mode = frozenset(), {}, Mode.CLOSED
        self.registry.clear()
        self.log.warning("connector.policy_closed", reason=why)
        self.closed_by_policy.set()

    # --- authorization and dispatch -----------------------------------------------

    def _require(self, capability: str) -> None:
        if self.mode in (Mode.HANDSHAKE, Mode.POLICY_PENDING):
            raise errors.capability_denied(capability, "policy_pending")
        if self.mode is Mode.MCP_ONLY:
            raise errors.capability_denied(capability, "mcp_only")
        if self.mode is Mode.CLOSED:
            raise errors.capability_denied(capability, "closed")
        if capability not in self.grant:
            raise errors.capability_denied(capability)

    async def on_request(self, method: str, params: Raw | UnsetType) -> Any:
        """Answer one request from the connector; every refusal is also audit-logged (SPEC §13.2)."""
        try:
            entry = method_for(method)
            if entry is None:
                raise errors.method_not_found(method)
            if entry.capability is not None:
                self._require(entry.capability)
            if entry.request is None:
                raise errors.method_not_found(method)  # e.g. a notification-only method sent as a request
            return entry.request(self, params)
        except errors.ConnectorProtocolError as exc:
            self._audit_refusal(method, params, exc)
            raise

    def statistics(self) -> JsonObject:
        """Exact counts of what this connection refused or ignored, of the lines its limiter held back, and how
        many once-only warning keys it remembers (at most MAX_WARNED_KEYS)."""
        return {"refused": _labelled(self.refused), "notifications_refused": _labelled(self.notifications_refused),
                "notifications_unknown": self.notifications_unknown, "log_suppressed": self.limited.statistics(),
                "warned_keys": len(self._warned)}

    def count_refusal(self, method: str, code: int) -> None:
        """Count a refused request by method (a known one, else UNKNOWN_METHOD) and code."""
        key = (_method_label(method), code)
        self.refused[key] = self.refused.get(key, 0) + 1
        self.counts.request(*key)
        if method == "push/event":  # one push per request: a refused request is a refused item
            self.counts.item("push/event")

    def _audit_refusal(self, method: str, params: Raw | UnsetType, exc: errors.ConnectorProtocolError) -> None:
        data = exc.data if isinstance(exc.data, dict) else {}
        claimed = _claims(params) if method in ("push/event", "inference/request") else {}
        feature_set = data.get("featureSet", claimed.get("featureSet"))
        self.count_refusal(method, exc.code)
        self.limited.info("mcpl.refused", method=method, code=exc.code, featureSet=feature_set,
                          eventId=claimed.get("eventId"), capability=data.get("capability"), reason=data.get("reason"))
        capability = data.get("capability")
        if exc.code == errors.CAPABILITY_DENIED and "reason" not in data and isinstance(capability, str):
            # A missing grant is a config mistake that refuses every such call: say it loudly, once per life.
            self.warn_once(f"grant-missing:{capability}", "connector.grant_missing", capability=capability,
                           method=method, hint=missing_grant_hint(capability, offered=self.offered,
                                                                  advertised=advertised_paths(self.capabilities)))
        if data.get("reason") == errors.DECLARATION_MISMATCH:
            self.limited.warning("connector.declaration_mismatch", featureSet=feature_set,
                                 capability=data.get("capability"), method=method)

    async def on_notification(self, method: str, params: Raw | UnsetType) -> None:
        if method.startswith(MCP_NOTIFICATIONS_PREFIX):
            handler = MCP_NOTIFICATIONS.get(method)
            if handler is not None:
                await handler(self, params)
            return
        entry = method_for(method)
        if entry is None:
            self.notifications_unknown += 1
            self.warn_once(f"notification:{method}", "connector.unknown_notification", method=method)
            return
        try:
            if entry.capability is not None:
                self._require(entry.capability)
            if entry.notification is None:
                self.warn_once(f"notification:{method}", "connector.unexpected_notification", method=method)
                return
            await entry.notification(self, params)
        except errors.ConnectorProtocolError as exc:
            key = (method, exc.code)  # a known method: the table has it
            self.notifications_refused[key] = self.notifications_refused.get(key, 0) + 1
            self.limited.warning("connector.notification_refused", method=method, code=exc.code,
                                 data=None if exc.data is msgspec.UNSET else exc.data)

    def warn_once(self, key: str, event: str, **fields: Any) -> None:
        """Log `event` the first time `key` is seen on this connection; the memory of keys is bounded."""
        if key in self._warned:
            return
        if len(self._warned) >= MAX_WARNED_KEYS:
            # Past the cap, once-only warnings are suppressed; that itself is said once.
            if not self._warned_capped:
                self._warned_capped = True
                self.limited.warning("connector.warnings_capped", limit=MAX_WARNED_KEYS, suppressed=event,
                                     detail="more distinct once-only warnings than remembered; further ones suppressed")
            return
        self._warned.add(key)
        self.limited.warning(event, **fields)  # once per key, and per event at most the limiter's allowance

    # --- host-initiated work -----------------------------------------------------

    def schedule(self, job: str, arg: Any) -> None:
        """Queue host-initiated work for `run_background`; never waits (a full queue drops, logged)."""
        try:
            self._jobs_in.send_nowait((job, arg))
        except anyio.WouldBlock:
            self.limited.warning("connector.job_dropped", job=job, reason="queue full")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.log.info("connector.job_dropped", job=job, reason="connection ending")

    async def run_background(self) -> None:
        """Serve host-initiated jobs one at a time until the connection ends."""
        await jobs.serve(self, self._jobs_out)

    def close_jobs(self) -> None:
        self._jobs_in.close()

    async def open_channel(self, channel: Channel, *, timeout: float | None = None,
                           history: int = 0) -> OpenedChannel:
        """channels/open for a channel (asking for `history` entries of backscroll); its result."""
        return await jobs.open_channel(self, channel, timeout=timeout, history=history)

    async def refresh_manifest(self) -> None:
        """mcpl/manifest, then apply what changed: removals now, additions pending (SPEC §17)."""
        await jobs.refresh_manifest(self)


def _method_label(method: str) -> str:
    return method if method in INBOUND or method in REMOVED else UNKNOWN_METHOD


def _labelled(counts: dict[tuple[str, int], int]) -> dict[str, int]:
    """Counts keyed "method code" (e.g. "push/event -32002"), as a plain mapping for JSON."""
    return {f"{method} {code}": n for (method, code), n in sorted(counts.items())}


def _claims(params: Raw | UnsetType) -> dict[str, str]:
    """What a refused request's params claim (featureSet, eventId), for the audit line only."""
    try:
        decoded = msgspec.json.decode(bytes(params)) if isinstance(params, Raw) else None
    except msgspec.DecodeError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {k: decoded[k] for k in ("featureSet", "eventId") if isinstance(decoded.get(k), str)}


def _manifest_of(capabilities: dict[str, Any]) -> JsonObject | None:
    experimental = capabilities.get("experimental")
    manifest = experimental.get("mcpl") if isinstance(experimental, dict) else None
    return manifest if isinstance(manifest, dict) else None
