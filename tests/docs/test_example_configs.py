"""The example configs in deploy/: each passes check-config once installed, and the chat one really replies.

"Installed" means this venv's mcplhost stands in for /opt/mcplhost/bin/mcplhost
and a temporary folder for /var/lib/mcplhost and /etc/mcplhost/env (with the
env files the config names, 0600), as deploy/install.sh makes them.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path

import pytest

from ..cli.support import cli, daemon
from ..harness import PYTHON, REPO, count_rows, wait_for

PUSH_ONLY = REPO / "deploy" / "mcplhost.example.toml"
CHAT = REPO / "deploy" / "mcplhost.chat.example.toml"
#: The chat example's pace, sped up for the test (its own is one message every 5 s).
FAST = ('STUB_INTERVAL_S = "5"', 'STUB_INTERVAL_S = "0.3"')


def installed(example: Path, folder: Path) -> Path:
    """The example as deploy/install.sh writes it, with this venv for /opt/mcplhost and `folder` for the state."""
    mcplhost = shutil.which("mcplhost", path=str(Path(PYTHON).parent))
    assert mcplhost, "the mcplhost script of this venv"
    text = example.read_text(encoding="utf-8")
    assert "/opt/mcplhost/bin/mcplhost" in text and "/var/lib/mcplhost/" in text
    text = text.replace("/opt/mcplhost/bin/mcplhost", mcplhost).replace("/var/lib/mcplhost/", f"{folder}/")
    envs = folder / "env"
    text = text.replace("/etc/mcplhost/env/", f"{envs}/")
    envs.mkdir(mode=0o700)
    for name in re.findall(r'^env_file = "[^"]*/env/([^"/]+)"', text, flags=re.M):
        (envs / name).touch(mode=0o600)  # install.sh creates each connector's env file, 0600
    path = folder / "mcplhost.toml"
    path.write_text(text, encoding="utf-8")
    return path


class TestExampleConfigs:
    @pytest.mark.parametrize(("example", "verdict"), [(PUSH_ONLY, "ok: 1 connector(s), 0 agent(s)"),
                                                      (CHAT, "ok: 1 connector(s), 1 agent(s)")])
    def test_each_example_passes_check_config(self, tmp_path, example: Path, verdict: str) -> None:
        """No problem and no warning: what an operator copies works as it is."""
        result = cli("check-config", str(installed(example, tmp_path)))
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert result.stdout.strip() == verdict

    def test_the_chat_example_has_a_bidirectional_connector_and_an_agent_that_replies(self, tmp_path) -> None:
        """Its connector may publish and its agent is not commented out (unlike the push-only example's)."""
        import tomllib

        raw = tomllib.loads(CHAT.read_text(encoding="utf-8"))
        (connector,) = raw["connectors"]
        (agent,) = raw["agents"]
        assert "channels.publish" in connector["grant"] and agent["hears"] == [connector["name"]]
        assert "agents" not in tomllib.loads(PUSH_ONLY.read_text(encoding="utf-8"))
        assert FAST[0] in CHAT.read_text(encoding="utf-8")

    async def test_the_chat_example_answers_a_mention_and_the_reply_is_delivered(self, tmp_path) -> None:
        """Run as installed (sped up): the stub's mention wakes scout, whose reply ends delivered in the outbox."""
        config = installed(CHAT, tmp_path)
        config.write_text(config.read_text(encoding="utf-8").replace(*FAST), encoding="utf-8")
        db = tmp_path / "mcplhost.db"

        def delivered() -> list[dict]:
            rows = [json.loads(line) for line in cli("outbox", "--db", str(db), "--json").stdout.splitlines()]
            return [row for row in rows if row["state"] == "delivered"]

        def echoes(outbox_id: int) -> list[str]:
            """The platform's copy of that publish, as stored (the stub sends it just after its answer)."""
            items = [json.loads(line) for line in cli("messages", "--db", str(db), "--json").stdout.splitlines()]
            return [i["content"][-1]["text"] for i in items if i["metadata"].get("echoOf") == outbox_id]

        async with daemon(config, tmp_path) as run:
            # Polled with sqlite3 (no process per look): a delivered row and the stored echo of it.
            await wait_for(lambda: count_rows(db, "outbox", "state = 'delivered'")
                           and count_rows(db, "items", "json_extract(metadata, '$.echoOf') IS NOT NULL"), timeout=40)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0, run.stderr()[-2000:]
        row = delivered()[0]
        assert (row["serverId"], row["channelId"], row["threadId"]) == ("chat", "stub:g1:random", "t-deploy"), row
        assert echoes(row["id"]) == ["You said: @scout are the deploy notes up?"]
