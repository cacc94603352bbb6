"""Rules across fields: `problems` (what the host refuses) and `warnings` (allowed but surely not meant).

Each is a list of ``path.to.field: what is wrong``, the form check-config
prints. The rules read the typed config the type checks hand them
(mcplhost/config/check.py), so they run in the same pass even when a value
elsewhere, or in the same table, has the wrong type: an empty value there
(a placeholder) never breaks a rule, and a rule that needs a value the type
checks refused is skipped, not the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .check import Checked, check
from .environment import api_key_variables
from .schema import AgentConfig, BackendConfig, Config, ConnectorConfig, ConsoleConfig, ModerationConfig
from .values import (
    NAME_PATTERN,
    WAKE_ON_KEYWORDS,
    UnknownGrant,
    base_url_problem,
    grant_pattern_problems,
    hears_problems,
    is_loopback,
    listen_address,
    store_url_problem,
    wake_from_problems,
    wake_on_problems,
)

#: Most ancestors an agent may have (its depth below its tree's root); docs/peers.md#trees.
MAX_TREE_DEPTH = 32


def problems(raw: Any, *, unknown_grant: UnknownGrant | None = None) -> list[str]:
    """Every problem in a decoded TOML document, as ``path: what is wrong``: its types, then the rules.

    Grant patterns are checked against the capability vocabulary only with `unknown_grant` (`UnknownGrant`).
    """
    checked = check(raw)
    return checked.problems + cross_field_problems(checked, unknown_grant)


def cross_field_problems(checked: Checked, unknown_grant: UnknownGrant | None = None) -> list[str]:
    """The rules across fields of a checked document (its type problems are `checked.problems`)."""
    config = checked.config
    found = _name_problems("connectors", [c.name for c in config.connectors])
    found += _name_problems("agents", [a.name for a in config.agents])
    api_keys = api_key_variables(config)
    for i, connector in enumerate(config.connectors):
        found += [f"connectors[{i}].grant[{j}]: {why}" for j, pattern in enumerate(connector.grant) if pattern
                  for why in grant_pattern_problems(pattern, unknown_grant)]
        found += [f"connectors[{i}].{why}" for why in withheld_name_problems(connector, api_keys)]
    connector_names = _set(_written(checked, "connectors", "name", [c.name for c in config.connectors]))
    agent_names = _set(_written(checked, "agents", "name", [a.name for a in config.agents]))
    for i, connector in enumerate(config.connectors):
        if connector.agent and connector.agent not in agent_names:
            known = ", ".join(sorted(agent_names)) or "none"
            found.append(f"connectors[{i}].agent: no agent is named {connector.agent!r} (configured: {known})")
    shared = config.store.url is not None  # other hosts may run connectors this file does not name
    for i, agent in enumerate(config.agents):
        usable = checked.usable_in(f"agents[{i}]")
        nameable = connector_names | named_connectors(agent) if shared else connector_names
        found += [f"agents[{i}].{why}" for why in agent_problems(agent, nameable, usable=usable)]
    found += _parent_problems(_written(checked, "agents", "name", [a.name for a in config.agents]),
                              _written(checked, "agents", "parent", [a.parent for a in config.agents]))
    if config.metrics.listen:
        try:
            listen_address(config.metrics.listen)
        except ValueError as exc:
            found.append(f"metrics.listen: {exc}")
    found += [f"console.{why}" for why in console_problems(config.console)]
    found += [f"store.{why}" for why in store_problems(checked)]
    if config.inference is not None:
        found += [f"inference.backend.{why}" for why in backend_problems(config.inference.backend)]
    if config.moderation is not None and checked.usable("moderation.kind"):
        found += [f"moderation.{why}" for why in moderation_problems(config.moderation)]
    return found


def _name_problems(kind: str, names: list[str]) -> list[str]:
    """Each name follows NAME_PATTERN and is used once per kind (a connector and an agent may share one)."""
    found: list[str] = []
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if not name:
            continue  # missing, or of the wrong type: the type checks' problem
        if not NAME_PATTERN.fullmatch(name):
            found.append(f"{kind}[{i}].name: {name!r} must match {NAME_PATTERN.pattern} "
                         "(a letter or digit, then up to 31 letters, digits, _ or -)")
        if name in seen:
            found.append(f"{kind}[{i}].name: {name!r} is already used by {kind}[{seen[name]}]")
        seen.setdefault(name, i)
    return found


def _set(values: Iterable[str | None]) -> set[str]:
    return {value for value in values if value is not None}


def _written(checked: Checked, kind: str, field: str, values: Sequence[str | None]) -> list[str | None]:
    """Each entry's `field` as written, None where a placeholder stands for it (missing, or of the wrong type)."""
    return [value if checked.usable(f"{kind}[{i}].{field}") else None for i, value in enumerate(values)]


def store_problems(checked: Checked) -> list[str]:
    """`[store]`'s cross-field problems: exactly one of `path` (SQLite) and `url` (PostgreSQL), and each engine's
    own keys only with it (README.md#configuration-reference)."""
    written = checked.written
    url = checked.config.store.url
    if not checked.usable("store.url"):
        return []  # a url of the wrong type: the type checks said so, and which engine is meant is unknown
    if url is None:
        return ["pool_size: only with url (PostgreSQL); an SQLite store has one writer connection"] \
            if written("store.pool_size") else []
    found = []
    if written("store.path"):
        found.append("url: set together with path; give one of them (path: an SQLite file, url: a PostgreSQL "
                     "server)")
    if (why := store_url_problem(url)) is not None:
        found.append(f"url: {why}")
    if written("store.synchronous"):
        found.append("synchronous: only with path (SQLite); with url, durability is the PostgreSQL server's "
                     "synchronous_commit")
    return found


def console_problems(console: ConsoleConfig) -> list[str]:
    """`[console]`'s cross-field problems: `listen` is HOST:PORT, and off loopback it needs `token_file`."""
    if not console.listen:
        return []
    try:
        host, _port = listen_address(console.listen)
    except ValueError as exc:
        return [f"listen: {exc}"]
    if not is_loopback(host) and console.token_file is None:
        return [f"token_file: required when listen ({console.listen}) is not a loopback address: every visitor "
                "signs in with its token (a file of mode 0600 holding one line, e.g. from `openssl rand -hex 32`)"]
    return []


def moderation_problems(moderation: ModerationConfig) -> list[str]:
    """`[moderation]`'s cross-field problems: kind "command" needs `command`, each kind refuses the other's keys."""
    if moderation.kind == "command":
        # The keys only kind "openai" reads: kind "command" refuses them rather than ignore them.
        openai_keys = {"model": moderation.model, "base_url": moderation.base_url,
                       "api_key_env": moderation.api_key_env}
        found = [] if moderation.command is not None else ['command: required for kind "command"']
        return found + [f'{key}: not used by kind "command" (only by kind "openai")'
                        for key, value in openai_keys.items() if value is not None]
    if moderation.command is not None:
        return ['command: not used by kind "openai" (it calls the moderations endpoint; set model, base_url, '
                'api_key_env)']
    return _base_url_problems(moderation.base_url)


def withheld_name_problems(connector: ConnectorConfig, api_keys: Mapping[str, str]) -> list[str]:
    """A connector's `env_pass` or `env` naming a variable that holds one of the host's api keys."""
    named = [(f"env_pass[{j}]", name) for j, name in enumerate(connector.env_pass)]
    named += [(f"env.{name}", name) for name in connector.env]
    return [f"{field}: {name} holds an api key of this host (named by {api_keys[name]}); "
            "connectors never get it: give the connector its own variable"
            for field, name in named if name in api_keys]


def named_connectors(agent: AgentConfig) -> set[str]:
    """The connector names an agent's hears, wake_on, wake_from and control_from entries give (keywords aside).

    On a shared PostgreSQL store an agent may hear a connector another host runs
    (docs/operations.md#several-hosts-on-one-store): there each name that is a valid
    connector name counts as one; on SQLite only the connectors of this file do.
    """
    entries = [*(agent.hears or []), *agent.wake_on, *(agent.wake_from or []), *agent.control_from]
    return {name for entry in entries if entry not in WAKE_ON_KEYWORDS
            for name in [entry.partition("/")[0]] if NAME_PATTERN.fullmatch(name)}


def agent_problems(agent: AgentConfig, connector_names: set[str], *,
                   usable: Callable[[str], bool] = lambda field: True) -> list[str]:
    """One agent table's cross-field problems, each as ``field: what is wrong`` (without the agent's path).

    `usable(field)`: whether the agent's `field` holds the document's value (`Checked.usable`).
    """
    found: list[str] = []
    for field, entries, check_entry in (("hears", agent.hears or [], hears_problems),
                                        ("wake_on", agent.wake_on, wake_on_problems),
                                        ("wake_from", agent.wake_from or [], wake_from_problems),
                                        ("control_from", agent.control_from, wake_from_problems)):
        found += [f"{field}[{j}]: {why}" for j, entry in enumerate(entries) if entry
                  for why in check_entry(entry, connector_names)]
    if agent.system_prompt is not None and agent.system_prompt_file is not None:
        found.append("system_prompt_file: set together with system_prompt; give one of them")
    if agent.max_wait_ms is not None and usable("debounce_ms") and agent.max_wait_ms < agent.debounce_ms:
        found.append(f"max_wait_ms: {agent.max_wait_ms} is less than debounce_ms ({agent.debounce_ms}); "
                     "a turn could never wait out its debounce")
    return found + [f"backend.{why}" for why in backend_problems(agent.backend)]


def backend_problems(backend: BackendConfig) -> list[str]:
    """A backend table's cross-field problems: a network backend names its model; its base_url can be used."""
    found = [f"model: required for kind {backend.kind!r}"] if backend.kind in ("openai", "anthropic") \
        and backend.model is None else []
    return found + _base_url_problems(backend.base_url)


def _base_url_problems(url: str | None) -> list[str]:
    why = base_url_problem(url) if url else None
    return [f"base_url: {why}"] if why else []


def _parent_problems(names: Sequence[str | None], parents: Sequence[str | None]) -> list[str]:
    """A parent names an agent of this file, following parents ends, and within MAX_TREE_DEPTH steps.

    Each agent's name and parent as written (`_written`): a chain is not followed from an agent whose name
    the type checks refused (the problem would have to name it), nor through a parent they refused.
    """
    found: list[str] = []
    parent_of = {name: parent for name, parent in zip(names, parents, strict=True) if name is not None}
    for i, (name, parent) in enumerate(zip(names, parents, strict=True)):
        if not parent:
            continue
        if parent not in parent_of:
            found.append(f"agents[{i}].parent: no agent is named {parent!r}")
            continue
        if name is None:
            continue
        chain: set[str] = {name}
        cursor: str | None = parent
        while cursor is not None:
            if cursor in chain:
                found.append(f"agents[{i}].parent: the parent chain of {name!r} loops")
                break
            chain.add(cursor)
            if len(chain) - 1 > MAX_TREE_DEPTH:
                found.append(f"agents[{i}].parent: {name!r} is more than {MAX_TREE_DEPTH} levels below its "
                             "tree's root")
                break
            cursor = parent_of.get(cursor)
    return found


def warnings(raw: Any) -> list[str]:
    """Allowed but surely not meant, in a decoded TOML document: as ``path: what``, like problems."""
    return config_warnings(check(raw).config)


def config_warnings(config: Config) -> list[str]:
    """Allowed but surely not meant: as ``path: what``, like problems."""
    found = [f"connectors[{i}].grant: empty: no item from this connector will ever be accepted"
             for i, connector in enumerate(config.connectors) if not connector.grant]
    parents = {agent.parent for agent in config.agents}
    for i, agent in enumerate(config.agents):
        # Peer messages wake an agent in a tree (docs/peers.md), whatever it hears.
        in_tree = agent.parent is not None or agent.name in parents
        found += [f"agents[{i}].{why}" for why in _agent_warnings(agent, in_tree=in_tree)]
    return found + _addressing_warnings(config)


def addressed_wakers(connector: str, agents: Iterable[tuple[str, Sequence[str] | None, Sequence[str]]]) -> list[str]:
    """The agents that hear `connector` and wake on `addressed`, from (name, hears, wake_on) of each.

    The one statement of who shares a connector's addressed items (docs/agents.md#addressing):
    mcplhost/agents/wakes/rules.py builds its `Addressing` with it, check-config its warning.
    """
    return [name for name, hears, wake_on in agents
            if (hears is None or any(h.partition("/")[0] == connector for h in hears)) and "addressed" in wake_on]


def _addressing_warnings(config: Config) -> list[str]:
    """A connector without `agent` whose addressed items several agents wake on: they are addressed by name."""
    agents = [(a.name, a.hears, a.wake_on) for a in config.agents]
    found = []
    for i, connector in enumerate(config.connectors):
        if connector.agent is not None:
            continue
        wakers = addressed_wakers(connector.name, agents)
        if len(wakers) > 1:
            found.append(f"connectors[{i}].agent: not set, and {', '.join(wakers)} all wake on addressed items of "
                         f"{connector.name!r}: an addressed item wakes only the agents it names (@NAME, or NAME: at "
                         "its start); set agent = \"NAME\" for the agent this connector's bot speaks for")
    return found


def _agent_warnings(agent: AgentConfig, *, in_tree: bool) -> list[str]:
    found: list[str] = []
    if agent.hears is not None:
        heard = {h.partition("/")[0] for h in agent.hears}
        found += [f"wake_on[{j}]: {entry!r} names a connector the agent does not hear: it never wakes it"
                  for j, entry in enumerate(agent.wake_on)
                  if entry not in WAKE_ON_KEYWORDS and entry.partition("/")[0] not in heard]
        if not agent.hears and not in_tree:
            found.append("hears: empty: the agent hears nothing and never wakes (it has no parent nor child "
                         "whose peer messages would wake it)")
    if agent.backend.script and agent.backend.kind != "scripted":
        found.append(f"backend.script: ignored by kind {agent.backend.kind!r} (scripted only)")
    return found
