"""Through `mcplhost run`: a real connector's environment holds the allowlist and its own variables, no secrets."""

from __future__ import annotations

from ..cli.support import daemon, scripted_connector, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, record, wait_for

#: An agent whose key variable the host holds; no turn runs, so the fake URL is never called.
KEYED_AGENT = """
[[agents]]
name = "scout"
wake_on = ["push"]
[agents.backend]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "MCPLHOST_TEST_AGENT_KEY"
"""


class TestConnectorEnvironment:
    async def test_a_connector_sees_only_the_allowlist_and_what_is_its_own(self, tmp_path) -> None:
        """The host's api key, another connector's token and a stray secret are absent; basics and own vars present."""
        secrets = tmp_path / "envy.env"
        secrets.write_text("# envy's own\nENVY_TOKEN='from the file'\n", encoding="utf-8")
        secrets.chmod(0o600)
        envy = scripted_connector("envy", {"manifest": CHAT_MANIFEST, "record_env": True}, tmp_path,
                                  grant=CHAT_GRANT, env_file=str(secrets), env_pass=["MCPLHOST_TEST_PASSED"])
        envy["env"] = {**envy["env"], "ENVY_SETTING": "acme"}
        other = scripted_connector("other", {"manifest": CHAT_MANIFEST}, tmp_path, grant=CHAT_GRANT,
                                   env_pass=["OTHER_TOKEN"])
        config = write_config(tmp_path, [envy, other])
        config.write_text(config.read_text(encoding="utf-8") + KEYED_AGENT, encoding="utf-8")
        host_env = {"MCPLHOST_TEST_AGENT_KEY": "sk-agent-secret", "OTHER_TOKEN": "other-secret",
                    "MCPLHOST_TEST_STRAY": "stray", "MCPLHOST_TEST_PASSED": "passed", "TZ": "UTC", "LC_TIME": "C"}
        async with daemon(config, tmp_path, env=host_env) as run:
            await run.wait_event("connector.up", connector="envy")
            await wait_for(lambda: [e for e in record(tmp_path, "envy").events if e["kind"] == "start"])
        (start,) = [e for e in record(tmp_path, "envy").events if e["kind"] == "start"]
        env = start["env"]
        assert not {"MCPLHOST_TEST_AGENT_KEY", "OTHER_TOKEN", "MCPLHOST_TEST_STRAY", "NOTIFY_SOCKET"} & set(env)
        assert "sk-agent-secret" not in str(env) and "other-secret" not in str(env)
        assert env["ENVY_TOKEN"] == "from the file" and env["ENVY_SETTING"] == "acme"
        assert env["MCPLHOST_TEST_PASSED"] == "passed" and env["TZ"] == "UTC" and env["LC_TIME"] == "C"
        assert "PATH" in env and "HOME" in env
        assert "PYTHONPATH" in env  # the scripted connector's own env table
