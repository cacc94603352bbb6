"""`mcplhost explain ITEM_ID` (in-process) over a database written through the store's operations: each decision, the shape."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio

from mcplhost.agents.turns.agent_rows import draft_row, speech_row
from mcplhost.store import NewItem, open_store
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.operations import (
    EndPublish,
    InsertItems,
    PublishSpeech,
    RecordTurn,
    RecordWakeDecisions,
    SetCursor,
)
from mcplhost.store.outbox import OutboxEntry
from mcplhost.store.writer import GroupWriter

from ..harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON, wait_for
from .support import cli, daemon, scripted_connector, write_config

KEYS = ["agent", "item", "decision", "reason", "turn", "publishes", "drafts", "tags", "wakeOn"]
AT = 1_790_000_000_000
CHANNEL = "discord:g1:111"

CONFIG = """
[store]
path = "unused.db"

[[connectors]]
name = "discord"
command = ["python", "-m", "mcplhost.connectors.stub"]

[[connectors]]
name = "slack"
command = ["python", "-m", "mcplhost.connectors.stub"]

[[agents]]
name = "scout"
hears = ["discord"]
wake_on = ["addressed"]
control_from = ["discord/boss"]

[[agents]]
name = "quiet"
hears = ["discord"]
wake_on = ["dm"]

[[agents]]
name = "slacker"
hears = ["slack"]
""".replace('"python"', json.dumps(PYTHON))


def channel_item(text: str, *, author: str = "u1", tags: tuple[str, ...] = ("chat:addressed",),
                 message_id: str | None = None) -> NewItem:
    metadata = {"serverId": "discord", "channelId": CHANNEL, "authorId": author, "tags": list(tags),
                "source": {"kind": "channel", "lane": "channel/message", "acceptedAt": AT}}
    if message_id is not None:
        metadata["messageId"] = message_id
    return NewItem("user", [{"type": "text", "text": text}], metadata, AT, participant=author)


async def seed(db: Path) -> dict[str, int]:
    """Items 1..6 and what came of them: a turn of scout with a delivered publish and a draft, recorded holds."""
    async with open_store(db) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        written = await writer.write(InsertItems([
            channel_item("hello @scout"),                       # 1: woke scout
            channel_item("again @scout", author="spammer"),     # 2: sender cap
            channel_item("  !STOP ", author="boss"),              # 3: scout's stop command
            channel_item("!stop", author="someone", tags=()),  # 4: ordinary, not addressed: wake_on
            channel_item("late @scout"),                         # 5: pending above the cursor
            channel_item("mine", message_id="m-echo"),           # 6: the echo of scout's delivered publish
        ]))
        ids = [w.id for w in written]
        turn = await writer.write(RecordTurn("scout", (ids[0],), AT, AT + 900, "completed", "gpt-4o-mini",
                                                 {"input_tokens": 900, "output_tokens": 7}))
        entry = OutboxEntry(agent="scout", turn_id=turn, server_id="discord", channel_id=CHANNEL, thread_id=None,
                            conversation_id="conv_x", text="hi", created_at=AT + 500)
        published = await writer.write(PublishSpeech(speech_row("scout", turn, "hi", created_at=AT + 500),
                                                          [entry]))
        await writer.submit(EndPublish(published.outbox_ids[0], "delivered", AT + 600, message_id="m-echo"))
        draft_ids = await writer.write(InsertItems([draft_row("scout", turn, "unsent", "moderation",
                                                                   created_at=AT + 700)]))
        await writer.submit(RecordWakeDecisions([WakeDecision(ids[1], "scout", "sender_cap", AT)]),
                            SetCursor("scout", ids[3], AT + 900))
        tg.cancel_scope.cancel()
    return {"turn": turn, "outbox": published.outbox_ids[0], "draft": draft_ids[0].id}


def explain(tmp_path: Path, *args: str) -> list[dict]:
    (tmp_path / "mcplhost.toml").write_text(CONFIG)
    result = cli("explain", "--db", str(tmp_path / "host.db"), "--config", str(tmp_path / "mcplhost.toml"),
                 "--json", *args)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


class TestExplainJson:
    async def test_a_woken_turn_shows_its_turn_publishes_and_drafts_in_the_documented_shape(self, tmp_path) -> None:
        made = await seed(tmp_path / "host.db")
        scout, quiet, slacker = explain(tmp_path, "1")
        assert all(list(answer) == KEYS for answer in (scout, quiet, slacker))
        assert scout == {"agent": "scout", "item": 1, "decision": "woke", "reason": None,
                         "turn": {"id": made["turn"], "outcome": "completed", "model": "gpt-4o-mini", "tokens": 907},
                         "publishes": [{"outboxId": made["outbox"], "destination": f"discord/{CHANNEL}",
                                        "state": "delivered"}],
                         "drafts": [{"id": made["draft"], "reason": "moderation"}], "tags": None, "wakeOn": None}
        # What the wake_on rule compared, side by side: the item's tags and the agent's wake_on.
        assert quiet == {"agent": "quiet", "item": 1, "decision": "not_waking", "reason": "wake_on", "turn": None,
                         "publishes": [], "drafts": [], "tags": ["chat:addressed"], "wakeOn": ["dm"]}
        assert slacker["decision"] == "not_heard" and slacker["reason"] == "hears" and slacker["turn"] is None

    async def test_each_decision_names_its_rule(self, tmp_path) -> None:
        await seed(tmp_path / "host.db")
        decided = {item: [(a["decision"], a["reason"]) for a in explain(tmp_path, str(item))][0]
                   for item in range(2, 7)}
        assert decided == {2: ("held", "sender_cap"), 3: ("not_waking", "stop_command"),
                           4: ("not_waking", "wake_on"), 5: ("held", "pending"), 6: ("not_waking", "echo")}

    async def test_agent_selects_one(self, tmp_path) -> None:
        await seed(tmp_path / "host.db")
        assert [a["agent"] for a in explain(tmp_path, "1", "--agent", "quiet")] == ["quiet"]


class TestExplainErrors:
    async def test_an_unknown_item_exits_1_with_one_line(self, tmp_path) -> None:
        await seed(tmp_path / "host.db")
        (tmp_path / "mcplhost.toml").write_text(CONFIG)
        result = cli("explain", "--db", str(tmp_path / "host.db"), "--config", str(tmp_path / "mcplhost.toml"), "999")
        assert result.returncode == 1 and result.stdout == "" and len(result.stderr.splitlines()) == 1
        assert "999" in result.stderr

    async def test_an_unknown_agent_exits_2_with_one_line(self, tmp_path) -> None:
        await seed(tmp_path / "host.db")
        (tmp_path / "mcplhost.toml").write_text(CONFIG)
        result = cli("explain", "--db", str(tmp_path / "host.db"), "--config", str(tmp_path / "mcplhost.toml"),
                     "--agent", "nobody", "1")
        assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1

    async def test_the_config_is_found_like_runs(self, tmp_path) -> None:
        """Without --config, ./mcplhost.toml of the working directory gives the agents."""
        await seed(tmp_path / "host.db")
        (tmp_path / "mcplhost.toml").write_text(CONFIG)
        result = cli("explain", "--db", str(tmp_path / "host.db"), "1", cwd=tmp_path, env={"MCPLHOST_CONFIG": ""})
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].startswith("scout: woke turn")


class TestExplainPlain:
    async def test_one_line_per_agent_and_indented_publishes_and_drafts(self, tmp_path) -> None:
        made = await seed(tmp_path / "host.db")
        (tmp_path / "mcplhost.toml").write_text(CONFIG)
        result = cli("explain", "--db", str(tmp_path / "host.db"), "--config", str(tmp_path / "mcplhost.toml"), "1")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [
            f"scout: woke turn {made['turn']} (completed, gpt-4o-mini, 907 tokens)",
            f"  publish {made['outbox']} → discord/{CHANNEL}: delivered",
            f"  draft {made['draft']}: moderation",
            "quiet: not waking (wake_on; item tags: chat:addressed; wake_on: dm)",
            "slacker: not heard (hears)",
        ]

    async def test_the_output_is_redacted_like_a_log_line(self, tmp_path) -> None:
        """A value the config makes secret is redacted in what explain prints, though the database was written
        before it was one (a token put in an env file later), as every operator surface does."""
        await seed(tmp_path / "host.db")
        secret = CONFIG.replace('name = "discord"\n', f'name = "discord"\nenv = {{ DISCORD_TOKEN = "{CHANNEL}" }}\n')
        (tmp_path / "mcplhost.toml").write_text(secret)
        result = cli("explain", "--db", str(tmp_path / "host.db"), "--config", str(tmp_path / "mcplhost.toml"), "1")
        assert result.returncode == 0, result.stderr
        assert "discord/[redacted:DISCORD_TOKEN]: delivered" in result.stdout and CHANNEL not in result.stdout


class TestExplainAfterRun:
    async def test_a_run_s_woken_turn_and_recorded_sender_cap_are_explained(self, tmp_path) -> None:
        """`mcplhost run` stores two messages from one sender with a cap of 1: the first woke, the second is held."""
        channel = {"id": "disc:g1:room", "type": "disc", "label": "#room", "direction": "bidirectional",
                   "address": {}}
        messages = [{"channelId": channel["id"], "messageId": f"m-{n}", "author": {"id": "u1", "name": "Alice"},
                     "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": f"message {n}"}]}
                    for n in (1, 2)]
        steps = [{"request": "channels/register", "params": {"channels": [channel]}},
                 {"request": "channels/incoming", "params": {"messages": messages}}]
        config = write_config(tmp_path, [scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps},
                                                            tmp_path, grant=CHAT_GRANT)])
        config.write_text(config.read_text() + '\n[[agents]]\nname = "scout"\nwake_on = ["all"]\ndebounce_ms = 0\n'
                          'max_wakes_per_sender_per_hour = 1\n[agents.backend]\nkind = "scripted"\nscript = ["ok"]\n')
        db = tmp_path / "host.db"
        async with daemon(config, tmp_path) as run:
            await run.wait_event("agent.turn")
            await wait_for(lambda: decisions(db) == [(2, "scout", "sender_cap")])
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        result = cli("explain", "--db", str(db), "--config", str(config), "--json", "1")
        assert result.returncode == 0, result.stderr
        (first,) = [json.loads(line) for line in result.stdout.splitlines()]
        assert first["decision"] == "woke" and first["turn"]["outcome"] == "completed"
        result = cli("explain", "--db", str(db), "--config", str(config), "2")
        assert result.stdout == "scout: held (sender_cap)\n", result.stderr


def decisions(db: Path) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        try:
            return conn.execute("SELECT item_id, agent, reason FROM wake_decisions").fetchall()
        except sqlite3.OperationalError:  # not migrated yet
            return []
