"""The MCPL 0.5 capability vocabulary (SPEC §6.2, Appendix B.2).

These seventeen dot-separated paths are the only things a grant can contain
and the only values a feature set's `uses` may name. The host grants only what
it understands, so anything outside this list is never granted, whatever a
server advertises.
"""

from __future__ import annotations

SORTED_CAPABILITY_PATHS: tuple[str, ...] = tuple(
    sorted(
        (
            "pushEvents",
            "tools",
            "modelInfo",
            "inferenceRequest",
            "inferenceRequest.streaming",
            "inferenceLifecycle",
            "contextHooks.beforeInference.observe",
            "contextHooks.beforeInference.inject.system",
            "contextHooks.beforeInference.inject.beforeUser",
            "contextHooks.beforeInference.inject.afterUser",
            "channels.register",
            "channels.lifecycle",
            "channels.publish",
            "channels.incoming",
            "channels.streaming",
            "channels.acknowledge",
            "channels.typing",
        )
    )
)
CAPABILITY_PATHS: frozenset[str] = frozenset(SORTED_CAPABILITY_PATHS)

# The one path that lets a server write into the system prompt. SPEC §13.4:
# denied by default, and it must be grantable on its own.
INJECT_SYSTEM = "contextHooks.beforeInference.inject.system"

# Members of the `experimental.mcpl` object that are not capabilities. Every
# other root member is part of the advertisement (SPEC §6.2, §3.9).
NON_CAPABILITY_MEMBERS: frozenset[str] = frozenset({"version", "revision", "featureSets"})

# `tools` is advertised by MCP's own `capabilities.tools`, not inside the MCPL
# block, so the MCPL walk never yields it.
MCP_ADVERTISED_PATHS: frozenset[str] = frozenset({"tools"})

assert len(CAPABILITY_PATHS) == 17
assert INJECT_SYSTEM in CAPABILITY_PATHS
assert MCP_ADVERTISED_PATHS <= CAPABILITY_PATHS
