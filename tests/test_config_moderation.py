"""`[moderation]`'s checks (docs/agents.md#moderation): each kind's keys, the command's program, the key variable."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from mcplhost.config import load_config, problems, read_config
from mcplhost.errors import ConfigError

from .cli.support import cli

CONNECTOR = '[[connectors]]\nname = "c"\ncommand = ["sh"]\ngrant = ["pushEvents"]\n'


def write(folder: Path, text: str) -> Path:
    path = folder / "mcplhost.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("table", "expected"), [
    ('kind = "command"\n', ['moderation.command: required for kind "command"']),
    ('kind = "command"\ncommand = ["sh"]\nmodel = "m"\napi_key_env = "K"\n',
     ['moderation.model: not used by kind "command" (only by kind "openai")',
      'moderation.api_key_env: not used by kind "command" (only by kind "openai")']),
    ('kind = "openai"\ncommand = ["sh"]\n', ['moderation.command: not used by kind "openai" (it calls the '
                                             'moderations endpoint; set model, base_url, api_key_env)']),
    ('kind = "openai"\nmodel = "omni-moderation-latest"\nbase_url = "http://127.0.0.1:1/v1"\n', []),
    ('kind = "openai"\nbase_url = "::::"\n', ["moderation.base_url: '::::' is not an absolute http:// or https:// URL "
                                              "with a host (e.g. http://127.0.0.1:8000/v1)"]),
    ('kind = "command"\ncommand = ["sh"]\ntimeout_s = 2\n', []),
    ('kind = "other"\n', ["moderation.kind: 'other' is not one of 'command', 'openai'"]),
])
def test_each_kind_takes_its_own_keys(table: str, expected: list[str]) -> None:
    found = problems(tomllib.loads("[moderation]\n" + table))
    assert [p.split(", got")[0] for p in found] == expected


def test_the_moderation_key_variable_is_withheld_from_every_connector(tmp_path: Path) -> None:
    """Its api_key_env joins the host's keys: a connector naming it is a problem, and each withholds it."""
    text = CONNECTOR + '[moderation]\nkind = "openai"\napi_key_env = "MOD_KEY"\n'
    found = problems(tomllib.loads(CONNECTOR + 'env_pass = ["MOD_KEY"]\n[moderation]\nkind = "openai"\n'
                                   'api_key_env = "MOD_KEY"\n'))
    assert found == ["connectors[0].env_pass[0]: MOD_KEY holds an api key of this host (named by "
                     "moderation.api_key_env); connectors never get it: give the connector its own variable"]
    assert load_config(write(tmp_path, text)).connectors[0].withheld_env == {"MOD_KEY"}


def test_an_unset_key_variable_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOD_KEY_UNSET", raising=False)
    _, found = read_config(write(tmp_path, '[moderation]\nkind = "openai"\napi_key_env = "MOD_KEY_UNSET"\n'))
    assert found == ["moderation.api_key_env: the variable MOD_KEY_UNSET is not set here: every check will fail, "
                     "so every segment becomes a draft"]


def test_a_missing_program_stops_check_config_and_run(tmp_path: Path) -> None:
    """Fatal, not per connector: without its check every segment would be a draft."""
    text = '[moderation]\nkind = "command"\ncommand = ["./moderate.sh"]\n'
    with pytest.raises(ConfigError) as caught:
        read_config(write(tmp_path, text), start_problems=False)
    assert caught.value.problems == [f"moderation.command: './moderate.sh' does not exist (relative to {tmp_path})"]
    result = cli("check-config", str(write(tmp_path, '[moderation]\nkind = "command"\ncommand = ["no-such-judge-x"]\n')))
    assert result.returncode != 0 and "moderation.command: 'no-such-judge-x' is not found on PATH" in result.stderr


def test_a_relative_program_is_resolved_against_the_config_folder(tmp_path: Path) -> None:
    script = tmp_path / "moderate.sh"
    script.write_text("#!/bin/sh\necho '{\"allow\": true}'\n", encoding="utf-8")
    script.chmod(0o755)
    config = load_config(write(tmp_path, f'[moderation]\nkind = "command"\ncommand = ["./moderate.sh", "{sys.executable}"]\n'))
    assert config.moderation is not None and config.moderation.command == [str(tmp_path / "./moderate.sh"),
                                                                           sys.executable]
