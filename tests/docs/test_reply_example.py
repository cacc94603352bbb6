"""docs/examples/reply_connector.py under `mcplhost run` with an agent that replies (the scripted backend).

The example runs as a real subprocess (`-I -S`: nothing outside the
standard library could be imported), with the guide's own config, a real
SQLite file and a real daemon: its mention wakes the agent, the reply
reaches the connector as `channels/publish`, and the outbox row ends
delivered with the messageId the connector answered.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import tomllib
from pathlib import Path

from ..cli.support import cli, daemon, toml_table
from ..harness import REPO, count_rows, wait_for
from .test_guide import FENCED_TOML, GUIDE, old_grammar, standard_library_only

EXAMPLE = REPO / "docs" / "examples" / "reply_connector.py"
PUBLISHED = re.compile(r'^reply: published: (".*") to (\S+) in (\S+) as (\S+)$')


def guide_config() -> dict:
    """The guide's TOML block that runs the reply example."""
    (raw,) = [tomllib.loads(block) for block in FENCED_TOML.findall(GUIDE.read_text(encoding="utf-8"))
              if "reply_connector.py" in block]
    return raw


def written(config: dict, folder: Path) -> Path:
    """The guide's config with its store in `folder` and the example run isolated from site-packages."""
    text = toml_table("[store]", {"path": str(folder / "reply.db")})
    for connector in config["connectors"]:
        connector = {**connector, "command": [sys.executable, "-I", "-S", str(EXAMPLE)], "cwd": str(REPO)}
        text += "\n" + toml_table("[[connectors]]", connector)
    for agent in config["agents"]:
        fields = {k: v for k, v in agent.items() if k != "backend"}
        text += "\n" + toml_table("[[agents]]", fields) + toml_table("[agents.backend]", agent["backend"])
    path = folder / "reply.toml"
    path.write_text(text, encoding="utf-8")
    return path


def published(run) -> list[tuple[str, str, str, str]]:
    """What the example logged as posted: (text, channel, conversation, messageId)."""
    lines = [e.get("line", "") for e in run.events("connector.stderr", connector="reply")]
    return [(json.loads(m[1]), m[2], m[3], m[4]) for m in map(PUBLISHED.match, lines) if m]


class TestTheReplyExample:
    def test_it_is_standard_library_python_3_4(self) -> None:
        """Like the minimal connector: only the standard library, no syntax newer than Python 3.4."""
        source = EXAMPLE.read_text(encoding="utf-8")
        standard_library_only(source)
        old_grammar(source)

    def test_the_guide_s_config_passes_check_config(self, tmp_path) -> None:
        """The guide's TOML for it, as written (run from the repository's top folder), is valid."""
        (block,) = [b for b in FENCED_TOML.findall(GUIDE.read_text(encoding="utf-8")) if "reply_connector.py" in b]
        (tmp_path / "reply.toml").write_text(block, encoding="utf-8")
        result = cli("check-config", str(tmp_path / "reply.toml"), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("ok: 1 connector(s), 1 agent(s)")

    async def test_its_mention_is_answered_and_the_publish_ends_delivered(self, tmp_path) -> None:
        """The agent wakes on the mention, replies; the example gets the publish and the outbox row is delivered."""
        config = guide_config()
        db = tmp_path / "reply.db"

        def outbox() -> list[dict]:
            return [json.loads(line) for line in cli("outbox", "--db", str(db), "--json").stdout.splitlines()]

        async with daemon(written(config, tmp_path), tmp_path) as run:
            await wait_for(lambda: count_rows(db, "outbox", "state = 'delivered'"), timeout=30)  # no process per look
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0, run.stderr()[-2000:]
            ((text, channel, conversation, message_id),) = published(run)
        assert text == "Hello Alice, you asked: @helper what is the plan for today?"
        (row,) = outbox()
        assert (row["serverId"], row["channelId"], row["state"], row["messageId"]) == (
            "reply", channel, "delivered", message_id)
        assert channel == "reply:lobby" and conversation.startswith("conv_")
