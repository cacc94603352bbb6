"""`[store]` on SQLite or PostgreSQL, `[host] name`, the state folder and the URL's password as a secret
(README.md#configuration-reference, docs/operations.md#the-state-folder)."""

from __future__ import annotations

import socket
import string
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import (
    control_socket_path,
    daemon_lock,
    default_host_name,
    load_config,
    problems,
    read_config,
    redact_url,
    secret_values,
)
from mcplhost.config.environment import short_secret_warnings
from mcplhost.config.values import url_passwords
from mcplhost.errors import ConfigError

URL = "postgresql://mcplhost:s3cret-pass@db.example:5433/mcplhost"


def write(folder: Path, text: str) -> Path:
    path = folder / "mcplhost.toml"
    path.write_text(text)
    return path


class TestProblems:
    def test_path_and_url_together_is_one_line(self) -> None:
        assert problems({"store": {"path": "x.db", "url": URL}}) == [
            "store.url: set together with path; give one of them (path: an SQLite file, url: a PostgreSQL server)"]

    def test_synchronous_belongs_to_sqlite_and_pool_size_to_postgresql(self) -> None:
        assert problems({"store": {"url": URL, "synchronous": "FULL", "pool_size": 20}}) == [
            "store.synchronous: only with path (SQLite); with url, durability is the PostgreSQL server's "
            "synchronous_commit"]
        assert problems({"store": {"path": "x.db", "pool_size": 20}}) == [
            "store.pool_size: only with url (PostgreSQL); an SQLite store has one writer connection"]
        assert problems({"store": {"synchronous": "FULL"}}) == []

    @pytest.mark.parametrize("size", [0, 101])
    def test_pool_size_is_bounded(self, size: int) -> None:
        (problem,) = problems({"store": {"url": URL, "pool_size": size}})
        assert problem.startswith("store.pool_size: Expected `int` ")

    @pytest.mark.parametrize(("url", "says"), [
        ("mysql://root:hunter2-long@h/db", "is not a postgresql:// or postgres:// URL"),
        ("postgresql://u:hunter2-long@h:99999/db", "is not a URL (Port out of range"),
        ("postgresql://u:hunter2 long@h/db", "holds a space or a control character"),
        ("sqlite:///x.db", "is not a postgresql:// or postgres:// URL"),
    ])
    def test_a_url_that_names_no_server_never_shows_its_password(self, url: str, says: str) -> None:
        (problem,) = problems({"store": {"url": url}})
        assert problem.startswith("store.url: ") and says in problem and "hunter2" not in problem

    def test_every_problem_of_the_store_at_once(self) -> None:
        found = problems({"store": {"path": "x.db", "url": "http://x", "synchronous": "FULL"}, "host": {"name": "a b"}})
        assert [p.partition(":")[0] for p in found] == ["host.name", "store.url", "store.url", "store.synchronous"]

    @pytest.mark.parametrize("name", ["eu-1", "db.example.com", "A_b", "x" * 64])
    def test_host_names_allowed(self, name: str) -> None:
        assert problems({"host": {"name": name}}) == []

    @pytest.mark.parametrize("name", ["", "a b", "eu/1", "x" * 65, "é"])
    def test_host_names_refused(self, name: str) -> None:
        (problem,) = problems({"host": {"name": name}})
        assert problem.startswith("host.name: ")

    def test_the_state_folder_is_a_derived_key(self) -> None:
        assert problems({"store": {"state_dir": "/tmp"}}) == ["store.state_dir: unknown key"]


class TestResolved:
    def test_url_resolves_the_state_folder_to_the_config_folder(self, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("MCPLHOST_STATE_DIR", raising=False)
        config = load_config(write(tmp_path, f'[store]\nurl = "{URL}"\npool_size = 4\n[host]\nname = "eu-1"\n'))
        assert config.store.url == URL and config.store.pool_size == 4
        assert control_socket_path(config) == tmp_path / "mcplhost.sock"
        lock = daemon_lock(config)
        assert lock.path == tmp_path / "eu-1.lock"
        assert lock.subject == "host eu-1 on postgresql://mcplhost:***@db.example:5433/mcplhost"

    def test_mcplhost_state_dir_moves_lock_and_socket(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "state").mkdir()
        monkeypatch.setenv("MCPLHOST_STATE_DIR", "state")  # relative to the config's folder
        config = load_config(write(tmp_path, f'[store]\nurl = "{URL}"\n[control]\nsocket = "/run/x.sock"\n'))
        assert daemon_lock(config).path == tmp_path / "state" / f"{config.host.name}.lock"
        assert control_socket_path(config) == Path("/run/x.sock")  # an absolute [control] socket is kept as written

    def test_sqlite_keeps_its_files_beside_the_database(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MCPLHOST_STATE_DIR", str(tmp_path / "elsewhere"))  # not read for an SQLite store
        (tmp_path / "data").mkdir()
        config = load_config(write(tmp_path, '[store]\npath = "data/x.db"\n'))
        assert config.store.url is None and config.store.path == str(tmp_path / "data" / "x.db")
        assert control_socket_path(config) == tmp_path / "data" / "mcplhost.sock"
        assert daemon_lock(config).path == tmp_path / "data" / "x.db.lock"

    def test_a_missing_state_folder_is_a_problem(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MCPLHOST_STATE_DIR", str(tmp_path / "missing"))
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, f'[store]\nurl = "{URL}"\n'))
        assert caught.value.problems == [f"store.url: the folder {tmp_path / 'missing'} does not exist (the state "
                                         "folder: MCPLHOST_STATE_DIR, else the config's folder)"]

    def test_host_name_defaults_to_the_hostname(self, tmp_path: Path) -> None:
        assert load_config(write(tmp_path, "")).host.name == default_host_name()
        if all(c.isalnum() or c in "._-" for c in socket.gethostname()):
            assert default_host_name() == socket.gethostname()[:64]


class TestSecrets:
    def test_a_password_in_a_config_others_may_read_is_warned_about(self, tmp_path: Path) -> None:
        path = write(tmp_path, f'[store]\nurl = "{URL}"\n')
        path.chmod(0o644)
        (warning,) = read_config(path)[1]
        assert warning == (f"store.url: holds a password, and {path} may be read by others (mode 0644): chmod 600 "
                           "it, or give the password by PGPASSWORD or a PGPASSFILE instead")
        path.chmod(0o600)
        assert read_config(path)[1] == []
        path.write_text('[store]\nurl = "postgresql://mcplhost@db/x"\n')  # no password: nothing to say
        path.chmod(0o644)
        assert read_config(path)[1] == []

    def test_the_url_password_is_a_secret_and_pgpassword_with_a_url(self) -> None:
        url = "postgresql://mcplhost:p%40ss-word-1@db/x?password=another-secret"
        raw = {"store": {"url": url}}
        from mcplhost.config.check import check

        config = check(raw).config
        values = secret_values(config, {"PGPASSWORD": "from-the-environment", "OTHER": "not-a-secret-x"})
        assert sorted(values.values()) == ["another-secret", "from-the-environment", "p%40ss-word-1", "p@ss-word-1"]
        sqlite = check({}).config
        assert secret_values(sqlite, {"PGPASSWORD": "from-the-environment"}) == {}

    def test_no_connector_gets_pgpassword_on_a_postgresql_store(self) -> None:
        """With a url, PGPASSWORD is withheld like an api key variable: env_pass naming it is a problem."""
        connector = {"name": "c", "command": ["sh"], "env_pass": ["PGPASSWORD"]}
        assert problems({"store": {"url": URL}, "connectors": [connector]}) == [
            "connectors[0].env_pass[0]: PGPASSWORD holds an api key of this host (named by store.url); connectors "
            "never get it: give the connector its own variable"]
        assert problems({"connectors": [connector]}) == []  # an SQLite store has no PostgreSQL password

    def test_pgpassword_is_withheld_from_every_connector(self, tmp_path: Path) -> None:
        config = load_config(write(tmp_path, f'[store]\nurl = "{URL}"\n[[connectors]]\nname = "c"\n'
                                             'command = ["sh"]\n'))
        assert "PGPASSWORD" in config.connectors[0].withheld_env

    def test_a_short_url_password_is_warned_about_without_its_value(self) -> None:
        from mcplhost.config.check import check

        (warning,) = short_secret_warnings(check({"store": {"url": "postgresql://u:pw@h/d"}}).config, {})
        assert warning.startswith("store.url: the value of store.url is shorter than") and "pw@" not in warning


PASSWORD_CHARS = string.ascii_letters + string.digits + "!$%&'()*+,;=-._~:@/?#[] "


class TestRedaction:
    @given(user=st.text(string.ascii_letters, min_size=1, max_size=8),
           password=st.text(PASSWORD_CHARS, min_size=8, max_size=24),
           host=st.sampled_from(["db", "db.example:5433", "[::1]:5432", ""]),
           tail=st.sampled_from(["/x", "/x?sslmode=require", "", "?host=/run/postgresql"]))
    def test_the_password_never_survives_redaction(self, user: str, password: str, host: str, tail: str) -> None:
        """However it is written (percent-encoded as libpq wants), the redacted URL holds neither form."""
        encoded = quote(password, safe="")
        url = f"postgresql://{user}:{encoded}@{host}{tail}"
        shown = redact_url(url)
        assert shown == f"postgresql://{user}:***@{host}{tail}"
        assert password in url_passwords(url) and encoded in url_passwords(url)

    @given(secret=st.text(string.ascii_letters + string.digits, min_size=8, max_size=16),
           before=st.sampled_from(["", "sslmode=require&"]), after=st.sampled_from(["", "&port=5432"]))
    def test_a_password_parameter_is_redacted_too(self, secret: str, before: str, after: str) -> None:
        url = f"postgres://u@h/d?{before}password={secret}{after}"
        assert redact_url(url) == f"postgres://u@h/d?{before}password=***{after}"
        assert url_passwords(url) == [secret]

    def test_a_url_without_a_password_is_shown_as_written(self) -> None:
        for url in ("postgresql://u@h/d", "postgresql:///d?host=/tmp", "postgres://h"):
            assert redact_url(url) == url and url_passwords(url) == []
