"""Moderation through `mcplhost run` (docs/agents.md#moderation): a command, relative to the config, refuses.

One daemon: the first mention's answer is allowed and published; the
second's holds "forbidden" and becomes a draft with reason `moderation`,
which never reaches the connector.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ..builders import incoming, message
from ..cli.support import daemon
from ..harness import wait_for
from ..speech.test_moderation import JUDGE
from .test_agents import agent_rows, finished_turns
from .test_speech import ASKED, REGISTER, ROOM, config_for, published_text, publishes


async def test_a_refused_answer_is_a_draft_and_an_allowed_one_is_published(tmp_path: Path) -> None:
    judge = tmp_path / "moderate.py"
    judge.write_text(f"#!{sys.executable}\n" + JUDGE, encoding="utf-8")
    judge.chmod(0o755)
    steps = [REGISTER, incoming(message(ROOM, "m-1", "scout, one", **ASKED)), {"wait": "channels/publish"},
             incoming(message(ROOM, "m-2", "scout, two", **ASKED))]
    config = config_for(tmp_path, steps, ["all fine", "this is forbidden"])
    with config.open("a", encoding="utf-8") as file:
        file.write(f'\n[moderation]\nkind = "command"\ncommand = ["./moderate.py", "{tmp_path / "seen.json"}"]\n'
                   "timeout_s = 10\n")
    db = tmp_path / "host.db"
    async with daemon(config, tmp_path) as run:
        await wait_for(lambda: finished_turns(db) >= 2, timeout=30)
        await wait_for(lambda: publishes(tmp_path), timeout=30)
        run.signal(signal.SIGTERM)
        assert await run.wait() == 0
    drafts = [r for r in agent_rows(db, "scout") if r["metadata"]["kind"] == "draft"]
    assert [d["metadata"]["reason"] for d in drafts] == ["moderation"]
    assert [published_text(p) for p in publishes(tmp_path)] == ["all fine"]
    assert "moderation.refused" in run.stderr() and "this is forbidden" not in run.stderr()
