"""mcplhost/config.py: strict TOML decoding, every problem with its path, paths relative to the file."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from mcplhost.config import Config, RestartConfig, default_config_path, load_config, problems
from mcplhost.errors import ConfigError

#: The configuration example of INTERFACES.md, verbatim.
INTERFACES_EXAMPLE = """
[store]
path = "mcplhost.db"                 # SQLite file; created and migrated on start

[[connectors]]
name = "discord"                      # the host's id for this connection; appears in headers
command = ["python", "-m", "connectors.discordish"]
env = { GUILDS = "acme" }             # optional, added to the child's environment
cwd = "."                             # optional
grant = ["channels.register", "channels.incoming", "channels.publish", "pushEvents"]
request_timeout_s = 10                # optional
protocol = "auto"                     # optional: "auto" | "0.5" | "0.4" (see ../mcpl/COMPAT.md)
channels = ["discord:g1:*"]           # optional: globs of channel ids it may register (default: any)
feature_sets = { enabled = ["discord.messaging"], disabled = [] }   # optional selection for featureSets/update
accept_tag_implications = false       # optional: apply the connector's own tagOntology `implies` edges
[connectors.restart]                  # optional; these are the defaults
policy = "on-failure"                 # "always" | "on-failure" | "never"
backoff_initial_s = 0.5
backoff_max_s = 30
burst = 5                             # after this many failures ...
window_s = 60                         # ... within this window: the slow lane (one try every backoff_max_s)

[[agents]]
name = "scout"
parent = "lead"                       # optional: tree for peer messages
wake_on = ["addressed", "dm"]         # which inbound items wake it ("all", "addressed", "dm", "push", server or channel ids)
debounce_ms = 300
[agents.backend]
kind = "scripted"                     # "scripted" | "openai" | "anthropic"

[[agents]]
name = "lead"
"""


def write(folder: Path, text: str, name: str = "mcplhost.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(text: str) -> list[str]:
    import tomllib

    return problems(tomllib.loads(text))


class TestLoadConfig:
    def test_the_interfaces_example_loads(self, tmp_path) -> None:
        """INTERFACES.md's example decodes with every field where the document puts it."""
        config = load_config(write(tmp_path, INTERFACES_EXAMPLE))
        (discord,) = config.connectors
        assert discord.env == {"GUILDS": "acme"} and discord.channels == ["discord:g1:*"]
        assert discord.feature_sets.enabled == ["discord.messaging"] and discord.request_timeout_s == 10
        assert [a.name for a in config.agents] == ["scout", "lead"] and config.agents[0].parent == "lead"

    def test_restart_defaults_are_the_documented_ones(self) -> None:
        """An absent [connectors.restart] means on-failure, 0.5 s, 30 s, burst 5 in 60 s."""
        assert RestartConfig() == RestartConfig(policy="on-failure", backoff_initial_s=0.5, backoff_max_s=30,
                                                burst=5, window_s=60)

    def test_relative_paths_are_relative_to_the_config_folder(self, tmp_path) -> None:
        """store.path and cwd resolve against the file's folder, not the working directory."""
        folder = tmp_path / "etc"
        folder.mkdir()
        text = '[store]\npath = "data/x.db"\n[[connectors]]\nname = "a"\ncommand = ["a"]\ncwd = "work"\n'
        config = load_config(write(folder, text))
        assert config.store.path == str(folder / "data" / "x.db")
        assert config.connectors[0].cwd == str(folder / "work")

    def test_absolute_paths_are_kept_and_cwd_defaults_to_the_config_folder(self, tmp_path) -> None:
        """An absolute store.path stays as written; a connector without cwd runs in the config's folder."""
        text = f'[store]\npath = "{tmp_path}/abs.db"\n[[connectors]]\nname = "a"\ncommand = ["a"]\n'
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
        ("[store]\nsize = 1", "store.size: unknown key"),
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
    ])
    def test_agent_parents_must_exist_and_not_loop(self, agents: list[tuple[str, str | None]],
                                                   expected: list[str]) -> None:
        """A parent names an agent of this file, and following parents ends."""
        text = "".join(f'[[agents]]\nname = "{n}"\n' + (f'parent = "{p}"\n' if p else "") for n, p in agents)
        assert problems_of(text) == expected

    def test_a_problem_free_document_converts(self) -> None:
        """When problems() finds nothing, msgspec's own conversion succeeds too."""
        import tomllib

        raw = tomllib.loads(INTERFACES_EXAMPLE)
        assert problems(raw) == []
        assert isinstance(msgspec.convert(raw, Config), Config)
