"""`[console]` in the config: check-config's problems, the token file's refusals, and `run` refusing at start.

docs/operations.md#console: a non-loopback `listen` (0.0.0.0 included) needs
a `token_file` of mode 0600 or stricter; a missing, open or short one is a
config problem, said by check-config and at start, before anything runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import ConsoleConfig, is_loopback, problems
from mcplhost.console import component
from mcplhost.console.component import ConsoleUnavailable, console_token
from mcplhost.envfile import MIN_TOKEN_CHARS, EnvFileError, read_token_file

from ..cli.support import cli, toml_table, write_config

TOKEN = "b3f1c2d4e5a6978812345678abcdef00"


def token_file(folder: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path = folder / "console.token"
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    return path


def with_console(folder: Path, **console: object) -> Path:
    config = write_config(folder)
    config.write_text(config.read_text(encoding="utf-8") + "\n" + toml_table("[console]", console), encoding="utf-8")
    return config


class TestLoopback:
    @given(st.sampled_from(["127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST"]))
    def test_loopback_hosts(self, host: str) -> None:
        """localhost, 127.0.0.0/8 and ::1 are reached from this machine only."""
        assert is_loopback(host)

    @given(st.sampled_from(["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "console.example", "127.0.0.1.nip.io"]))
    def test_other_hosts(self, host: str) -> None:
        """Every other address, the wildcard ones and names included, is not."""
        assert not is_loopback(host)


class TestProblems:
    def test_a_loopback_console_needs_no_token(self) -> None:
        """127.0.0.1 and [::1] without token_file, with or without the restart action: no problem."""
        for listen in ("127.0.0.1:8787", "[::1]:0", "localhost:8787"):
            assert problems({"console": {"listen": listen, "actions": ["restart-connector"]}}) == []

    def test_off_loopback_the_token_file_is_required(self) -> None:
        """0.0.0.0 or a LAN address without token_file is a problem at console.token_file."""
        for listen in ("0.0.0.0:8787", "[::]:8787", "10.1.2.3:8787"):
            (found,) = problems({"console": {"listen": listen}})
            assert found.startswith("console.token_file: required when listen"), found

    def test_listen_unknown_keys_and_actions(self) -> None:
        """listen is HOST:PORT; an unknown key or action is named where it is."""
        found = problems({"console": {"listen": "8787", "actions": ["drop-database"], "tokn_file": "x"}})
        assert any(p.startswith("console.listen: ") for p in found)
        assert "console.tokn_file: unknown key (did you mean 'token_file'?)" in found
        assert any(p.startswith("console.actions[0]: ") for p in found)


class TestTokenFile:
    def test_the_token_is_its_stripped_line(self, tmp_path: Path) -> None:
        assert read_token_file(token_file(tmp_path, f"  {TOKEN}\n")) == TOKEN

    @pytest.mark.parametrize(("text", "mode", "says"), [
        (TOKEN, 0o640, "mode 0640 lets the group or others"),
        (TOKEN, 0o604, "mode 0604 lets the group or others"),
        (TOKEN, 0o601, "mode 0601 lets the group or others"),
        ("short-token", 0o600, f"shorter than {MIN_TOKEN_CHARS} characters"),
        (TOKEN + "\n" + TOKEN, 0o600, "one line of printable characters"),
        ("", 0o600, "shorter than"),
    ])
    def test_refused(self, tmp_path: Path, text: str, mode: int, says: str) -> None:
        """Others may reach it, it is short, or it is not one line: refused, saying why and never what it holds."""
        with pytest.raises(EnvFileError, match=says) as caught:
            read_token_file(token_file(tmp_path, text, mode))
        assert TOKEN not in str(caught.value)

    def test_missing(self, tmp_path: Path) -> None:
        with pytest.raises(EnvFileError, match="cannot open"):
            read_token_file(tmp_path / "nowhere.token")


class TestCheckConfig:
    def test_without_a_token_file_off_loopback(self, tmp_path: Path) -> None:
        """check-config exits 2 and names console.token_file."""
        result = cli("check-config", str(with_console(tmp_path, listen="0.0.0.0:8787")))
        assert result.returncode == 2
        assert "console.token_file: required when listen (0.0.0.0:8787)" in result.stderr

    def test_an_open_token_file(self, tmp_path: Path) -> None:
        """A token file the group can read is a problem of the config, with its path."""
        token_file(tmp_path, mode=0o644)
        result = cli("check-config", str(with_console(tmp_path, listen="0.0.0.0:8787", token_file="console.token")))
        assert result.returncode == 2
        assert f"console.token_file: {tmp_path / 'console.token'}: mode 0644" in result.stderr
        assert TOKEN not in result.stderr

    def test_a_good_one(self, tmp_path: Path) -> None:
        token_file(tmp_path)
        result = cli("check-config", str(with_console(tmp_path, listen="0.0.0.0:0", token_file="console.token",
                                                      actions=["restart-connector"])))
        assert result.returncode == 0, result.stderr


class TestRunRefuses:
    def test_run_without_a_token_file_off_loopback(self, tmp_path: Path) -> None:
        """`mcplhost run` refuses such a config at start (exit 2), before a database is made."""
        result = cli("run", "--config", str(with_console(tmp_path, listen="0.0.0.0:0")))
        assert result.returncode == 2
        assert "console.token_file: required when listen (0.0.0.0:0)" in result.stderr
        assert not (tmp_path / "host.db").exists()

    def test_run_without_the_console_packages(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """With one of the console's packages missing, `run` says so in one line and how to install them."""
        monkeypatch.setattr(component, "WEB_MODULES", (*component.WEB_MODULES, "mcplhost_no_such_web_package"))
        result = cli("run", "--config", str(with_console(tmp_path, listen="127.0.0.1:0")))
        assert result.returncode == 1
        (line,) = result.stderr.strip().splitlines()
        assert "mcplhost_no_such_web_package is not installed" in line and "mcplhost[console]" in line

    def test_the_token_file_is_checked_again_at_start(self, tmp_path: Path) -> None:
        """A token file opened to others after check-config is refused when the host is built, and one that
        is fine gives its token."""
        path = token_file(tmp_path, mode=0o644)
        with pytest.raises(ConsoleUnavailable, match="mode 0644"):
            console_token(ConsoleConfig(listen="0.0.0.0:0", token_file=str(path)))
        os.chmod(path, 0o600)
        assert console_token(ConsoleConfig(listen="0.0.0.0:0", token_file=str(path))) == TOKEN
        assert console_token(ConsoleConfig(listen="127.0.0.1:0")) is None
