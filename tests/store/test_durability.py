"""Crash durability: a committed item survives `kill -9` of the process that wrote it."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import anyio

from mcplhost.store import open_store

# Opens the store with the default synchronous level, commits one item, says
# so, then blocks with the connection still open until it is killed.
CHILD = """
import asyncio, sys, time
from mcplhost.store import NewItem, open_store

async def main(path):
    async with open_store(path) as store:
        (item_id,) = await store.items.insert_many([NewItem(
            role="user", content=[{"type": "text", "text": "survives"}],
            metadata={"serverId": "discord", "channelId": "discord:g1:room"}, created_at=1,
        )])
        print(f"committed {item_id}", flush=True)
        time.sleep(3600)

asyncio.run(main(sys.argv[1]))
"""


class TestCrashDurability:
    async def test_committed_item_survives_sigkill(self, tmp_path: Path):
        """An item committed under the default level is there after the writer is SIGKILLed."""
        db_path = tmp_path / "mcplhost.db"
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(script), str(db_path), stdout=asyncio.subprocess.PIPE
        )
        try:
            with anyio.fail_after(60):
                line = b""
                while not line.startswith(b"committed "):  # structlog may print its own lines first
                    line = await child.stdout.readline()
                    assert line, "child exited before committing"
            item_id = int(line.split()[1])
            # The commit sits in the WAL, not yet checkpointed into the main file.
            assert Path(f"{db_path}-wal").stat().st_size > 0
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
        assert child.returncode == -signal.SIGKILL

        async with open_store(db_path) as store:
            (item,) = await store.items.list()
        assert (item.id, item.content) == (item_id, [{"type": "text", "text": "survives"}])
