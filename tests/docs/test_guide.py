"""docs/connectors.md and its example connector: the guide shows the file, and the file works.

The example runs as a real subprocess under a real Host with a real SQLite
file, started with `-I -S` so that nothing outside the standard library
(mcplhost included) could be imported by it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib

from mcplhost.config import ConnectorConfig, RestartConfig, problems
from mcplhost.protocol.grants import unknown_grant_problem

from ..builders import texts
from ..harness import REPO, config_with, items_when, running_host

GUIDE = REPO / "docs" / "connectors.md"
EXAMPLE = REPO / "docs" / "examples" / "minimal_connector.py"
REPLY_EXAMPLE = REPO / "docs" / "examples" / "reply_connector.py"
#: The issue's bound: a complete connector in under this many lines.
MAX_EXAMPLE_LINES = 60
#: How many chat messages the test asks the example for (MESSAGES in its environment).
MESSAGES = 4

FENCED_PYTHON = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
FENCED_TOML = re.compile(r"^```toml\n(.*?)^```$", re.S | re.M)


def example_spec(**env: str) -> ConnectorConfig:
    """The example as a connector named "minimal", isolated from site-packages."""
    return ConnectorConfig(name="minimal", command=[sys.executable, "-I", "-S", str(EXAMPLE)], env=env,
                           cwd=str(REPO), grant=["channels.register", "channels.incoming", "pushEvents"],
                           restart=RestartConfig(policy="never"), request_timeout_s=5.0)


def standard_library_only(source: str) -> None:
    """Every module `source` imports is a standard-library module."""
    tree = ast.parse(source)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def old_grammar(source: str) -> None:
    """No syntax newer than Python 3.4 (no f-strings, walrus or match), so any Python 3 runs it."""
    ast.parse(source, feature_version=(3, 4))
    assert 'f"' not in source and "f'" not in source


class TestTheGuideShowsTheExample:
    def test_the_guide_holds_the_example_files_verbatim(self) -> None:
        """The guide's python blocks that are whole programs are the two example connectors, byte for byte."""
        blocks = FENCED_PYTHON.findall(GUIDE.read_text(encoding="utf-8"))
        shown = [b for b in blocks if b.startswith("#!/usr/bin/env python3")]
        assert shown == [EXAMPLE.read_text(encoding="utf-8"), REPLY_EXAMPLE.read_text(encoding="utf-8")]

    def test_the_example_is_under_60_lines(self) -> None:
        """The minimal connector stays under the issue's 60-line bound."""
        assert len(EXAMPLE.read_text(encoding="utf-8").splitlines()) < MAX_EXAMPLE_LINES

    def test_the_example_imports_only_the_standard_library(self) -> None:
        """Every module the example imports is a standard-library module."""
        standard_library_only(EXAMPLE.read_text(encoding="utf-8"))

    def test_the_example_parses_with_an_old_python_3_grammar(self) -> None:
        """No syntax newer than Python 3.4 (no f-strings, walrus or match), so any Python 3 runs it."""
        old_grammar(EXAMPLE.read_text(encoding="utf-8"))


    def test_the_guide_s_config_is_valid_and_runs_the_example(self) -> None:
        """The guide's TOML passes the config checks and its command names the example file."""
        (block,) = [b for b in FENCED_TOML.findall(GUIDE.read_text(encoding="utf-8")) if "minimal_connector" in b]
        raw = tomllib.loads(block)
        assert problems(raw, unknown_grant=unknown_grant_problem) == []
        (connector,) = raw["connectors"]
        assert connector["command"][0] == "python3"
        assert (REPO / connector["command"][1]).resolve() == EXAMPLE


class TestTheExampleUnderTheHost:
    async def test_its_messages_and_push_are_stored_with_their_source_headers(self, tmp_path) -> None:
        """Every chat message is stored under its channel's header, and the push as unscoped."""
        async with running_host(config_with(tmp_path, example_spec(MESSAGES=str(MESSAGES)))):
            items = await items_when(tmp_path, MESSAGES + 1)
        assert [texts(i.content) for i in items] == [
            *(["[source: minimal / minimal:lobby · #lobby]", f"Hello number {n}"] for n in range(1, MESSAGES + 1)),
            ["[source: minimal · unscoped]", "Stand-up at ten."],
        ]
        assert all(i.participant == "Alice" for i in items[:MESSAGES])
        assert items[-1].metadata["source"]["lane"] == "push/event"

    async def test_a_restarted_example_sends_new_event_ids_and_nothing_is_lost(self, tmp_path) -> None:
        """Two lives of the example store two pushes: its eventIds never repeat across restarts."""
        for life in range(2):
            async with running_host(config_with(tmp_path, example_spec(MESSAGES="1"))):
                await items_when(tmp_path, 2 * (life + 1))
        items = await items_when(tmp_path, 4)
        pushes = [i for i in items if i.metadata["source"]["lane"] == "push/event"]
        assert len(pushes) == 2
        assert pushes[0].metadata["eventId"] != pushes[1].metadata["eventId"]
