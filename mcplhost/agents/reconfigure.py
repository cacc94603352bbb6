"""A reload's agents, built whole before anything running changes (docs/operations.md#reload).

    plan = await runtime.prepare_reload(agents)   # ConfigError naming every problem; what it built is closed
    changed = await runtime.apply_reload(plan)    # hands it over, each agent between two of its turns
    (mcplhost/agents/runtime.py: `AgentsReload` holds the plan)

Preparing reads every agent's prompt again (an edited `system_prompt_file`
is a changed agent, though its table is the same) and builds what each
changed or new agent needs: a backend where its table changed
(`build_backend`: an SDK constructor that refuses the table is a problem
named by its path, never an exception out of the reload), its tools, a new
agent's runner. Nothing running is touched until all of it is built; what
a refused or cancelled reload built is closed (`close_backends`).
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio
import msgspec
import structlog

from mcplhost.agents.backends import make_backend
from mcplhost.agents.model import Backend
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.config import AgentConfig, BackendConfig
from mcplhost.errors import ConfigError

log = structlog.get_logger()

#: How long closing the backends a reload built and did not use may take (they have made no call).
DISCARD_CLOSE_S = 5.0


def build_backend(where: str, backend: BackendConfig) -> Backend:
    """`make_backend`, with any failure of the SDK's constructor as a ConfigError naming `where`.

    (httpx's InvalidURL for a `base_url` it cannot parse is one; mcplhost/config/values.py's
    `base_url_problem` refuses those first, this catches what it cannot see.)
    """
    try:
        return make_backend(backend)
    except Exception as exc:  # the SDK's own checks: whatever it raises, the reload or start is refused
        problem = f"{where}: cannot be built: {type(exc).__name__}: {exc}"
        raise ConfigError("the config cannot be built", problems=[problem]) from None


class AgentUpdate(msgspec.Struct, frozen=True):
    """A running agent's new settings, built."""

    agent: AgentConfig
    prompt: str  # its system prompt, read for this reload
    backend: Backend | None  # a new backend (its table changed); None: it keeps the running one
    toolbox: ToolBox


async def close_backends(backends: Iterable[Backend]) -> None:
    """Close backends no agent uses (a refused or cancelled reload's), shielded and bounded; failures logged."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(DISCARD_CLOSE_S):
        for backend in backends:
            await close_backend(backend, backend=backend.name)


async def close_backend(backend: Backend, /, **where: str) -> None:
    """Close one backend; whatever its SDK raises is logged with `where` (the agent, or the backend's name).

    The one boundary around a backend's close: an SDK's own failure to
    close its client never stops the others from closing, nor a shutdown.
    """
    try:
        await backend.aclose()
    except Exception:
        log.warning("agent.backend_close_failed", **where, exc_info=True)
