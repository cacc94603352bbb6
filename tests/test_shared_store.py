"""Two hosts on one PostgreSQL store (docs/operations.md#several-hosts-on-one-store): one runs a connector both
are configured for, the other stands by and takes it over when the first stops."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec

from mcplhost.config import Config, HostConfig, StoreConfig
from mcplhost.control.wire import RestartRequest
from mcplhost.host import Host, open_host
from mcplhost.protocol.ports import SERVING

from .harness import running_host, scripted, wait_for
from .postgres import PostgresDatabase


def host_config(url: str, name: str, folder: Path) -> Config:
    """Host `name` on the database at `url`, configured for connector `chat`; its own files under folder/name."""
    state = folder / name
    state.mkdir()
    return Config(store=StoreConfig(url=url, state_dir=str(state)), host=HostConfig(name=name),
                  connectors=[scripted("chat", {}, state)])


def serving(host: Host) -> bool:
    return host.connectors["chat"].statistics().state in SERVING


async def test_the_standby_host_takes_the_connector_over_when_its_owner_stops(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    stop_a = anyio.Event()
    async with open_host(host_config(postgres_db.url, "a", tmp_path)) as a, anyio.create_task_group() as tg:
        tg.start_soon(a.run, stop_a)
        with anyio.fail_after(30):
            await a.ready.wait()
        await wait_for(lambda: serving(a))
        async with running_host(host_config(postgres_db.url, "b", tmp_path)) as b:  # ready: standby waits for none
            status = await b.control.status()
            (chat,) = status.connectors
            assert (chat.state, chat.pid, chat.owner) == ("standby", None, "a")
            assert b.connectors["chat"].statistics().pid is None  # no process started on B
            assert [(h.name, h.connectors) for h in status.hosts] == [("a", ["chat"]), ("b", [])]
            assert msgspec.json.decode(msgspec.json.encode(chat))["owner"] == "a"
            refused = await b.control.answer(RestartRequest(name="chat"))
            assert not refused.ok and refused.error == "'chat' is on standby here: host a runs it; restart it there"

            stop_a.set()  # A stops: its lock comes free
            await wait_for(lambda: serving(b), timeout=10)
            status = await b.control.status()
            (chat,) = status.connectors
            assert chat.state != "standby" and chat.pid is not None and chat.owner is None
            assert "owner" not in msgspec.json.decode(msgspec.json.encode(chat))
            assert [(h.name, h.connectors) for h in status.hosts] == [("b", ["chat"])]  # A said goodbye
