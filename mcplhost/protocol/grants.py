"""Capability advertisement and the effective grant (SPEC §5.1, §5.4).

The grant is MCPL's security boundary. It is computed here, purely:

    effective grant = (vocabulary paths the server advertised)
                    ∩ (vocabulary paths some host policy pattern matches)

Advertisement is read with a generic recursive walk of the manifest; there is
no list of nestable keys, so a deeper vocabulary needs no code change. Policy
patterns match whole paths segment by segment, and `*` stands for exactly one
segment. Nothing here widens a grant because of anything else a server says.

On top of that pure rule, a connection grants only what this host
implements (`IMPLEMENTED`, narrowed by `offered_paths`): the same set is
what `initialize` advertises (`host_capabilities`), so a connector is never
told it may use what nothing here serves.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from mcplhost.protocol.vocabulary import (
    CAPABILITY_PATHS,
    INJECT_SYSTEM,
    MCP_ADVERTISED_PATHS,
    NON_CAPABILITY_MEMBERS,
    SORTED_CAPABILITY_PATHS,
)

WILDCARD = "*"
SEPARATOR = "."

# Grantable only by its literal name, never through a wildcard: a policy such
# as `contextHooks.beforeInference.inject.*` must not hand out the system
# prompt by accident (SPEC §13.4 and §5.4; docs/mcpl-checklist.md item 7).
LITERAL_ONLY_PATHS: frozenset[str] = frozenset({INJECT_SYSTEM})

# Every proper prefix of a vocabulary path. The walk descends only into nodes
# on one of these, so arbitrarily deep junk costs nothing and cannot recurse
# without bound.
_PREFIXES: frozenset[str] = frozenset(
    SEPARATOR.join(path.split(SEPARATOR)[:depth])
    for path in CAPABILITY_PATHS
    for depth in range(1, path.count(SEPARATOR) + 1)
)


#: The capability paths this host implements, advertised in `initialize` and the
#: most any grant holds. Each change that implements a capability adds it here,
#: in the same commit, so the host never offers what it cannot do. The agents' side:
#: MCP `tools` (agent tools, also for MCP-only connectors), the four `beforeInference`
#: hook leaves and `inferenceLifecycle`; inferenceRequest (and .streaming) and
#: modelInfo, offered only with `[inference]` (`offered_paths`), and channels.publish
#: (the speech router, the outbox and its senders), and channels.streaming (a
#: turn's streamed text, speech/streaming.py), and channels.typing and channels.acknowledge, extensions shaped as
#: discord-mcpl defines them (speech/typing.py, agents/turns/acknowledge.py; docs/mcpl-compat.md#typing-and-acknowledge).
IMPLEMENTED: frozenset[str] = frozenset({
    "inferenceRequest",
    "inferenceRequest.streaming",
    "modelInfo",
    "pushEvents",
    "tools",
    "channels.register",
    "channels.incoming",
    "channels.lifecycle",
    "channels.streaming",
    "channels.publish",
    "channels.typing",
    "channels.acknowledge",
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.system",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
    "inferenceLifecycle",
})

#: Paths that need a model for connectors: offered only when `[inference]` is
#: configured. Lifecycle is not one: it reports the agents' own inferences, which need no `[inference]`.
INFERENCE_PATHS: frozenset[str] = frozenset(
    {"inferenceRequest", "inferenceRequest.streaming", "modelInfo"}
)

#: The hook leaves: a connector holding any of them is asked `context/beforeInference` (SPEC §10).
HOOK_PATHS: frozenset[str] = frozenset({
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.system",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
})


def offered_paths(implemented: frozenset[str] = IMPLEMENTED, *, inference_configured: bool = False) -> frozenset[str]:
    """What this host may grant: what it implements, inference paths only when a model is configured."""
    offered = implemented & CAPABILITY_PATHS
    return offered if inference_configured else offered - INFERENCE_PATHS


def host_capabilities(offered: frozenset[str], version: str) -> dict[str, object]:
    """The `experimental.mcpl` block a host advertises: exactly `offered`, nested, plus feature-set support.

    `tools` is MCP's own capability (advertised by servers, not hosts), so it
    never appears here. A path beneath another vocabulary path advertises
    that one too (`inferenceRequest.streaming` implies
    `inferenceRequest`), so offer the parent with it.
    """
    block: dict[str, object] = {"version": version}
    for path in sorted(offered - MCP_ADVERTISED_PATHS):
        *parents, leaf = path.split(SEPARATOR)
        node = block
        for name in parents:
            child = node.get(name)
            if not isinstance(child, dict):
                # A present object node advertises its own path too, so
                # `inferenceRequest: true` may become `inferenceRequest: {streaming: true}`.
                child = node[name] = {}
            node = child
        # `true` would advertise every path beneath too; an empty object advertises just this one.
        node.setdefault(leaf, {} if path in _PREFIXES else True)
    block["featureSets"] = True
    return block


def _paths_at_or_below(prefix: str) -> frozenset[str]:
    """Vocabulary paths equal to `prefix` or beneath it."""
    return frozenset(
        path for path in CAPABILITY_PATHS if path == prefix or path.startswith(prefix + SEPARATOR)
    )


def _walk(node: dict[Any, Any], prefix: str, found: set[str]) -> None:
    for name, value in node.items():
        # A member name holding the separator would alias another tree
        # ({"a.b": {"c": true}} and {"a": {"b.c": true}}), so it never grants.
        if not isinstance(name, str) or not name or SEPARATOR in name:
            continue
        path = f"{prefix}{SEPARATOR}{name}" if prefix else name
        if value is True:
            # Shorthand: `true` means every leaf beneath this node.
            found.update(_paths_at_or_below(path))
        elif isinstance(value, dict):
            # A present, non-false object node counts at its own path too:
            # {"inferenceRequest": {"streaming": false}} advertises `inferenceRequest`.
            if path in CAPABILITY_PATHS:
                found.add(path)
            if path in _PREFIXES:
                _walk(value, path, found)
        # false, null, numbers, strings and arrays advertise nothing.


def advertised_paths(capabilities: Any) -> frozenset[str]:
    """Vocabulary paths a server advertised in its `initialize` result.

    `capabilities` is the result's `capabilities` object. The MCPL block at
    `experimental.mcpl` is walked recursively, skipping `version`, `revision`
    and `featureSets`; `tools` comes from MCP's own `capabilities.tools`
    (present and not false or null). Unknown paths are dropped: the host
    grants only what it understands. Malformed input yields fewer paths, never
    an exception.
    """
    if not isinstance(capabilities, dict):
        return frozenset()
    found: set[str] = set()
    experimental = capabilities.get("experimental")
    manifest = experimental.get("mcpl") if isinstance(experimental, dict) else None
    if isinstance(manifest, dict):
        members = {k: v for k, v in manifest.items() if k not in NON_CAPABILITY_MEMBERS}
        _walk(members, "", found)
        found -= MCP_ADVERTISED_PATHS
    if capabilities.get("tools") not in (None, False):
        found.add("tools")
    return frozenset(found)


def pattern_matches(pattern: str, path: str) -> bool:
    """Whether a policy pattern matches a concrete capability path.

    Segments are compared one to one and the counts must be equal. A `*`
    segment matches exactly one segment; there is no subtree wildcard, and a
    `*` inside a segment (`chan*`) is just a character.
    """
    pattern_segments = pattern.split(SEPARATOR)
    path_segments = path.split(SEPARATOR)
    if len(pattern_segments) != len(path_segments):
        return False
    return all(
        want == WILDCARD or want == got for want, got in zip(pattern_segments, path_segments)
    )


def policy_allows(policy: Iterable[str], path: str) -> bool:
    """Whether host policy allows `path` (ignoring advertisement).

    `contextHooks.beforeInference.inject.system` is allowed only when the
    policy names it literally.
    """
    patterns = [p for p in policy if isinstance(p, str)]
    if path in LITERAL_ONLY_PATHS:
        return path in patterns
    return any(pattern_matches(pattern, path) for pattern in patterns)


def effective_grant(capabilities: Any, policy: list[str]) -> list[str]:
    """The effective grant for one connection: sorted, unique, concrete paths.

    `capabilities` is the MCP `initialize` result's `capabilities` object and
    `policy` the operator's patterns for this connector. The result is
    advertised ∩ allowed, where a pattern allows the vocabulary paths it
    matches segment for segment (`channels.*` allows `channels.publish` but
    nothing deeper; a bare parent such as `channels` allows nothing beneath
    it). `contextHooks.beforeInference.inject.system` is granted ONLY when
    the policy names it literally, never through a `*`, so it stays denied by
    default and is grantable on its own.
    """
    advertised = advertised_paths(capabilities)
    return [
        path
        for path in SORTED_CAPABILITY_PATHS
        if path in advertised and policy_allows(policy, path)
    ]


def mcp_only_grant(capabilities: Any, policy: list[str], offered: frozenset[str]) -> frozenset[str]:
    """What a connection serving plain MCP holds: MCP's own paths (`tools`), advertised, allowed and offered.

    An MCP-only connector has no MCPL grant, but an operator's `grant` naming
    `tools` still governs its MCP tools, and leaving `tools` out denies them
    in MCP-only mode too.
    """
    return frozenset(effective_grant(capabilities, policy)) & MCP_ADVERTISED_PATHS & offered


def denied_paths(capabilities: Any, granted: Iterable[str]) -> list[str]:
    """Advertised paths left out of the grant, sorted.

    Diagnostic only (`deniedCapabilities`): it must never feed an
    authorization decision, and it never shares a path with `granted`.
    """
    return sorted(advertised_paths(capabilities) - set(granted))


# --- the operator's side: grant patterns in the config, refusals in the log ------------


def unknown_grant_problem(pattern: str) -> str | None:
    """Why a well-formed grant pattern can never grant anything, or None when it names a capability.

    Walks the vocabulary segment by segment, so a misspelling is reported
    where it happens with the names that fit there (`channels.incomming`:
    'incomming' under 'channels', did you mean 'incoming'). A pattern that
    stops at a branch (`contextHooks`) or whose only match is the literal-only
    system-prompt path (`contextHooks.*.inject.system`) grants nothing either.
    """
    segments = pattern.split(SEPARATOR)
    candidates = [path.split(SEPARATOR) for path in SORTED_CAPABILITY_PATHS]
    for depth, want in enumerate(segments):
        below = [c for c in candidates if len(c) > depth and want in (WILDCARD, c[depth])]
        if not below:
            where = SEPARATOR.join(segments[:depth])
            known = sorted({c[depth] for c in candidates if len(c) > depth})
            if not known:
                itself = "" if WILDCARD in segments[:depth] else f"; grant {where!r} itself"
                return f"{pattern!r}: no capability lies beneath {where!r}{itself}"
            close = difflib.get_close_matches(want, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            place = f"under {where!r}" if depth else "at the top level"
            return f"{pattern!r}: {want!r} is no capability {place}{hint}; there: {', '.join(known)}"
        candidates = below
    matched = {SEPARATOR.join(c) for c in candidates if len(c) == len(segments)}
    if not matched:
        leaves = ", ".join(sorted(SEPARATOR.join(c) for c in candidates))
        return f"{pattern!r} is a branch, not a capability, and grants nothing by itself; grant what is beneath: {leaves}"
    if matched <= LITERAL_ONLY_PATHS and pattern not in LITERAL_ONLY_PATHS:
        (only,) = matched
        return f"{pattern!r} matches only {only}, which is granted by its literal name alone, never through *"
    return None


def missing_grant_hint(capability: str, *, advertised: frozenset[str], offered: frozenset[str]) -> str:
    """What an operator can do about a refusal because `capability` is not in a connector's grant.

    Adding it to the connector's `grant` helps only when the connector
    advertised it and this host offers it; otherwise say which side lacks it.
    """
    if capability not in offered:
        extra = " (configure [inference] to offer it)" if capability in INFERENCE_PATHS else ""
        return f"this host does not offer {capability}{extra}"
    if capability not in advertised:
        return f"the connector did not advertise {capability} in initialize, so no grant can include it"
    return f'add "{capability}" to this connector\'s grant in the config'
