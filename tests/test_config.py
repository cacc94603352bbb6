"""mcplhost/config/: strict TOML decoding, every problem with its path, paths relative to the file."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import (
    MAX_TREE_DEPTH,
    AgentConfig,
    BackendConfig,
    Config,
    ConnectorConfig,
    RestartConfig,
    ScriptReply,
    ScriptToolCall,
    StoreConfig,
    base_url_problem,
    default_config_path,
    effective_max_wait_ms,
    listen_address,
    load_config,
    problems,
    read_config,
    system_prompt_text,
    warnings,
)
from mcplhost.errors import ConfigError
from mcplhost.protocol.grants import unknown_grant_problem
from mcplhost.rpc.framing import MAX_LINE_BYTES
from mcplhost.rpc.limits import DEFAULT_TIMEOUT_S
from mcplhost.store.db import DEFAULT_SYNCHRONOUS

#: A configuration setting every key, as README.md#configuration-reference describes them.
FULL_EXAMPLE = """
[store]
path = "mcplhost.db"                 # SQLite file; created and migrated on start

[[connectors]]
name = "discord"                      # the host's id for this connection; appears in headers
command = ["python", "-m", "connectors.discordish"]
env = { GUILDS = "acme" }             # optional, added to the child's environment
cwd = "."                             # optional
grant = ["channels.register", "channels.incoming", "channels.publish", "pushEvents"]
request_timeout_s = 10                # optional
protocol = "auto"                     # optional: "auto" | "0.5" | "0.4" (see docs/mcpl-compat.md)
channels = ["discord:g1:*"]           # optional: globs of channel ids it may register (default: any)
feature_sets = { enabled = ["discord.messaging"], disabled = [] }   # optional selection for featureSets/update
accept_tag_implications = false       # optional: apply the connector's own tagOntology `implies` edges
[connectors.restart]                  # optional; these are the defaults
policy = "on-failure"                 # "always" | "on-failure" | "never"
backoff_initial_s = 0.5
backoff_max_s = 30
burst = 5                             # after this many failures ...
window_s = 60                         # ... within this window: the slow lane (one try every backoff_max_s)

[[connectors]]
name = "zulip"
command = ["python", "-m", "connectors.zulipish"]

[[agents]]                            # docs/agents.md is the rule for every key below
name = "scout"                        # [A-Za-z0-9][A-Za-z0-9_-]{0,31}, like connector names
parent = "lead"                       # optional: tree for peer messages
title = "Scout"                       # optional: shown to peers
hears = ["discord", "zulip/stream:*"] # optional: connectors or connector/channel-globs in its context (default: all)
wake_on = ["addressed", "dm"]         # "all" | "addressed" | "dm" | "push" | NAME | NAME/GLOB
wake_from = ["discord/1234*"]         # optional: connector/author-id globs allowed to wake it (default: anyone)
wake_from_bots = false                # items tagged chat:from-bot wake it only when true
max_wakes_per_sender_per_hour = 30
context_scope = "agent"               # "agent" (one context across its conversations) | "conversation"
tools = ["channel_*", "history_search", "weather__*"]   # optional: globs over tool names (default: all)
tool_timeout_s = 60
tool_result_max_chars = 20000
max_tokens_per_day = 0                # 0: no limit
publish_max_age_s = 3600
debounce_ms = 300
max_wait_ms = 3000                    # a steady stream cannot postpone a wake past this (default: max(3000, 4 × debounce_ms))
system_prompt = "You are Scout."      # or system_prompt_file = "scout.md" (relative to the config)
context_chars = 120000
max_tool_rounds = 8
max_turns_per_hour = 120
catch_up_max_age_s = 3600
[agents.backend]
kind = "openai"                       # "scripted" | "openai" | "anthropic"
model = "gpt-4o-mini"
base_url = "http://127.0.0.1:8000/v1" # optional: any OpenAI-compatible server
api_key_env = "OPENAI_API_KEY"        # optional: the variable holding the key (never the key itself)
max_tokens = 1024
timeout_s = 60
max_retries = 2
temperature = 0.7                     # optional
script = []                           # scripted only: replies in turn (docs/agents.md#backends)

[[agents]]
name = "lead"

[inference]                           # optional: serves connectors' inference/request and model/info
context_window = 128000
[inference.backend]                   # same keys as agents.backend
kind = "anthropic"
model = "claude-sonnet-4-5"
api_key_env = "ANTHROPIC_API_KEY"
"""


def write(folder: Path, text: str, name: str = "mcplhost.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(text: str) -> list[str]:
    """Every problem of a TOML text, the grant vocabulary included (as check-config and run check it)."""
    import tomllib

    return problems(tomllib.loads(text), unknown_grant=unknown_grant_problem)


class TestLoadConfig:
    def test_the_full_example_loads(self, tmp_path) -> None:
        """The full example decodes with every field where README.md#configuration-reference puts it."""
        # "python" need not be on PATH (Debian has none): the interpreter running the tests stands in.
        config = load_config(write(tmp_path, FULL_EXAMPLE.replace('"python"', json.dumps(sys.executable))))
        discord, _ = config.connectors
        assert discord.env == {"GUILDS": "acme"} and discord.channels == ["discord:g1:*"]
        assert discord.feature_sets.enabled == ["discord.messaging"] and discord.request_timeout_s == 10
        assert [a.name for a in config.agents] == ["scout", "lead"] and config.agents[0].parent == "lead"
        scout = config.agents[0]
        assert (scout.title, scout.hears, scout.wake_from) == ("Scout", ["discord", "zulip/stream:*"], ["discord/1234*"])
        assert scout.tools == ["channel_*", "history_search", "weather__*"] and scout.max_wait_ms == 3000
        assert scout.system_prompt == "You are Scout." and scout.catch_up_max_age_s == 3600
        assert (scout.backend.kind, scout.backend.model, scout.backend.temperature) == ("openai", "gpt-4o-mini", 0.7)
        assert scout.backend.base_url == "http://127.0.0.1:8000/v1" and scout.backend.api_key_env == "OPENAI_API_KEY"
        assert config.inference is not None and config.inference.context_window == 128000
        assert config.inference.backend.model == "claude-sonnet-4-5"

    def test_restart_defaults_are_the_documented_ones(self) -> None:
        """An absent [connectors.restart] means on-failure, 0.5 s, 30 s, burst 5 in 60 s."""
        assert RestartConfig() == RestartConfig(policy="on-failure", backoff_initial_s=0.5, backoff_max_s=30,
                                                burst=5, window_s=60)

    def test_relative_paths_are_relative_to_the_config_folder(self, tmp_path) -> None:
        """store.path and cwd resolve against the file's folder, not the working directory."""
        folder = tmp_path / "etc"
        for sub in ("data", "work"):
            (folder / sub).mkdir(parents=True)
        text = '[store]\npath = "data/x.db"\n[[connectors]]\nname = "a"\ncommand = ["sh"]\ncwd = "work"\n'
        config = load_config(write(folder, text))
        assert config.store.path == str(folder / "data" / "x.db")
        assert config.connectors[0].cwd == str(folder / "work")

    def test_absolute_paths_are_kept_and_cwd_defaults_to_the_config_folder(self, tmp_path) -> None:
        """An absolute store.path stays as written; a connector without cwd runs in the config's folder."""
        text = f'[store]\npath = "{tmp_path}/abs.db"\n[[connectors]]\nname = "a"\ncommand = ["sh"]\n'
        config = load_config(write(tmp_path / "", text))
        assert config.store.path == f"{tmp_path}/abs.db" and config.connectors[0].cwd == str(tmp_path)

    def test_a_relative_config_path_still_resolves_absolutely(self, tmp_path, monkeypatch) -> None:
        """Loading "sub/mcplhost.toml" from another folder yields absolute paths under sub/."""
        (tmp_path / "sub").mkdir()
        write(tmp_path / "sub", '[store]\npath = "x.db"\n')
        monkeypatch.chdir(tmp_path)
        assert load_config(Path("sub/mcplhost.toml")).store.path == str(tmp_path / "sub" / "x.db")

    def test_config_is_frozen(self, tmp_path) -> None:
        """A loaded config cannot be changed in place (it is shared between tasks)."""
        config = load_config(write(tmp_path, ""))
        with pytest.raises(AttributeError):
            config.store = config.store  # type: ignore[misc]

    def test_errors_list_every_problem_with_the_file_name(self, tmp_path) -> None:
        """ConfigError names the file and carries each problem, not just the first."""
        path = write(tmp_path, '[store]\npath = 1\n[oops]\n')
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert str(path) in caught.value.message and "2 problem(s)" in caught.value.message
        assert sorted(caught.value.problems) == ["oops: unknown key", "store.path: Expected `str`, got `int`"]

    @pytest.mark.parametrize(("text", "message"), [
        ("[store\n", "not valid TOML"),
        ("\udcff", "cannot read"),
    ])
    def test_unreadable_files_are_config_errors(self, tmp_path, text: str, message: str) -> None:
        """A syntax error or bytes that are not UTF-8 are ConfigErrors naming the file."""
        path = tmp_path / "mcplhost.toml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(ConfigError, match=re.escape(str(path)) + ".*" + message):
            load_config(path)

    def test_default_path_is_the_variable_then_the_working_folder(self, monkeypatch) -> None:
        """$MCPLHOST_CONFIG when set and not empty, else ./mcplhost.toml."""
        monkeypatch.setenv("MCPLHOST_CONFIG", "/etc/mcplhost/x.toml")
        assert default_config_path() == Path("/etc/mcplhost/x.toml")
        monkeypatch.setenv("MCPLHOST_CONFIG", "")
        assert default_config_path() == Path("mcplhost.toml")
        monkeypatch.delenv("MCPLHOST_CONFIG")
        assert default_config_path() == Path("mcplhost.toml")


class TestProblems:
    @pytest.mark.parametrize(("text", "expected"), [
        ("surprise = 1", "surprise: unknown key"),
        ("[store]\nflavour = 1", "store.flavour: unknown key"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\nretries = 1', "connectors[0].retries: unknown key"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\n[connectors.restart]\ntries = 1',
         "connectors[0].restart.tries: unknown key"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\nfeature_sets = { on = [] }',
         "connectors[0].feature_sets.on: unknown key"),
        ('[[agents]]\nname = "a"\nmood = "ok"', "agents[0].mood: unknown key"),
        ('[[agents]]\nname = "a"\n[agents.backend]\nflavour = "x"', "agents[0].backend.flavour: unknown key"),
    ])
    def test_unknown_keys_are_errors_at_every_level(self, text: str, expected: str) -> None:
        """A typo anywhere is reported with its path, never ignored."""
        assert problems_of(text) == [expected]

    @pytest.mark.parametrize(("text", "expected"), [
        ('[[connectors]]\nname = "a"\ncomand = ["a"]',
         ["connectors[0].comand: unknown key (did you mean 'command'?)", "connectors[0].command: required"]),
        ('[store]\npaht = "x.db"', ["store.paht: unknown key (did you mean 'path'?)"]),
        ('[[agents]]\nname = "a"\nwake_onn = []', ["agents[0].wake_onn: unknown key (did you mean 'wake_on'?)"]),
        ('[[agents]]\nname = "a"\n[agents.backend]\nkind = "openia"',
         ["agents[0].backend.kind: 'openia' is not one of 'scripted', 'openai', 'anthropic' (did you mean "
          "'openai'?)"]),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\n[connectors.restart]\npolicy = "sometimes"',
         ["connectors[0].restart.policy: 'sometimes' is not one of 'always', 'on-failure', 'never'"]),
        ('[console]\nactions = ["restart-connectr"]',
         ["console.actions[0]: 'restart-connectr' is not one of 'restart-connector' (did you mean "
          "'restart-connector'?)"]),
    ])
    def test_a_misspelt_key_or_choice_names_what_was_meant(self, text: str, expected: list[str]) -> None:
        """An unknown key gets the closest known key of its table; a value outside a fixed set of choices lists
        them all, and the closest when one is close."""
        assert problems_of(text) == expected

    def test_a_choice_of_the_wrong_type_is_a_type_problem(self) -> None:
        """Only a string is compared with the choices: `kind = 1` says what type was expected."""
        (found,) = problems_of('[[agents]]\nname = "a"\n[agents.backend]\nkind = 1')
        assert found.startswith("agents[0].backend.kind: Expected `str`"), found

    @pytest.mark.parametrize(("text", "field"), [
        ('[[connectors]]\ncommand = ["a"]', "connectors[0].name: required"),
        ('[[connectors]]\nname = "a"', "connectors[0].command: required"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\nrequest_timeout_s = 0', "connectors[0].request_timeout_s"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\nstop_grace_s = -1', "connectors[0].stop_grace_s"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\nprotocol = "0.6"', "connectors[0].protocol"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\nenv = { A = 1 }', "connectors[0].env.A"),
        ('[[connectors]]\nname = "a"\ncommand = ["a", ""]', "connectors[0].command[1]"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\n[connectors.restart]\nbackoff_max_s = 0',
         "connectors[0].restart.backoff_max_s"),
        ('[[connectors]]\nname = "a"\ncommand = ["a"]\n[connectors.restart]\nwindow_s = -5',
         "connectors[0].restart.window_s"),
        ('[[agents]]\nname = "a"\ndebounce_ms = -1', "agents[0].debounce_ms"),
        ('[[agents]]\nname = "a"\n[agents.backend]\nkind = "oracle"', "agents[0].backend.kind"),
        ('connectors = "all"', "connectors"),
        ("connectors = [1]", "connectors[0]"),
    ])
    def test_each_bad_value_is_reported_at_its_path(self, text: str, field: str) -> None:
        """Types, enums and limits are checked, and the problem starts with the field's path."""
        (problem,) = problems_of(text)
        assert problem.startswith(field + ":") or problem == field, problem

    def test_a_bad_env_value_is_named_by_its_key(self) -> None:
        """Each env value that is not a string is reported under its own key, quoted when TOML would quote it."""
        text = '[[connectors]]\nname = "a"\ncommand = ["a"]\nenv = { A = 1, "MY KEY" = true, B = "ok" }'
        assert problems_of(text) == ["connectors[0].env.A: Expected `str`, got `int`",
                                     'connectors[0].env."MY KEY": Expected `str`, got `bool`']

    def test_names_must_be_unique_per_kind(self) -> None:
        """Two connectors (or agents) with one name is an error on the second; a connector and an agent may share."""
        text = ('[[connectors]]\nname = "a"\ncommand = ["x"]\n[[connectors]]\nname = "a"\ncommand = ["y"]\n'
                '[[agents]]\nname = "a"\n[[agents]]\nname = "a"\n')
        assert problems_of(text) == ["connectors[1].name: 'a' is already used by connectors[0]",
                                     "agents[1].name: 'a' is already used by agents[0]"]

    def test_a_grant_pattern_with_an_empty_segment(self) -> None:
        """"channels..register" cannot match any capability path."""
        text = '[[connectors]]\nname = "a"\ncommand = ["x"]\ngrant = ["pushEvents", "channels..register"]'
        assert problems_of(text) == ["connectors[0].grant[1]: 'channels..register' has an empty segment"]

    @pytest.mark.parametrize(("agents", "expected"), [
        ([("a", "ghost")], ["agents[0].parent: no agent is named 'ghost'"]),
        ([("a", "a")], ["agents[0].parent: the parent chain of 'a' loops"]),
        ([("a", "b"), ("b", "a")], ["agents[0].parent: the parent chain of 'a' loops",
                                    "agents[1].parent: the parent chain of 'b' loops"]),
        ([("a", None), ("b", "a"), ("c", "b")], []),
        # The deepest allowed tree: 32 ancestors; one more level is refused (config.py MAX_TREE_DEPTH).
        ([("a0", None)] + [(f"a{i}", f"a{i - 1}") for i in range(1, MAX_TREE_DEPTH + 1)], []),
        ([("a0", None)] + [(f"a{i}", f"a{i - 1}") for i in range(1, MAX_TREE_DEPTH + 2)],
         [f"agents[{MAX_TREE_DEPTH + 1}].parent: 'a{MAX_TREE_DEPTH + 1}' is more than {MAX_TREE_DEPTH} levels"
          " below its tree's root"]),
    ])
    def test_agent_parents_must_exist_and_not_loop(self, agents: list[tuple[str, str | None]],
                                                   expected: list[str]) -> None:
        """A parent names an agent of this file, and following parents ends."""
        text = "".join(f'[[agents]]\nname = "{n}"\n' + (f'parent = "{p}"\n' if p else "") for n, p in agents)
        assert problems_of(text) == expected

    def test_a_problem_free_document_converts(self) -> None:
        """When problems() finds nothing, msgspec's own conversion succeeds too."""
        import tomllib

        raw = tomllib.loads(FULL_EXAMPLE)
        assert problems(raw) == []
        assert isinstance(msgspec.convert(raw, Config), Config)


def one_connector(**fields: str) -> str:
    """A [[connectors]] table with a name and a command, plus `fields` as TOML values written verbatim."""
    return '[[connectors]]\nname = "a"\ncommand = ["sh"]\n' + "".join(f"{k} = {v}\n" for k, v in fields.items())


class TestPatternsAndWakes:
    @pytest.mark.parametrize("pattern", ["tools.**", "channels.pub*", "chan-nels", "*.*x", "1tools"])
    def test_a_grant_segment_must_be_a_star_or_a_name(self, pattern: str) -> None:
        """A segment that is neither `*` nor a capability name can never match, so it is an error."""
        (problem,) = problems_of(one_connector(grant=json.dumps([pattern])))
        assert problem.startswith("connectors[0].grant[0]: ") and "neither * nor a capability name" in problem

    @pytest.mark.parametrize("pattern", ["*", "channels.*", "contextHooks.beforeInference.inject.system", "tools"])
    def test_stars_and_names_are_good_grant_patterns(self, pattern: str) -> None:
        """Whole-segment `*` and names pass."""
        assert problems_of(one_connector(grant=json.dumps([pattern]))) == []

    @pytest.mark.parametrize(("pattern", "says"), [
        ("channels.incomming", "'incomming' is no capability under 'channels' (did you mean 'incoming'?)"),
        ("pushEvent", "'pushEvent' is no capability at the top level (did you mean 'pushEvents'?)"),
        ("channels", "is a branch, not a capability"),
        ("*.*.*.*.*", "no capability lies beneath '*.*.*.*'"),
        ("pushEvents.x", "no capability lies beneath 'pushEvents'; grant 'pushEvents' itself"),
    ])
    def test_a_pattern_that_names_no_capability_is_a_problem(self, pattern: str, says: str) -> None:
        """A well-formed pattern matching no path of the vocabulary would grant nothing: a problem, not silence."""
        (problem,) = problems_of(one_connector(grant=json.dumps([pattern])))
        assert problem.startswith("connectors[0].grant[0]: ") and says in problem, problem

    def test_the_vocabulary_check_is_the_callers_and_answers_in_place(self, tmp_path) -> None:
        """config knows no capability names: the loader's check is asked about well-formed patterns only.

        Its answer is listed where the pattern is, through load_config too;
        without a check only the form is judged.
        """
        text = one_connector(grant=json.dumps(["pushEvents", "channels..register", "channels.incomming"]))
        asked: list[str] = []

        def check(pattern: str) -> str | None:
            asked.append(pattern)
            return "unknown here" if pattern == "channels.incomming" else None

        assert problems(tomllib.loads(text), unknown_grant=check) == [
            "connectors[0].grant[1]: 'channels..register' has an empty segment",
            "connectors[0].grant[2]: unknown here"]
        assert asked == ["pushEvents", "channels.incomming"]
        assert problems(tomllib.loads(text)) == ["connectors[0].grant[1]: 'channels..register' has an empty segment"]
        with pytest.raises(ConfigError) as raised:
            load_config(write(tmp_path, text), unknown_grant=unknown_grant_problem)
        assert [p.partition(":")[0] for p in raised.value.problems] == ["connectors[0].grant[1]",
                                                                          "connectors[0].grant[2]"]

    @pytest.mark.parametrize("entry", ["all", "addressed", "dm", "push", "a", "a/stub:g1:*"])
    def test_wake_on_entries_from_agents_md_pass(self, entry: str) -> None:
        """The keywords, a configured connector's name, and NAME/GLOB are the wake_on vocabulary."""
        text = one_connector() + f'[[agents]]\nname = "scout"\nwake_on = [{json.dumps(entry)}]\n'
        assert problems_of(text) == []

    @pytest.mark.parametrize(("entry", "says"), [
        ("mentions", "is not one of all, addressed, dm, push"),
        ("ghost/x:*", "no connector is named 'ghost'"),
        ("a/", "the channel glob after 'a/' is empty"),
    ])
    def test_other_wake_on_entries_are_errors(self, entry: str, says: str) -> None:
        """An entry that is no keyword and names no configured connector is reported at its index."""
        text = one_connector() + f'[[agents]]\nname = "scout"\nwake_on = ["dm", {json.dumps(entry)}]\n'
        (problem,) = problems_of(text)
        assert problem.startswith("agents[0].wake_on[1]: ") and says in problem, problem

    @pytest.mark.parametrize("grant", [None, "[]"])
    def test_a_missing_or_empty_grant_is_a_warning_not_a_problem(self, grant: str | None) -> None:
        """No grant is valid, but no item from that connector will ever be accepted: a warning says so."""
        import tomllib

        raw = tomllib.loads(one_connector(**({"grant": grant} if grant else {})))
        assert problems(raw) == []
        assert warnings(raw) == ["connectors[0].grant: empty: no item from this connector will ever be accepted"]


class TestWhatTheConfigNames:
    def test_a_command_not_on_path_and_a_missing_cwd_are_problems(self, tmp_path) -> None:
        """check-config and run refuse a command that would not start and a cwd that is not there."""
        text = ('[[connectors]]\nname = "a"\ncommand = ["no-such-program-h4"]\n'
                '[[connectors]]\nname = "b"\ncommand = ["./missing.sh"]\n'
                '[[connectors]]\nname = "c"\ncommand = ["sh"]\ncwd = "nowhere"\n'
                '[[connectors]]\nname = "d"\ncommand = ["sh"]\nenv = { PATH = "/nonexistent" }\n')
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, text))
        found = caught.value.problems
        assert [p.partition(":")[0] for p in found] == ["connectors[0].command", "connectors[1].command",
                                                        "connectors[2].cwd", "connectors[3].command"]
        assert "'no-such-program-h4' is not found on PATH" in found[0]
        assert "'./missing.sh' does not exist" in found[1] and f"{tmp_path}/nowhere does not exist" in found[2]

    def test_an_executable_path_relative_to_cwd_is_found(self, tmp_path) -> None:
        """A command with a slash is looked up relative to the connector's cwd, as the child would run it."""
        (tmp_path / "bin").mkdir()
        script = tmp_path / "bin" / "conn.sh"
        script.write_text("#!/bin/sh\n", encoding="utf-8")
        script.chmod(0o755)
        config, found = read_config(write(tmp_path, '[[connectors]]\nname = "a"\ncommand = ["./conn.sh"]\n'
                                                     'cwd = "bin"\ngrant = ["pushEvents"]\n'))
        assert config.connectors[0].cwd == str(tmp_path / "bin") and found == []

    def test_a_store_path_whose_folder_is_missing_is_refused(self, tmp_path) -> None:
        """The database's folder is never created silently: a missing one is a problem naming it."""
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, '[store]\npath = "state/x.db"\n'))
        (problem,) = caught.value.problems
        assert problem.startswith(f"store.path: the folder {tmp_path / 'state'} does not exist")

    def test_a_store_path_that_is_a_directory_is_refused(self, tmp_path) -> None:
        """store.path naming a folder says so, rather than failing later as "cannot open"."""
        (tmp_path / "db").mkdir()
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, '[store]\npath = "db"\n'))
        assert caught.value.problems == [f"store.path: {tmp_path / 'db'} is a directory, not a database file"]


class TestDefaultsComeFromTheirOwners:
    def test_defaults_restating_other_modules_constants_are_those_constants(self) -> None:
        """max_line_bytes, request_timeout_s and synchronous default to the framing, rpc and store constants."""
        connector = ConnectorConfig(name="a", command=["sh"])
        assert connector.max_line_bytes == MAX_LINE_BYTES and connector.request_timeout_s == DEFAULT_TIMEOUT_S
        assert StoreConfig().synchronous == DEFAULT_SYNCHRONOUS


def agent(**fields: str) -> str:
    """An [[agents]] table named scout, plus `fields` as TOML values written verbatim."""
    return '[[agents]]\nname = "scout"\n' + "".join(f"{k} = {v}\n" for k, v in fields.items())


class TestAgentConfig:
    def test_defaults_are_agents_md_s(self) -> None:
        """An agent with only a name gets the defaults docs/agents.md and README.md#configuration-reference give."""
        scout = AgentConfig(name="scout")
        assert (scout.hears, scout.wake_on, scout.wake_from, scout.wake_from_bots) == (None, ["addressed", "dm"],
                                                                                    None, False)
        assert (scout.max_wakes_per_sender_per_hour, scout.context_scope, scout.tools) == (30, "agent", None)
        assert (scout.tool_timeout_s, scout.tool_result_max_chars, scout.max_tokens_per_day) == (60, 20_000, 0)
        assert (scout.debounce_ms, scout.max_wait_ms, scout.context_chars) == (300, None, 120_000)
        assert (scout.max_tool_rounds, scout.max_turns_per_hour, scout.catch_up_max_age_s) == (8, 120, 3600)
        assert scout.publish_max_age_s == 3600
        backend = scout.backend
        assert (backend.kind, backend.max_tokens, backend.timeout_s, backend.max_retries) == ("scripted", 1024, 60, 2)
        assert (backend.temperature, backend.script) == (None, [])

    @pytest.mark.parametrize(("debounce_ms", "max_wait_ms", "effective"), [
        (300, None, 3000), (0, None, 3000), (750, None, 3000), (1000, None, 4000), (300, 500, 500), (300, 300, 300),
    ])
    def test_max_wait_defaults_to_the_larger_of_3000_and_four_debounces(self, debounce_ms: int,
                                                                         max_wait_ms: int | None,
                                                                         effective: int) -> None:
        """max_wait_ms when set, else max(3000, 4 × debounce_ms)."""
        scout = AgentConfig(name="scout", debounce_ms=debounce_ms, max_wait_ms=max_wait_ms)
        assert effective_max_wait_ms(scout) == effective

    def test_script_replies_are_strings_or_tables(self, tmp_path) -> None:
        """A script mixes plain replies and {text, tool_calls} tables, each kept in order."""
        text = agent() + ('[agents.backend]\nscript = ["hello", "{{echo}}", '
                          '{ text = "looking", tool_calls = [{ name = "history_search", arguments = { query = "x" } }] }]\n')
        script = load_config(write(tmp_path, text)).agents[0].backend.script
        assert script[:2] == ["hello", "{{echo}}"]
        assert script[2] == ScriptReply(text="looking",
                                        tool_calls=[ScriptToolCall(name="history_search", arguments={"query": "x"})])

    def test_the_prompt_file_is_relative_to_the_config_and_read_when_asked(self, tmp_path) -> None:
        """system_prompt_file resolves against the config's folder; system_prompt_text reads its current text."""
        (tmp_path / "prompts").mkdir()
        (tmp_path / "prompts" / "scout.md").write_text("You are Scout.\n", encoding="utf-8")
        scout = load_config(write(tmp_path, agent(system_prompt_file='"prompts/scout.md"'))).agents[0]
        assert scout.system_prompt_file == str(tmp_path / "prompts" / "scout.md")
        assert system_prompt_text(scout) == "You are Scout.\n"
        (tmp_path / "prompts" / "scout.md").write_text("You are Scout, edited.", encoding="utf-8")
        assert system_prompt_text(scout) == "You are Scout, edited."

    def test_the_prompt_text_is_the_prompt_or_empty(self) -> None:
        """Without a file the prompt is system_prompt, and no prompt at all is the empty string."""
        assert system_prompt_text(AgentConfig(name="a", system_prompt="Be brief.")) == "Be brief."
        assert system_prompt_text(AgentConfig(name="a")) == ""


class TestAgentProblems:
    @pytest.mark.parametrize(("name", "good"), [
        ("scout", True), ("Scout_2", True), ("0", True), ("a-b", True), ("x" * 32, True),
        ("x" * 33, False), ("-a", False), ("_a", False), ("a b", False), ("a.b", False), ("a/b", False),
        ("é", False), ("a\n", False),
    ])
    def test_agent_and_connector_names_follow_the_pattern(self, name: str, good: bool) -> None:
        """Names match [A-Za-z0-9][A-Za-z0-9_-]{0,31}, for agents and connectors alike."""
        text = f'[[connectors]]\nname = {json.dumps(name)}\ncommand = ["sh"]\n[[agents]]\nname = {json.dumps(name)}\n'
        found = problems_of(text)
        assert [p.partition(":")[0] for p in found] == ([] if good else ["connectors[0].name", "agents[0].name"])

    @given(st.text(max_size=40))
    def test_a_name_is_accepted_exactly_when_it_matches(self, name: str) -> None:
        """The name check agrees with the documented pattern for any text."""
        if name == "":
            return  # an empty name is the type check's problem
        found = problems({"agents": [{"name": name}]})
        assert (found == []) == bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", name))

    @pytest.mark.parametrize(("hears", "expected"), [
        ('["a"]', []), ('["a/stub:g1:*"]', []), ('["a", "a/x"]', []), ("[]", []),
        ('["ghost"]', ["agents[0].hears[0]: 'ghost': no connector is named 'ghost'"]),
        ('["a", "ghost/x:*"]', ["agents[0].hears[1]: 'ghost/x:*': no connector is named 'ghost'"]),
        ('["a/"]', ["agents[0].hears[0]: 'a/': the channel glob after 'a/' is empty"]),
    ])
    def test_hears_names_configured_connectors(self, hears: str, expected: list[str]) -> None:
        """Each hears entry is a configured connector, or one with a channel glob after the slash."""
        assert problems_of(one_connector() + agent(hears=hears)) == expected

    def test_on_a_shared_store_an_agent_may_name_a_connector_another_host_runs(self) -> None:
        """With `[store] url` the connector may be in another host's file (docs/operations.md); a name no connector
        could have is still refused, and on SQLite an unconfigured one is, as before."""
        fields = {"hears": '["a", "ghost/x:*"]', "wake_on": '["addressed", "ghost"]', "wake_from": '["ghost/1*"]'}
        shared = '[store]\nurl = "postgresql://mcplhost@db.example/mcplhost"\n'
        assert problems_of(shared + one_connector() + agent(**fields)) == []
        assert problems_of(shared + one_connector() + agent(hears='["gh ost"]')) == [
            "agents[0].hears[0]: 'gh ost': no connector is named 'gh ost'"]
        assert problems_of(one_connector() + agent(**fields)) == [
            "agents[0].hears[1]: 'ghost/x:*': no connector is named 'ghost'",
            "agents[0].wake_on[1]: 'ghost' is not one of all, addressed, dm, push, nor a configured connector's name"
            " (or NAME/GLOB)",
            "agents[0].wake_from[0]: 'ghost/1*': no connector is named 'ghost'"]

    @pytest.mark.parametrize(("wake_from", "says"), [
        ('["a"]', "needs the form connector/author-id-glob"),
        ('["a/"]', "needs the form connector/author-id-glob"),
        ('["ghost/1*"]', "no connector is named 'ghost'"),
    ])
    def test_wake_from_entries_are_connector_slash_author_globs(self, wake_from: str, says: str) -> None:
        """wake_from matches author ids per connector, so each entry names a connector and a glob."""
        (problem,) = problems_of(one_connector() + agent(wake_from=wake_from))
        assert problem.startswith("agents[0].wake_from[0]: ") and says in problem, problem

    def test_good_wake_from_entries_pass(self) -> None:
        """A configured connector, a slash, and any glob over ids."""
        assert problems_of(one_connector() + agent(wake_from='["a/1234*", "a/*", "a/u-[0-9]"]')) == []

    def test_both_prompts_set_is_a_problem(self) -> None:
        """system_prompt and system_prompt_file cannot both be set: which one would win is not obvious."""
        assert problems_of(agent(system_prompt='"x"', system_prompt_file='"x.md"')) == [
            "agents[0].system_prompt_file: set together with system_prompt; give one of them"]

    @pytest.mark.parametrize(("fields", "expected"), [
        ({"max_wait_ms": "100"}, ["agents[0].max_wait_ms: 100 is less than debounce_ms (300); "
                                  "a turn could never wait out its debounce"]),
        ({"debounce_ms": "5000", "max_wait_ms": "4999"}, ["agents[0].max_wait_ms: 4999 is less than debounce_ms "
                                                          "(5000); a turn could never wait out its debounce"]),
        ({"debounce_ms": "5000", "max_wait_ms": "5000"}, []),
        ({"debounce_ms": "5000"}, []),
    ])
    def test_max_wait_below_debounce_is_a_problem(self, fields: dict[str, str], expected: list[str]) -> None:
        """A max_wait_ms set smaller than debounce_ms (its default 300 included) is refused."""
        assert problems_of(agent(**fields)) == expected

    @pytest.mark.parametrize(("fields", "prefix"), [
        ({"context_scope": '"room"'}, "agents[0].context_scope"),
        ({"max_turns_per_hour": "0"}, "agents[0].max_turns_per_hour"),
        ({"tool_timeout_s": "0"}, "agents[0].tool_timeout_s"),
        ({"max_tokens_per_day": "-1"}, "agents[0].max_tokens_per_day"),
        ({"wake_from_bots": '"yes"'}, "agents[0].wake_from_bots"),
        ({"hears": '"a"'}, "agents[0].hears"),
        ({"title": "1"}, "agents[0].title"),
    ])
    def test_agent_values_are_type_checked(self, fields: dict[str, str], prefix: str) -> None:
        """Enums, limits and types of the agent keys are reported at their paths."""
        (problem,) = problems_of(one_connector() + agent(**fields))
        assert problem.startswith(prefix + ":"), problem

    @pytest.mark.parametrize(("backend", "expected"), [
        ('kind = "openai"', ["agents[0].backend.model: required for kind 'openai'"]),
        ('kind = "anthropic"\nmodel = "claude"', []),
        ('kind = "scripted"', []),
        ("max_retries = -1", ["agents[0].backend.max_retries: Expected `int` >= 0"]),
        ("temperature = 3.0", ["agents[0].backend.temperature: Expected `float` <= 2.0"]),
        ("max_tokens = 0", ["agents[0].backend.max_tokens: Expected `int` >= 1"]),
        ('script = [{ text = "x", mood = "y" }]', ["agents[0].backend.script[0]: Object contains unknown field `mood`"]),
        ('script = [{ tool_calls = [{ arguments = {} }] }]',
         ["agents[0].backend.script[0].tool_calls[0]: Object missing required field `name`"]),
        ('kind = "openai"\nmodel = "m"\nbase_url = "::::"',
         ["agents[0].backend.base_url: '::::' is not an absolute http:// or https:// URL with a host "
          "(e.g. http://127.0.0.1:8000/v1)"]),
        ('kind = "anthropic"\nmodel = "m"\nbase_url = "http://h:abc/"',
         ["agents[0].backend.base_url: 'http://h:abc/' is not a URL (Port could not be cast to integer value as "
          "'abc')"]),
        ('kind = "openai"\nmodel = "m"\nbase_url = "http://[::1/v1"',
         ["agents[0].backend.base_url: 'http://[::1/v1' is not a URL (Invalid IPv6 URL)"]),
        ('kind = "openai"\nmodel = "m"\nbase_url = "http://h/\\n"',
         ["agents[0].backend.base_url: 'http://h/\\n' holds a space or a control character"]),
        ('kind = "openai"\nmodel = "m"\nbase_url = "127.0.0.1:8000"',
         ["agents[0].backend.base_url: '127.0.0.1:8000' is not an absolute http:// or https:// URL with a host "
          "(e.g. http://127.0.0.1:8000/v1)"]),
        ('kind = "openai"\nmodel = "m"\nbase_url = "https://[::1]:8443/v1"', []),
    ])
    def test_backend_tables_are_checked(self, backend: str, expected: list[str]) -> None:
        """A network backend names its model; numbers are bounded; script tables are strict; its base_url is an
        absolute http(s) URL the SDKs' HTTP client can parse (docs/agents.md#backends)."""
        assert problems_of(agent() + "[agents.backend]\n" + backend + "\n") == expected

    @given(st.one_of(st.text(), st.builds("".join, st.lists(st.sampled_from(
        ["http", "https", "ftp", "://", ":", "/", "[", "]", "::1", "h", "127.0.0.1", "8000", "99999", "-1", "@", "?",
         "#", "%", " ", "\n", "v1", "é", "\x00"]), max_size=12))))
    def test_a_base_url_config_accepts_is_one_the_sdks_accept(self, url: str) -> None:
        """What base_url_problem lets through, both SDKs' constructors take (a reload builds them: an exception
        there would refuse it); what they refuse, check-config refuses first."""
        from mcplhost.agents.backends import make_backend

        if base_url_problem(url) is None:
            for kind in ("openai", "anthropic"):
                make_backend(BackendConfig(kind=kind, model="m", base_url=url), environ={})

    @pytest.mark.parametrize(("text", "expected"), [
        ("[inference]\ncontext_window = 1000\n", ["inference.backend: required"]),
        ('[inference]\nsize = 1\n[inference.backend]\nkind = "scripted"\n', ["inference.size: unknown key"]),
        ('[inference.backend]\nkind = "openai"\n', ["inference.backend.model: required for kind 'openai'"]),
        ('[inference]\ncontext_window = 0\n[inference.backend]\nkind = "scripted"\n',
         ["inference.context_window: Expected `int` >= 1"]),
        ('[inference.backend]\nkind = "scripted"\n', []),
    ])
    def test_the_inference_table_is_validated(self, text: str, expected: list[str]) -> None:
        """[inference] needs a backend, takes only its keys, and its backend follows the agents' backend rules."""
        assert problems_of(text) == expected


class TestAgentEnvironment:
    def test_an_unreadable_prompt_file_is_a_problem(self, tmp_path) -> None:
        """A missing system_prompt_file, or one that is a folder, is named with its resolved path."""
        (tmp_path / "folder.md").mkdir()
        text = agent(system_prompt_file='"missing.md"') + '[[agents]]\nname = "b"\nsystem_prompt_file = "folder.md"\n'
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, text))
        missing, folder = caught.value.problems
        assert missing.startswith(f"agents[0].system_prompt_file: cannot read {tmp_path / 'missing.md'}: ")
        assert folder.startswith(f"agents[1].system_prompt_file: cannot read {tmp_path / 'folder.md'}: ")

    def test_a_key_variable_not_set_is_a_warning(self, tmp_path, monkeypatch) -> None:
        """api_key_env naming an unset variable warns (the daemon's environment may differ); set, it is quiet."""
        monkeypatch.delenv("MCPLHOST_TEST_KEY", raising=False)
        text = agent() + '[agents.backend]\nkind = "openai"\nmodel = "m"\napi_key_env = "MCPLHOST_TEST_KEY"\n'
        _, found = read_config(write(tmp_path, text))
        assert found == ["agents[0].backend.api_key_env: the variable MCPLHOST_TEST_KEY is not set here: "
                         "calls will fail with missing_key"]
        monkeypatch.setenv("MCPLHOST_TEST_KEY", "k" * 8)  # shorter would be warned about (docs/agents.md#secrets)
        assert read_config(write(tmp_path, text))[1] == []

    def test_an_unheard_wake_on_connector_and_a_stray_script_are_warnings(self) -> None:
        """Allowed, but surely not meant: a wake_on connector outside hears, a script a network backend ignores."""
        import tomllib

        text = (one_connector() + '[[connectors]]\nname = "b"\ncommand = ["sh"]\ngrant = ["pushEvents"]\n'
                + agent(hears='["a"]', wake_on='["dm", "b/x:*"]')
                + '[agents.backend]\nkind = "openai"\nmodel = "m"\nscript = ["hi"]\n')
        raw = tomllib.loads(text)
        assert problems(raw) == []
        assert warnings(raw)[1:] == [
            "agents[0].wake_on[1]: 'b/x:*' names a connector the agent does not hear: it never wakes it",
            "agents[0].backend.script: ignored by kind 'openai' (scripted only)"]


class TestConnectorAgent:
    """`[[connectors]] agent` (docs/agents.md#addressing): it names a configured agent; shared addressing is warned."""

    def test_agent_must_name_a_configured_agent(self) -> None:
        text = one_connector(agent='"ghost"') + agent()
        assert problems_of(text) == ["connectors[0].agent: no agent is named 'ghost' (configured: scout)"]
        assert problems_of(one_connector(agent='"scout"') + agent()) == []

    def test_several_addressed_wakers_without_agent_are_a_warning(self) -> None:
        """Two agents wake on the connector's addressed items (by default), none named: said once, with the fix."""
        import tomllib

        two = agent() + '[[agents]]\nname = "ada"\n'
        assert warnings(tomllib.loads(one_connector() + two))[1:] == [
            "connectors[0].agent: not set, and scout, ada all wake on addressed items of 'a': an addressed item "
            "wakes only the agents it names (@NAME, or NAME: at its start); set agent = \"NAME\" for the agent "
            "this connector's bot speaks for"]
        assert warnings(tomllib.loads(one_connector(agent='"ada"') + two))[1:] == []
        one_waker = agent() + '[[agents]]\nname = "ada"\nwake_on = ["dm"]\n'
        assert warnings(tomllib.loads(one_connector() + one_waker))[1:] == []


class TestAgentsThatHearNothing:
    @pytest.mark.parametrize(("text", "warned"), [
        ('[[agents]]\nname = "a"\nhears = []\n', True),
        ('[[agents]]\nname = "lead"\n[[agents]]\nname = "a"\nparent = "lead"\nhears = []\n', False),
        ('[[agents]]\nname = "a"\nhears = []\n[[agents]]\nname = "helper"\nparent = "a"\n', False),
    ])
    def test_only_an_agent_outside_any_tree_is_warned_it_never_wakes(self, text: str, warned: bool) -> None:
        """Hearing nothing, an agent with a parent or a child is still woken by their peer messages
        (docs/peers.md): no "never wakes" warning for it; alone, it is warned."""
        found = [w for w in warnings(tomllib.loads(text)) if ".hears:" in w]
        assert found == (["agents[0].hears: empty: the agent hears nothing and never wakes (it has no parent nor "
                          "child whose peer messages would wake it)"] if warned else [])


class TestConnectorEnvironment:
    """`env`, `env_pass` and `env_file` (docs/connectors.md §10): what check-config and run refuse."""

    KEYED = ('[[agents]]\nname = "scout"\n[agents.backend]\nkind = "openai"\nmodel = "m"\n'
             'api_key_env = "SCOUT_KEY"\n[inference]\n[inference.backend]\nkind = "anthropic"\nmodel = "m"\n'
             'api_key_env = "INFER_KEY"\n')

    def connector(self, **fields: str) -> str:
        return ('[[connectors]]\nname = "c"\ncommand = ["sh"]\ngrant = ["pushEvents"]\n'
                + "".join(f"{key} = {value}\n" for key, value in fields.items()))

    def test_env_pass_and_env_naming_an_api_key_variable_are_problems(self) -> None:
        """An agent's or [inference]'s api_key_env named in env_pass or as an env key: a problem naming both."""
        raw = tomllib.loads(self.connector(env_pass='["PROXY", "SCOUT_KEY"]', env='{ INFER_KEY = "x" }')
                            + self.KEYED)
        found = problems(raw)
        assert [p.partition(":")[0] for p in found] == ["connectors[0].env_pass[1]", "connectors[0].env.INFER_KEY"]
        assert "named by agents[0].backend.api_key_env" in found[0]
        assert "named by inference.backend.api_key_env" in found[1]

    def test_env_pass_entries_are_variable_names(self) -> None:
        """`env_pass = ["NOT A NAME"]` is a type problem at its index."""
        found = problems(tomllib.loads(self.connector(env_pass='["GOOD", "not a name"]')))
        assert [p.partition(":")[0] for p in found] == ["connectors[0].env_pass[1]"]

    def test_the_derived_field_cannot_be_written(self) -> None:
        """`withheld_env` is filled in by the loader; a file that sets it has an unknown key."""
        found = problems(tomllib.loads(self.connector(withheld_env='["X"]')))
        assert found == ["connectors[0].withheld_env: unknown key"]

    def test_the_env_file_is_resolved_and_every_connector_withholds_every_key(self, tmp_path) -> None:
        """env_file is relative to the config; each connector carries the api key variables it never gets."""
        secrets = tmp_path / "c.env"
        secrets.write_text("TOKEN=t\n", encoding="utf-8")
        secrets.chmod(0o600)
        config = load_config(write(tmp_path, self.connector(env_file='"c.env"') + self.KEYED))
        (spec,) = config.connectors
        assert spec.env_file == str(secrets) and spec.withheld_env == {"SCOUT_KEY", "INFER_KEY"}

    @pytest.mark.parametrize(("content", "mode", "says"), [
        ("TOKEN=t\n", 0o640, "mode 0640 lets the group or others read or write it"),
        ("TOKEN=t\nbroken line\n", 0o600, "line 2: not NAME=VALUE"),
        ("SCOUT_KEY=sk\n", 0o600, "sets SCOUT_KEY, which holds an api key of this host"),
        (None, 0o600, "cannot open: No such file or directory"),
    ])
    def test_an_unusable_env_file_is_a_problem(self, tmp_path, content: str | None, mode: int, says: str) -> None:
        """check-config refuses an env file others may read, one that does not parse, or names an api key."""
        if content is not None:
            (tmp_path / "c.env").write_text(content, encoding="utf-8")
            (tmp_path / "c.env").chmod(mode)
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, self.connector(env_file='"c.env"') + self.KEYED))
        (problem,) = caught.value.problems
        assert problem.startswith("connectors[0].env_file: ") and says in problem, problem

    def test_a_start_problem_does_not_stop_run(self, tmp_path) -> None:
        """What stops one connector (command, cwd, env file) is left to its spawn when run reads the config."""
        text = self.connector(env_file='"absent.env"', command='["no-such-program-h4"]').replace(
            'command = ["sh"]\n', "")
        with pytest.raises(ConfigError):
            read_config(write(tmp_path, text))
        config, _ = read_config(write(tmp_path, text), start_problems=False)
        assert config.connectors[0].command == ["no-such-program-h4"]

    def test_an_env_pass_variable_not_set_here_is_a_warning(self, tmp_path, monkeypatch) -> None:
        """An env_pass name absent from check-config's environment is said (it may be set under systemd)."""
        monkeypatch.delenv("MCPLHOST_UNSET_H4", raising=False)
        _, found = read_config(write(tmp_path, self.connector(env_pass='["MCPLHOST_UNSET_H4"]')))
        assert found == ["connectors[0].env_pass[0]: the variable MCPLHOST_UNSET_H4 is not set here: "
                         "the connector starts without it"]


class TestMetricsListen:
    """`[metrics] listen` is HOST:PORT (docs/operations.md#metrics)."""

    @given(st.sampled_from(["127.0.0.1", "0.0.0.0", "localhost", "metrics.internal"]), st.integers(0, 65535))
    def test_host_and_port_are_read_back(self, host: str, port: int) -> None:
        """Every HOST:PORT gives its host and port."""
        assert listen_address(f"{host}:{port}") == (host, port)

    def test_an_ipv6_host_is_in_brackets(self) -> None:
        """[::1]:9464 is ::1; a bare IPv6 address is refused."""
        assert listen_address("[::1]:9464") == ("::1", 9464)
        with pytest.raises(ValueError):
            listen_address("::1:9464")

    def test_check_config_refuses_a_listen_that_is_not_host_and_port(self) -> None:
        """A port alone, a host alone or a port out of range is a problem at metrics.listen."""
        for listen in ("9464", ":9464", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:http"):
            found = problems({"store": {"path": "x.db"}, "metrics": {"listen": listen}})
            assert len(found) == 1 and found[0].startswith("metrics.listen: "), (listen, found)
        assert problems({"store": {"path": "x.db"}, "metrics": {"listen": "127.0.0.1:9464"}}) == []
