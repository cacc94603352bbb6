"""docs/agents.md and docs/grants.md say what the code does: every bound they name has the code's value.

docs/agents.md writes a bound as its constant and its value ("`MAX_PENDING_IDS`
(100)", "`HOOK_TIMEOUT_S` (5 s)"); each is read from the page and compared
with the constant of the module that owns it, so a changed bound that the
page does not follow fails here. docs/grants.md's table of what the host
offers is compared with `IMPLEMENTED` and `INFERENCE_PATHS` the same way.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from mcplhost.protocol.grants import IMPLEMENTED, INFERENCE_PATHS, offered_paths
from mcplhost.protocol.vocabulary import CAPABILITY_PATHS

from ..harness import REPO
from .test_links import anchors

AGENTS_PAGE = REPO / "docs" / "agents.md"
GRANTS_PAGE = REPO / "docs" / "grants.md"
#: The modules whose rules docs/agents.md states (its sections name them).
OWNERS = ["mcplhost.config.schema", "mcplhost.config.rules", "mcplhost.agents.wakes.rules", "mcplhost.agents.wakes.scheduler",
          "mcplhost.agents.runtime", "mcplhost.agents.startup", "mcplhost.agents.dispatch",
          "mcplhost.agents.agent_loop", "mcplhost.agents.turns.compiler", "mcplhost.agents.turns.history", "mcplhost.agents.turns.runner", "mcplhost.agents.turns.hooks",
          "mcplhost.agents.tools.toolbox", "mcplhost.agents.tools.listing", "mcplhost.agents.tools.host_tools",
          "mcplhost.agents.tools.outcome", "mcplhost.agents.inference", "mcplhost.speech.routing", "mcplhost.speech.outbox",
          "mcplhost.speech.retry", "mcplhost.speech.streaming", "mcplhost.speech.notices",
          "mcplhost.store.outbox", "mcplhost.store.readers", "mcplhost.speech.moderation",
          "mcplhost.agents.backends.moderator", "mcplhost.speech.typing", "mcplhost.agents.turns.acknowledge",
          "mcplhost.agents.wakes.catchup", "mcplhost.agents.backends.http", "mcplhost.agents.backends.common"]
#: "`NAME` (100)", "`NAME`, 16", "`NAME` (5 s)", "`NAME` (16 KiB)", "`NAME` (16 MiB)", "`NAME` (10 000)".
BOUND = re.compile(r"`([A-Z][A-Z0-9_]{2,})`(?:,\s+|\s+\()(\d[\d ]*)(?:\s?(s|KiB|MiB)\b)?")
UNITS = {"": 1, "s": 1, "KiB": 1024, "MiB": 1024 * 1024}
#: The sections code comments cite as docs/agents.md#<anchor>; renaming one breaks every citation of it.
STABLE_ANCHORS = {"wakes", "scheduling", "the-durable-cursor", "catch-up", "compilation", "turns",
                  "hooks-and-lifecycle", "backends", "tools", "routing", "pins", "drafts", "outbox", "echoes",
                  "streaming", "inference"}


def stated_bounds() -> list[tuple[str, float]]:
    text = AGENTS_PAGE.read_text(encoding="utf-8")
    return [(name, int(number.replace(" ", "")) * UNITS[unit]) for name, number, unit in BOUND.findall(text)]


def owner_value(name: str) -> object:
    """The constant's value in the one module that defines it (not one that imports it)."""
    found = []
    for module_name in OWNERS:
        module = importlib.import_module(module_name)
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        if name in vars(module) and re.search(rf"^{name}(?::[^=]+)? = ", source, re.M):
            found.append(vars(module)[name])
    assert len(found) == 1, f"{name}: defined in {len(found)} of the modules docs/agents.md describes"
    return found[0]


class TestAgentsPage:
    def test_the_page_names_bounds(self) -> None:
        assert len(stated_bounds()) >= 20

    @pytest.mark.parametrize(("name", "value"), stated_bounds(), ids=lambda v: str(v))
    def test_each_bound_has_the_code_s_value(self, name: str, value: float) -> None:
        assert owner_value(name) == value

    def test_the_cited_sections_are_there(self) -> None:
        assert STABLE_ANCHORS <= anchors(AGENTS_PAGE)

    def test_the_checker_reads_each_way_of_writing_a_bound(self) -> None:
        sample = "`A_B` (100), `C_D`, 16, `E_F` (5 s), `G_H` (16 KiB), `K_L` (2 MiB) and `I_J` (10 000)"
        assert [(n, int(v.replace(" ", "")) * UNITS[u]) for n, v, u in BOUND.findall(sample)] == [
            ("A_B", 100), ("C_D", 16), ("E_F", 5), ("G_H", 16384), ("K_L", 2097152), ("I_J", 10000)]


def offered_table() -> dict[str, set[str]]:
    """docs/grants.md's "What the host offers" table: first cell → the paths in backticks of the second."""
    section = GRANTS_PAGE.read_text(encoding="utf-8").split("\n## What the host offers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+) \|$", section, flags=re.M)
    return {first.split()[0]: set(re.findall(r"`([\w.]+)`", paths)) for first, paths in rows[1:]}


class TestGrantsPage:
    def test_the_offered_table_is_implemented(self) -> None:
        """"always" is what is offered without [inference], "only" the inference paths, "never" the rest."""
        table = offered_table()
        assert table["always"] == offered_paths()
        assert table["only"] == INFERENCE_PATHS
        assert table["never"] == CAPABILITY_PATHS - IMPLEMENTED
