"""Rules across fields: `problems` (what the host refuses) and `warnings` (allowed but surely not meant).

Each is a list of ``path.to.field: what is wrong``, the form check-config
prints; one pass finds every problem, the type checks' included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .check import check, entries, is_int, strings
from .environment import api_key_variables
from .schema import DEFAULT_DEBOUNCE_MS, DEFAULT_WAKE_ON, Config
from .values import (
    NAME_PATTERN,
    WAKE_ON_KEYWORDS,
    UnknownGrant,
    base_url_problem,
    grant_pattern_problems,
    hears_problems,
    is_loopback,
    listen_address,
    wake_from_problems,
    wake_on_problems,
)


def problems(raw: Any, *, unknown_grant: UnknownGrant | None = None) -> list[str]:
    """Every problem in a decoded TOML document, as ``path: what is wrong``.

    Grant patterns are checked against the capability vocabulary only with `unknown_grant` (`UnknownGrant`).
    """
    return check(raw, Config, "") + _cross_field(raw if isinstance(raw, dict) else {}, unknown_grant)


def _cross_field(raw: dict[str, Any], unknown_grant: UnknownGrant | None) -> list[str]:
    """Rules across fields, read defensively so they run beside the type checks."""
    found: list[str] = []
    for kind in ("connectors", "agents"):
        seen: dict[str, int] = {}
        for i, item in entries(raw, kind):
            name = item.get("name")
            if not isinstance(name, str) or not name:
                continue
            if not NAME_PATTERN.fullmatch(name):
                found.append(f"{kind}[{i}].name: {name!r} must match {NAME_PATTERN.pattern} "
                             "(a letter or digit, then up to 31 letters, digits, _ or -)")
            if name in seen:
                found.append(f"{kind}[{i}].name: {name!r} is already used by {kind}[{seen[name]}]")
            seen.setdefault(name, i)
    api_keys = api_key_variables(raw)
    for i, connector in entries(raw, "connectors"):
        grant = connector.get("grant")
        for j, pattern in enumerate(grant if isinstance(grant, list) else []):
            if isinstance(pattern, str) and pattern:
                found += [f"connectors[{i}].grant[{j}]: {why}"
                          for why in grant_pattern_problems(pattern, unknown_grant)]
        found += [f"connectors[{i}].{why}" for why in withheld_name_problems(connector, api_keys)]
    connector_names = {c.get("name") for _, c in entries(raw, "connectors") if isinstance(c.get("name"), str)}
    agent_names = {a.get("name") for _, a in entries(raw, "agents") if isinstance(a.get("name"), str)}
    for i, connector in entries(raw, "connectors"):
        speaks_for = connector.get("agent")
        if isinstance(speaks_for, str) and speaks_for and speaks_for not in agent_names:
            known = ", ".join(sorted(agent_names)) or "none"
            found.append(f"connectors[{i}].agent: no agent is named {speaks_for!r} (configured: {known})")
    for i, agent in entries(raw, "agents"):
        found += [f"agents[{i}].{why}" for why in agent_problems(agent, connector_names)]
    found += _parent_problems(entries(raw, "agents"))
    metrics = raw.get("metrics")
    listen = metrics.get("listen") if isinstance(metrics, dict) else None
    if isinstance(listen, str) and listen:
        try:
            listen_address(listen)
        except ValueError as exc:
            found.append(f"metrics.listen: {exc}")
    console = raw.get("console")
    if isinstance(console, dict):
        found += [f"console.{why}" for why in console_problems(console)]
    inference = raw.get("inference")
    if isinstance(inference, dict) and isinstance(inference.get("backend"), dict):
        found += [f"inference.backend.{why}" for why in backend_problems(inference["backend"])]
    moderation = raw.get("moderation")
    if isinstance(moderation, dict):
        found += [f"moderation.{why}" for why in moderation_problems(moderation)]
    return found


def console_problems(console: dict[str, Any]) -> list[str]:
    """`[console]`'s cross-field problems: `listen` is HOST:PORT, and off loopback it needs `token_file`."""
    listen = console.get("listen")
    if not isinstance(listen, str) or not listen:
        return []
    try:
        host, _port = listen_address(listen)
    except ValueError as exc:
        return [f"listen: {exc}"]
    if not is_loopback(host) and console.get("token_file") is None:
        return [f"token_file: required when listen ({listen}) is not a loopback address: every visitor signs in "
                "with its token (a file of mode 0600 holding one line, e.g. from `openssl rand -hex 32`)"]
    return []


#: The `[moderation]` keys only kind "openai" reads (kind "command" refuses them rather than ignore them).
OPENAI_MODERATION_KEYS = ("model", "base_url", "api_key_env")


def moderation_problems(moderation: dict[str, Any]) -> list[str]:
    """`[moderation]`'s cross-field problems: kind "command" needs `command`, each kind refuses the other's keys."""
    kind = moderation.get("kind")
    if kind == "command":
        found = [] if "command" in moderation else ['command: required for kind "command"']
        return found + [f'{key}: not used by kind "command" (only by kind "openai")'
                        for key in OPENAI_MODERATION_KEYS if key in moderation]
    if kind == "openai" and "command" in moderation:
        return ['command: not used by kind "openai" (it calls the moderations endpoint; set model, base_url, '
                'api_key_env)']
    return _base_url_problems(moderation) if kind == "openai" else []


def withheld_name_problems(connector: dict[str, Any], api_keys: Mapping[str, str]) -> list[str]:
    """A connector's `env_pass` or `env` naming a variable that holds one of the host's api keys."""
    found: list[str] = []

    def named(field: str, name: str) -> None:
        found.append(f"{field}: {name} holds an api key of this host (named by {api_keys[name]}); "
                     "connectors never get it: give the connector its own variable")

    for j, name in strings(connector.get("env_pass")):
        if name in api_keys:
            named(f"env_pass[{j}]", name)
    env = connector.get("env")
    for name in env if isinstance(env, dict) else {}:
        if name in api_keys:
            named(f"env.{name}", name)
    return found


def agent_problems(agent: dict[str, Any], connector_names: set[str]) -> list[str]:
    """One agent table's cross-field problems, each as ``field: what is wrong`` (without the agent's path)."""
    found: list[str] = []
    for j, entry in strings(agent.get("hears")):
        found += [f"hears[{j}]: {why}" for why in hears_problems(entry, connector_names)]
    for j, entry in strings(agent.get("wake_on")):
        found += [f"wake_on[{j}]: {why}" for why in wake_on_problems(entry, connector_names)]
    for j, entry in strings(agent.get("wake_from")):
        found += [f"wake_from[{j}]: {why}" for why in wake_from_problems(entry, connector_names)]
    for j, entry in strings(agent.get("control_from")):
        found += [f"control_from[{j}]: {why}" for why in wake_from_problems(entry, connector_names)]
    if agent.get("system_prompt") is not None and agent.get("system_prompt_file") is not None:
        found.append("system_prompt_file: set together with system_prompt; give one of them")
    debounce, max_wait = agent.get("debounce_ms", DEFAULT_DEBOUNCE_MS), agent.get("max_wait_ms")
    if is_int(debounce) and is_int(max_wait) and max_wait < debounce:
        found.append(f"max_wait_ms: {max_wait} is less than debounce_ms ({debounce}); "
                     "a turn could never wait out its debounce")
    backend = agent.get("backend")
    if isinstance(backend, dict):
        found += [f"backend.{why}" for why in backend_problems(backend)]
    return found


def backend_problems(backend: dict[str, Any]) -> list[str]:
    """A backend table's cross-field problems: a network backend names its model; its base_url can be used."""
    kind = backend.get("kind", "scripted")
    found = [f"model: required for kind {kind!r}"] if kind in ("openai", "anthropic") and backend.get("model") is None \
        else []
    return found + _base_url_problems(backend)


def _base_url_problems(table: dict[str, Any]) -> list[str]:
    url = table.get("base_url")
    why = base_url_problem(url) if isinstance(url, str) and url else None
    return [f"base_url: {why}"] if why else []


#: Most ancestors an agent may have (its depth below its tree's root); docs/peers.md#trees.
MAX_TREE_DEPTH = 32


def _parent_problems(agents: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """A parent names an agent of this file, following parents ends, and within MAX_TREE_DEPTH steps."""
    found: list[str] = []
    parents = {a.get("name"): a.get("parent") for _, a in agents}
    for i, agent in agents:
        parent = agent.get("parent")
        if not isinstance(parent, str) or not parent:
            continue
        if parent not in parents:
            found.append(f"agents[{i}].parent: no agent is named {parent!r}")
            continue
        chain, cursor = {agent.get("name")}, parent
        while isinstance(cursor, str):
            if cursor in chain:
                found.append(f"agents[{i}].parent: the parent chain of {agent.get('name')!r} loops")
                break
            chain.add(cursor)
            if len(chain) - 1 > MAX_TREE_DEPTH:
                found.append(f"agents[{i}].parent: {agent.get('name')!r} is more than {MAX_TREE_DEPTH} levels"
                             " below its tree's root")
                break
            cursor = parents.get(cursor)
    return found


def warnings(raw: Any) -> list[str]:
    """Allowed but surely not meant: as ``path: what``, like problems."""
    raw = raw if isinstance(raw, dict) else {}
    found: list[str] = []
    for i, connector in entries(raw, "connectors"):
        if not connector.get("grant"):
            found.append(f"connectors[{i}].grant: empty: no item from this connector will ever be accepted")
    agents = entries(raw, "agents")
    parents = {agent.get("parent") for _, agent in agents}
    for i, agent in agents:
        # Peer messages wake an agent in a tree (docs/peers.md), whatever it hears.
        in_tree = isinstance(agent.get("parent"), str) or agent.get("name") in parents
        found += [f"agents[{i}].{why}" for why in _agent_warnings(agent, in_tree=in_tree)]
    found += _addressing_warnings(raw)
    return found


def addressed_wakers(connector: str, agents: list[tuple[str, Any, Any]]) -> list[str]:
    """The agents that hear `connector` and wake on `addressed`, from (name, hears, wake_on) read defensively.

    The one statement of who shares a connector's addressed items (docs/agents.md#addressing):
    mcplhost/agents/wake.py builds its `Addressing` with it, check-config its warning.
    """
    found = []
    for name, hears, wake_on in agents:
        heard = hears is None or any(isinstance(h, str) and h.partition("/")[0] == connector for h in hears)
        if heard and isinstance(wake_on, list) and "addressed" in wake_on:
            found.append(name)
    return found


def _addressing_warnings(raw: dict[str, Any]) -> list[str]:
    """A connector without `agent` whose addressed items several agents wake on: they are addressed by name."""
    agents = [(a.get("name"), a.get("hears"), a.get("wake_on", list(DEFAULT_WAKE_ON))) for _, a in entries(raw, "agents")
              if isinstance(a.get("name"), str)]
    found = []
    for i, connector in entries(raw, "connectors"):
        name = connector.get("name")
        if not isinstance(name, str) or connector.get("agent") is not None:
            continue
        wakers = addressed_wakers(name, agents)
        if len(wakers) > 1:
            found.append(f"connectors[{i}].agent: not set, and {', '.join(wakers)} all wake on addressed items of "
                         f"{name!r}: an addressed item wakes only the agents it names (@NAME, or NAME: at its "
                         "start); set agent = \"NAME\" for the agent this connector's bot speaks for")
    return found


def _agent_warnings(agent: dict[str, Any], *, in_tree: bool) -> list[str]:
    found: list[str] = []
    hears = agent.get("hears")
    if isinstance(hears, list):
        heard = {h.partition("/")[0] for h in hears if isinstance(h, str)}
        for j, entry in strings(agent.get("wake_on")):
            if entry not in WAKE_ON_KEYWORDS and entry.partition("/")[0] not in heard:
                found.append(f"wake_on[{j}]: {entry!r} names a connector the agent does not hear: it never wakes it")
        if not hears and not in_tree:
            found.append("hears: empty: the agent hears nothing and never wakes (it has no parent nor child "
                         "whose peer messages would wake it)")
    backend = agent.get("backend")
    if isinstance(backend, dict) and backend.get("script") and backend.get("kind", "scripted") != "scripted":
        found.append(f"backend.script: ignored by kind {backend.get('kind')!r} (scripted only)")
    return found
