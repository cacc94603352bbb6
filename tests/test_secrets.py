"""Secrets (docs/agents.md#secrets): the set and its redaction, which values are secret, the log's redaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.config import load_config, secret_values, short_secret_warnings
from mcplhost.secrets import MIN_SECRET_CHARS, NO_SECRETS, Secrets, StreamGuard, redaction

from .cli.support import cli
from .harness import REPO
from .properties import examples

names = st.from_regex(r"[A-Z][A-Z_]{0,10}", fullmatch=True)
values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=MIN_SECRET_CHARS,
                 max_size=20)
secret_sets = st.dictionaries(names, values, min_size=1, max_size=4)
texts = st.text(max_size=200)


def mixed(secrets: dict[str, str], pieces: list[str], picks: list[int]) -> str:
    """Text with the secrets' values spliced between `pieces` (each pick chooses one value)."""
    chosen = list(secrets.values())
    return "".join(piece + chosen[pick % len(chosen)] for piece, pick in zip(pieces, picks))


def held_values(held: Secrets, secrets: dict[str, str]) -> list[str]:
    """The values `held` treats as secrets (long enough)."""
    return [value for name, value in secrets.items() if len(value) >= MIN_SECRET_CHARS]


class TestRedaction:
    @settings(max_examples=examples(60), deadline=None)
    @given(secrets=secret_sets, pieces=st.lists(texts, max_size=5), picks=st.lists(st.integers(0, 9), max_size=5))
    def test_redact_leaves_no_value_behind_and_find_agrees(self, secrets, pieces, picks) -> None:
        """Whatever surrounds and overlaps them, no value survives redaction; find is None exactly after redaction."""
        held = Secrets(secrets)
        text = mixed(secrets, pieces, picks)
        redacted = held.redact(text)
        assert held.find(redacted) is None
        for value in secrets.values():
            assert value not in redacted
        assert (held.find(text) is None) == (redacted == text)

    @settings(max_examples=examples(50), deadline=None)
    @given(secrets=secret_sets, pieces=st.lists(texts, max_size=5), picks=st.lists(st.integers(0, 9), max_size=5))
    def test_redact_is_idempotent(self, secrets, pieces, picks) -> None:
        held = Secrets(secrets)
        once = held.redact(mixed(secrets, pieces, picks))
        assert held.redact(once) == once

    @settings(max_examples=examples(50), deadline=None)
    @given(secrets=secret_sets, pieces=st.lists(texts, max_size=3), picks=st.lists(st.integers(0, 9), max_size=3))
    def test_json_text_and_bytes_are_redacted_too(self, secrets, pieces, picks) -> None:
        """A value as JSON writes it (escaped) and as UTF-8 bytes: how stored rows hold it."""
        held = Secrets(secrets)
        text = mixed(secrets, pieces, picks)
        for encoded in (json.dumps(text), json.dumps(text, ensure_ascii=False)):
            assert held.find(json.loads(held.redact(encoded))) is None
        raw = held.redact_bytes(text.encode())
        for value in secrets.values():
            assert value.encode() not in raw

    @settings(max_examples=examples(60), deadline=None)
    @given(base=values, extra=st.text(min_size=1, max_size=6), cut=st.integers(1, 7), pieces=st.lists(texts, max_size=4),
           picks=st.lists(st.integers(0, 9), max_size=4))
    def test_overlapping_values_leave_nothing_behind(self, base, extra, cut, pieces, picks) -> None:
        """Values that contain, prefix or overlap one another: still no value left, and find agrees."""
        secrets = {"A_KEY": base, "B_KEY": base + extra, "C_KEY": base[cut:] + extra + base[:cut]}
        held = Secrets(secrets)
        text = mixed(secrets, pieces, picks) + base[: len(base) // 2]
        redacted = held.redact(text)
        assert all(value not in redacted for value in held_values(held, secrets))
        assert held.find(redacted) is None and held.redact(redacted) == redacted

    def test_a_value_inside_another_is_redacted_whole_under_the_longer_name(self) -> None:
        held = Secrets({"SHORT_KEY": "abcdefgh", "LONG_TOKEN": "xxabcdefghyy"})
        assert held.redact("[xxabcdefghyy] abcdefgh") == "[[redacted:LONG_TOKEN]] [redacted:SHORT_KEY]"
        assert held.find("..xxabcdefghyy") == "LONG_TOKEN"

    def test_short_values_are_no_secrets_and_empty_costs_nothing(self) -> None:
        held = Secrets({"PIN": "1234567"})
        assert not held and held.names == frozenset() and held.redact("1234567") == "1234567"
        assert not NO_SECRETS and NO_SECRETS.find_json({"a": ["b"]}) is None

    def test_update_adds_and_keeps_what_was_held(self) -> None:
        """A reload adds the new values; a connector left running still holds the old one."""
        held = Secrets({"OLD_TOKEN": "old-value-1"})
        held.update({"NEW_TOKEN": "new-value-2"})
        assert held.redact("old-value-1 new-value-2") == f"{redaction('OLD_TOKEN')} {redaction('NEW_TOKEN')}"
        assert held.longest == len("old-value-1")

    def test_json_values_keys_and_lists(self) -> None:
        held = Secrets({"API_KEY": "sk-12345678"})
        value = {"sk-12345678": ["a", {"b": "x sk-12345678 y"}], "n": 3}
        assert held.find_json(value) == "API_KEY"
        assert held.redact_json(value) == {"[redacted:API_KEY]": ["a", {"b": "x [redacted:API_KEY] y"}], "n": 3}


class TestStreamGuard:
    @settings(max_examples=examples(30), deadline=None)
    @given(secrets=secret_sets, pieces=st.lists(texts, max_size=4), picks=st.lists(st.integers(0, 9), max_size=4),
           tail=texts, cuts=st.lists(st.integers(0, 400), max_size=12))
    def test_nothing_from_a_secret_on_is_released_and_a_clean_text_comes_out_whole(self, secrets, pieces, picks,
                                                                                   tail, cuts) -> None:
        """Cut anywhere: what is released is the text before its first secret (a prefix of it); without a
        secret, the released pieces and the finish rebuild the text exactly."""
        held = Secrets(secrets)
        text = mixed(secrets, pieces, picks) + tail
        guard = StreamGuard(held)
        bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
        released = "".join(guard.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])) + guard.finish()
        first = held._state.pattern.search(text) if held else None
        if first is None:
            assert released == text and guard.found is None
        else:
            assert text[:first.start()].startswith(released) and guard.found == held.find(text)

    def test_no_secret_passes_everything_at_once(self) -> None:
        guard = StreamGuard(NO_SECRETS)
        assert guard.feed("abc") == "abc" and guard.finish() == ""


def write_env(folder: Path, text: str) -> None:
    env = folder / "disc.env"
    env.write_text(text)
    env.chmod(0o600)  # an env file others may read is a problem of its own


def write_config(folder: Path, body: str) -> Path:
    path = folder / "mcplhost.toml"
    path.write_text(body)
    return path


CONFIG = """
[store]
path = "db.sqlite"

[[connectors]]
name = "disc"
command = ["python", "-c", "pass"]
grant = ["channels.*"]
env = { DISCORD_Token = "tok-in-env-123", GREETING = "not-secret-at-all", db_password = "short" }
env_pass = ["PASSED_SECRET", "PASSED_PLAIN"]
env_file = "disc.env"

[[agents]]
name = "bot"
[agents.backend]
kind = "openai"
model = "m"
api_key_env = "BOT_API_KEY"

[moderation]
kind = "openai"
api_key_env = "MOD_KEY_VAR"
"""


class TestWhichValuesAreSecret:
    def test_api_keys_and_connector_variables_whose_names_say_so(self, tmp_path) -> None:
        """Every api_key_env (agents, [moderation]); a connector's env, env_pass and env_file entries named
        TOKEN, KEY, SECRET or PASSWORD in any case; the rest are not."""
        write_env(tmp_path, "FILE_SECRET=from-the-file-1\nFILE_PLAIN=plain-value-1\n")
        config = load_config(write_config(tmp_path, CONFIG))
        environ = {"BOT_API_KEY": "sk-bot-key-1", "MOD_KEY_VAR": "mod-key-12", "PASSED_SECRET": "passed-1234",
                   "PASSED_PLAIN": "passed-plain-1"}
        assert secret_values(config, environ) == {
            "BOT_API_KEY": "sk-bot-key-1", "MOD_KEY_VAR": "mod-key-12", "DISCORD_Token": "tok-in-env-123",
            "db_password": "short", "PASSED_SECRET": "passed-1234", "FILE_SECRET": "from-the-file-1"}

    def test_a_short_value_is_warned_about_by_path_never_shown(self, tmp_path) -> None:
        write_env(tmp_path, "FILE_SECRET=from-the-file-1\n")
        config = load_config(write_config(tmp_path, CONFIG))
        warned = short_secret_warnings(config, {"BOT_API_KEY": "sk-bot-key-1", "MOD_KEY_VAR": "tiny"})
        assert warned == [
            f"moderation.api_key_env: the value of MOD_KEY_VAR is shorter than {MIN_SECRET_CHARS} characters: it is"
            " not treated as a secret (never withheld, never redacted)",
            f"connectors[0].env.db_password: the value of db_password is shorter than {MIN_SECRET_CHARS} characters:"
            " it is not treated as a secret (never withheld, never redacted)"]
        assert all("tiny" not in w and "short" not in w.split(":")[0] for w in warned)

    def test_check_config_prints_the_warning(self, tmp_path) -> None:
        write_env(tmp_path, "")
        path = write_config(tmp_path, CONFIG)
        done = cli("check-config", str(path), env={"BOT_API_KEY": "sk-bot-key-1"})  # in this process
        out = done.stdout + done.stderr
        assert "connectors[0].env.db_password: the value of db_password is shorter than" in out, out
        assert "=short" not in out and "'short'" not in out


#: A process that logs a secret in a value, a nested value, a repr and a traceback, in one format.
LOG_SCRIPT = """
import sys, structlog
from mcplhost import logs
from mcplhost.secrets import Secrets
logs.configure(sys.argv[1])
logs.redact_secrets(Secrets({"DISCORD_TOKEN": "tok-abcdef-123"}))
log = structlog.get_logger()
log.info("plain", detail="the token is tok-abcdef-123", nested={"k": ["tok-abcdef-123"]})
log.info("cut", detail="x" * 1995 + "tok-abcdef-123")
class Holder:
    def __repr__(self): return "Holder(tok-abcdef-123)"
log.info("repr", held=Holder())
try:
    raise ValueError("bad tok-abcdef-123")
except ValueError:
    log.error("crashed", exc_info=True)
logs.shutdown()
"""


class TestLogRedaction:
    def run(self, log_format: str) -> str:
        done = subprocess.run([sys.executable, "-c", LOG_SCRIPT, log_format], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        return done.stderr

    def test_json_lines_hold_the_name_never_the_value(self) -> None:
        out = self.run("json")
        assert "tok-abcdef" not in out
        lines = {line["event"]: line for line in map(json.loads, out.splitlines())}
        assert lines["plain"]["detail"] == "the token is [redacted:DISCORD_TOKEN]"
        assert lines["plain"]["nested"] == {"k": ["[redacted:DISCORD_TOKEN]"]}
        assert "[redacted:DISCORD_TOKEN]" in lines["repr"]["held"]
        assert "bad [redacted:DISCORD_TOKEN]" in lines["crashed"]["exception"]
        assert "tok-" not in lines["cut"]["detail"]  # redacted before the value is cut, not half left

    def test_console_lines_too(self) -> None:
        out = self.run("console")
        assert "tok-abcdef" not in out and out.count("[redacted:DISCORD_TOKEN]") >= 4


class TestKeptCurrent:
    async def test_a_connector_start_reads_its_env_file_again_and_the_host_keeps_the_old_value_too(
            self, tmp_path) -> None:
        """At each state change (a spawn among them) the host re-reads the connector's env file as the spawn
        does: an edited token is known from then on, and the one a running connector may still hold stays."""
        from mcplhost.host import learn_connector_secrets
        from mcplhost.store import open_store

        write_env(tmp_path, "CHAT_TOKEN=first-token-123\n")
        (spec,) = load_config(write_config(tmp_path, CONFIG)).connectors
        async with open_store(tmp_path / "s.db") as store:
            learn_connector_secrets(spec, store.secrets)
            write_env(tmp_path, "CHAT_TOKEN=second-token-456\n")
            assert store.secrets.find("second-token-456") is None
            learn_connector_secrets(spec, store.secrets)
            assert store.secrets.redact("first-token-123 second-token-456 tok-in-env-123") == (
                "[redacted:CHAT_TOKEN] [redacted:CHAT_TOKEN] [redacted:DISCORD_Token]")
