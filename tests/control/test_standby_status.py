"""A connector on standby in what a host tells systemd and a person (docs/operations.md#several-hosts-on-one-store):
STATUS= counts it as standby, not starting, and the plain `status` table names the host that runs it."""

from __future__ import annotations

from pathlib import Path

import anyio

from mcplhost.config import Config, HostConfig, StoreConfig
from mcplhost.control.status import render_table
from mcplhost.host import open_host

from ..harness import running_host, scripted, wait_for
from ..postgres import PostgresDatabase
from .test_notify import Recording


def host_config(url: str, name: str, folder: Path) -> Config:
    """Host `name` on `url`, configured for connector `chat`; its own files under folder/name."""
    state = folder / name
    state.mkdir()
    return Config(store=StoreConfig(url=url, state_dir=str(state)), host=HostConfig(name=name),
                  connectors=[scripted("chat", {}, state)])


async def test_the_standby_host_says_standby_to_systemd_and_names_the_owner_in_its_table(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    async with running_host(host_config(postgres_db.url, "a", tmp_path)) as a:
        await wait_for(lambda: a.sharing is not None and a.sharing.owned == ["chat"])
        notifier = Recording()
        stop = anyio.Event()
        async with (open_host(host_config(postgres_db.url, "b", tmp_path), notifier=notifier) as b,
                    anyio.create_task_group() as tg):
            tg.start_soon(b.run, stop)
            await wait_for(lambda: "STATUS=1 connector: 1 standby" in notifier.sent)
            lines = render_table(await b.control.status())
            stop.set()
        (row,) = [line for line in lines if line.startswith("chat ")]
        assert row.split()[1:3] == ["standby", "(a)"]
    assert not any("starting" in sent for sent in notifier.sent if sent.startswith("STATUS="))
