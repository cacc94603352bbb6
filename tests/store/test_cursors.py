"""Tests for mcplhost/store/cursors.py and its operations: durable, forward-only cursors started at the store's end."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.store import Store, open_store
from mcplhost.store.operations import InsertItems, SetCursor, StartCursor

from ..properties import examples
from .conftest import make_item, submitted
from .test_writer import running, together

#: The repository root: the child process imports mcplhost from here.
REPO = Path(__file__).resolve().parents[2]


class TestSetCursor:
    async def test_an_agent_never_seen_has_no_cursor(self, store: Store):
        """get is None for an agent without a cursor, and all() is empty."""
        assert await store.cursors.get("scout") is None and await store.cursors.all() == {}

    async def test_set_then_read_per_agent(self, store: Store):
        """SetCursor stores each agent's position separately."""
        async with running(store) as writer:
            assert await submitted(writer, SetCursor("scout", 7, 1_000), SetCursor("other", 3, 1_000)) == [None, None]
        assert await store.cursors.get("scout") == 7 and await store.cursors.all() == {"scout": 7, "other": 3}

    async def test_a_cursor_never_moves_backwards(self, store: Store):
        """An older position written later (or in the same group) leaves the cursor at the newest one."""
        async with running(store) as writer:
            await writer.submit(SetCursor("scout", 10, 1_000))
            await writer.submit(SetCursor("scout", 4, 2_000))
            assert await store.cursors.get("scout") == 10
            await together(lambda: writer.submit(SetCursor("scout", 15, 3_000)),
                           lambda: writer.submit(SetCursor("scout", 12, 3_000)))
        assert await store.cursors.get("scout") == 15

    @settings(max_examples=examples(50), deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=2**62), min_size=1))
    def test_the_cursor_is_the_largest_position_written(self, positions: list[int]):
        """Whatever order positions are written in, one per commit, the cursor ends at their maximum."""
        async def scenario(path: Path) -> int | None:
            async with open_store(path) as store, running(store) as writer:
                for position in positions:
                    await writer.submit(SetCursor("scout", position, 0))
                return await store.cursors.get("scout")

        with tempfile.TemporaryDirectory() as folder:
            assert anyio.run(scenario, Path(folder) / "c.db") == max(positions)

    @pytest.mark.parametrize("agent, item_id", [("", 1), ("scout", -1)])
    def test_a_bad_cursor_is_refused_when_built(self, agent: str, item_id: int):
        """No agent name, or a negative item id, is a ValueError before anything is submitted."""
        with pytest.raises(ValueError):
            SetCursor(agent, item_id, 0)


class TestStartCursor:
    async def test_a_new_agent_starts_at_the_end_of_an_empty_store(self, store: Store):
        """With nothing stored, a new agent's cursor is 0, written at once."""
        async with running(store) as writer:
            assert await writer.write(StartCursor("scout", 1_000)) == 0
        assert await store.cursors.get("scout") == 0

    async def test_a_new_agent_starts_at_the_newest_item(self, store: Store):
        """A new agent's cursor is the id of the newest stored item (of any agent)."""
        ids = await store.items.insert_many([make_item("a"), make_item("b", agent="other")])
        async with running(store) as writer:
            assert await writer.write(StartCursor("scout", 1_000)) == ids[-1]
        assert await store.cursors.get("scout") == ids[-1]

    async def test_an_agent_with_a_cursor_keeps_it(self, store: Store):
        """StartCursor of an agent that has a cursor changes nothing and returns the stored one."""
        await store.items.insert_many([make_item("a"), make_item("b")])
        async with running(store) as writer:
            await writer.submit(SetCursor("scout", 1, 0))
            assert await writer.write(StartCursor("scout", 5)) == 1
        assert await store.cursors.get("scout") == 1

    async def test_items_of_the_same_write_come_before_the_cursor(self, store: Store):
        """Items submitted with StartCursor are committed first: the cursor is past them."""
        async with running(store) as writer:
            written, cursor = await submitted(writer, InsertItems([make_item("a"), make_item("b")]),
                                              StartCursor("scout", 0))
        assert cursor == written[-1].id

    async def test_several_new_agents_in_one_group(self, store: Store):
        """Each new agent of one group gets the same end; a repeat of one agent gets the same cursor."""
        (last,) = await store.items.insert_many([make_item("a")])
        async with running(store) as writer:
            assert await submitted(writer, StartCursor("a", 0), StartCursor("b", 0), StartCursor("a", 0)) == [last] * 3


class TestDurability:
    def test_a_cursor_committed_before_kill_9_is_there_after(self, tmp_path: Path):
        """A process that commits a cursor and is then killed -9 leaves the cursor on disk."""
        db = tmp_path / "state" / "host.db"
        child = textwrap.dedent(f"""
            import os, signal, anyio
            from mcplhost.store import open_store
            from mcplhost.store.operations import SetCursor
            from mcplhost.store.writer import GroupWriter

            async def main():
                async with open_store({str(db)!r}) as store, anyio.create_task_group() as tg:
                    writer = GroupWriter(store)
                    await tg.start(writer.run)
                    await writer.submit(SetCursor("scout", 42, 1))
                    os.kill(os.getpid(), signal.SIGKILL)

            anyio.run(main)
        """)
        result = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, timeout=60)
        assert result.returncode == -signal.SIGKILL, result.stderr

        async def read() -> int | None:
            async with open_store(db) as store:
                return await store.cursors.get("scout")

        assert anyio.run(read) == 42
