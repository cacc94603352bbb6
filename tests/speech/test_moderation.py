"""Moderation's checkers (docs/agents.md#moderation): a real command, the local moderations endpoint, fail-closed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.agents.backends.moderator import OpenAIModerator, make_moderator
from mcplhost.config import ModerationConfig
from mcplhost.speech.moderation import (
    MAX_VERDICT_BYTES,
    CommandModerator,
    Verdict,
    check_publish,
    command_request,
    command_verdict,
    flagged_verdict,
)
from mcplhost.speech.routing import Destination

from ..agents.llm_server import LlmServer

ROOM = Destination(server_id="disc", channel_id="room")

#: Refuses a text holding "forbidden", allows the rest; echoes what it read to stderr and a file.
JUDGE = """\
import json, sys
request = json.load(sys.stdin)
open(sys.argv[1], "w").write(json.dumps(request))
print("judging", file=sys.stderr)
if "forbidden" in request["text"]:
    print(json.dumps({"allow": False, "reason": "says forbidden"}))
else:
    print(json.dumps({"allow": True, "reason": ""}))
"""


def command(tmp_path: Path, source: str, *args: str, timeout_s: float = 5.0) -> CommandModerator:
    script = tmp_path / "moderate.py"
    script.write_text(source, encoding="utf-8")
    return CommandModerator(ModerationConfig(kind="command", command=[sys.executable, str(script), *args],
                                             timeout_s=timeout_s))


class TestCommand:
    async def test_it_allows_and_refuses_by_content_and_reads_the_request_on_stdin(self, tmp_path: Path):
        """One JSON object on stdin (text, agent, destination as connector/channel); the verdict from stdout."""
        seen = tmp_path / "seen.json"
        judge = command(tmp_path, JUDGE, str(seen))
        with capture_logs() as logs:
            allowed = await judge.check("hello there", "scout", "disc/room")
            assert json.loads(seen.read_text()) == {"text": "hello there", "agent": "scout", "destination": "disc/room"}
            refused = await judge.check("this is forbidden", "scout", "disc/room")
        assert allowed == Verdict(allowed=True)
        assert refused == Verdict(allowed=False, reason="says forbidden")
        assert [e["stderr"] for e in logs if e["event"] == "moderation.stderr"] == ["judging\n"] * 2

    async def test_a_command_that_hangs_past_timeout_s_is_killed_with_its_group_and_refuses(self, tmp_path: Path):
        """The check ends at timeout_s; the command and the child it started are gone (the group is killed)."""
        pids = tmp_path / "pids"
        hang = command(tmp_path, f"""\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(60)
""", timeout_s=1.0)
        with anyio.fail_after(10):
            verdict = await hang.check("hi", "scout", "disc/room")
        assert not verdict.allowed and verdict.failed and "within 1 s" in verdict.reason
        for pid in map(int, pids.read_text().split()):
            with anyio.fail_after(5):
                while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
                    await anyio.sleep(0.02)

    @pytest.mark.parametrize(("source", "why"), [
        ("print('not json at all')", "printed no verdict"),
        ("print('{\"allow\": \"yes\"}')", "printed no verdict"),  # a wrong type
        ("print('{\"reason\": \"no allow\"}')", "printed no verdict"),
        ("import json; print(json.dumps({'allow': True})); raise SystemExit(3)", "exited with status 3"),
        ("import sys; sys.stdout.write('x' * (%d + 10))" % MAX_VERDICT_BYTES, "more than"),
    ])
    async def test_garbage_a_wrong_type_or_a_failing_exit_refuses(self, tmp_path: Path, source: str, why: str):
        verdict = await command(tmp_path, source).check("hi", "scout", "disc/room")
        assert not verdict.allowed and verdict.failed and why in verdict.reason

    async def test_a_command_that_cannot_start_refuses(self, tmp_path: Path):
        missing = CommandModerator(ModerationConfig(kind="command", command=[str(tmp_path / "absent")]))
        verdict = await missing.check("hi", "scout", "disc/room")
        assert not verdict.allowed and verdict.failed and "could not start" in verdict.reason

    async def test_the_host_api_keys_are_not_in_its_environment(self, tmp_path: Path):
        """Like a connector, the command never gets the variables holding the host's api keys."""
        seen = tmp_path / "env.json"
        source = (f"import json, os; open({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)));"
                  "print(json.dumps({'allow': True}))")
        script = tmp_path / "env.py"
        script.write_text(source, encoding="utf-8")
        moderator = make_moderator(ModerationConfig(kind="command", command=[sys.executable, str(script)]),
                                   withheld=frozenset({"HOST_KEY"}), environ={"HOST_KEY": "k" * 20, "PATH": "/bin"})
        assert (await moderator.check("hi", "scout", "disc/room")).allowed
        assert "HOST_KEY" not in json.loads(seen.read_text())


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


class TestVerdicts:
    @given(st.binary(max_size=200), st.integers(min_value=-20, max_value=300) | st.none())
    def test_any_output_gives_a_verdict_and_only_a_clean_allow_allows(self, stdout: bytes, code: int | None):
        """Never raises; allowed only for exit 0 with a JSON object whose `allow` is the boolean true."""
        verdict = command_verdict(stdout, code)
        try:
            answer = json.loads(stdout)
        except ValueError:
            answer = None
        clean = code == 0 and isinstance(answer, dict) and answer.get("allow") is True \
            and isinstance(answer.get("reason", ""), str)
        assert verdict.allowed == clean

    # st.text drops lone surrogates; a model's text may hold them (decoded from JSON escapes).
    @given(st.lists(st.characters() | st.just("\ud800")).map("".join), st.text(), st.text())
    def test_the_request_is_one_json_object_with_the_three_fields(self, text: str, agent: str, destination: str):
        """Any text, lone surrogates included, is one JSON object the command can decode as UTF-8."""
        request = command_request(text, agent, destination)
        assert json.loads(request.decode("utf-8")) == {"text": text, "agent": agent, "destination": destination}

    def test_flagged_names_the_flagged_categories(self):
        assert flagged_verdict(False, {"hate": False}) == Verdict(allowed=True)
        assert flagged_verdict(True, {"violence": True, "hate": False, "harassment": True}) == Verdict(
            allowed=False, reason="flagged: harassment, violence")

    async def test_a_refusal_is_logged_without_the_text(self, tmp_path: Path):
        judge = command(tmp_path, JUDGE, str(tmp_path / "seen.json"))
        with capture_logs() as logs:
            verdict = await check_publish(judge, "a forbidden secret plan", "scout", ROOM)
        (line,) = [e for e in logs if e["event"] == "moderation.refused"]
        assert not verdict.allowed and line["destination"] == "disc/room" and line["reason"] == "says forbidden"
        assert "secret plan" not in repr(logs)

    async def test_without_a_moderator_everything_is_allowed(self):
        assert (await check_publish(None, "anything", "scout", ROOM)).allowed


class TestOpenAI:
    def moderator(self, server: LlmServer, **fields: object) -> OpenAIModerator:
        config = ModerationConfig(kind="openai", base_url=server.openai_base_url, timeout_s=5.0, **fields)
        return OpenAIModerator(config, environ={})

    async def test_flagged_refuses_naming_the_categories_and_the_rest_is_allowed(self):
        with LlmServer() as server:
            server.flag_words = {"forbidden"}
            moderator = self.moderator(server, model="omni-moderation-latest")
            try:
                allowed = await moderator.check("hello", "scout", "disc/room")
                refused = await moderator.check("so forbidden", "scout", "disc/room")
            finally:
                await moderator.aclose()
            bodies = [r.body for r in server.requests if r.path == "/v1/moderations"]
        assert allowed == Verdict(allowed=True)
        assert refused == Verdict(allowed=False, reason="flagged: harassment")
        assert bodies == [{"model": "omni-moderation-latest", "input": "hello"},
                          {"model": "omni-moderation-latest", "input": "so forbidden"}]

    async def test_a_server_error_refuses(self):
        """Fail-closed: a 500 (after the SDK's one retry) is a failed check, not an allow."""
        with LlmServer() as server:
            server.moderation_status = 500
            moderator = self.moderator(server)
            try:
                verdict = await moderator.check("hello", "scout", "disc/room")
            finally:
                await moderator.aclose()
        assert not verdict.allowed and verdict.failed and "500" in verdict.reason

    async def test_an_unset_key_variable_refuses_every_check(self):
        moderator = OpenAIModerator(ModerationConfig(kind="openai", api_key_env="MODERATION_KEY"), environ={})
        verdict = await moderator.check("hello", "scout", "disc/room")
        assert not verdict.allowed and verdict.failed and "MODERATION_KEY is not set" in verdict.reason
