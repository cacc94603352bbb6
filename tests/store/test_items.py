"""Tests for mcplhost/store/items.py: insert, list with limit/channel/agent, the export line."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.store import ItemWritten, NewItem, Store, StoredItem, export_line, open_store
from mcplhost.store import items as items_module

from ..properties import examples
from .conftest import make_item

# docs/provenance.md §6, with its digests filled in.
EXPORTED_EXAMPLE = {
    "id": 1,
    "agent": None,
    "participant": "Alice",
    "role": "user",
    "content": [
        {"type": "text", "text": "[source: discord / discord:g1:room · #room]"},
        {"type": "text", "text": "hello"},
    ],
    "metadata": {
        "serverId": "discord",
        "channelId": "discord:g1:room",
        "messageId": "m-1",
        "threadId": None,
        "eventId": None,
        "featureSet": None,
        "tags": [],
        "source": {
            "kind": "channel",
            "lane": "channels/incoming",
            "serverId": "discord",
            "channelId": "discord:g1:room",
            "label": "#room",
            "acceptedAt": 1790000000000,
        },
        "sourceHeader": "[source: discord / discord:g1:room · #room]",
        "sourceBodyDigest": "0" * 64,
        "storedBodyDigest": "1" * 64,
        "adapter": {"mentions": ["@scout"]},
    },
    "createdAt": 1790000000000,
}


def first_texts(items: list[StoredItem]) -> list[str]:
    return [item.content[0]["text"] for item in items]


class TestInsertMany:
    async def test_round_trip(self, store: Store):
        """What goes in comes back with the same fields and the ids insert_many returned."""
        new = [make_item("a", agent="scout", participant=None, role="assistant"), make_item("b")]
        ids = await store.items.insert_many(new)
        stored = await store.items.list()
        assert [item.id for item in stored] == ids
        for item, original in zip(stored, new):
            assert (item.agent, item.participant, item.role) == (original.agent, original.participant, original.role)
            assert (item.content, item.metadata, item.created_at) == (original.content, original.metadata, original.created_at)

    async def test_ids_increase_across_batches(self, store: Store):
        """Each batch's ids follow the previous batch's, in insertion order."""
        first = await store.items.insert_many([make_item() for _ in range(3)])
        second = await store.items.insert_many([make_item() for _ in range(2)])
        assert first + second == list(range(first[0], first[0] + 5))
        assert await store.items.insert(make_item()) == second[-1] + 1

    async def test_empty_batch_stores_nothing(self, store: Store):
        """An empty batch returns no ids and opens no transaction."""
        assert await store.items.insert_many([]) == []
        assert await store.items.list() == []

    async def test_channel_columns_come_from_metadata(self, store: Store, db_path: Path):
        """server_id and channel_id are copied from metadata, null when absent."""
        await store.items.insert_many([make_item(), make_item(server=None, channel=None)])
        with sqlite3.connect(db_path) as conn:
            rows = conn.execute("SELECT server_id, channel_id FROM items ORDER BY id").fetchall()
        conn.close()
        assert rows == [("discord", "discord:g1:room"), (None, None)]

    async def test_json_is_stored_as_text(self, store: Store, db_path: Path):
        """Content and metadata are TEXT, so SQLite's JSON functions read them."""
        await store.items.insert_many([make_item("hi")])
        with sqlite3.connect(db_path) as conn:
            row = conn.execute(
                "SELECT typeof(content), json_extract(content, '$[0].text'), json_extract(metadata, '$.serverId') FROM items"
            ).fetchone()
        conn.close()
        assert row == ("text", "hi", "discord")


class TestList:
    async def test_oldest_first(self, store: Store):
        """Without options every item comes back, oldest first."""
        await store.items.insert_many([make_item(str(n)) for n in range(5)])
        assert first_texts(await store.items.list()) == ["0", "1", "2", "3", "4"]

    async def test_limit_gives_the_newest_oldest_first(self, store: Store):
        """limit N returns the newest N, still printed oldest first."""
        await store.items.insert_many([make_item(str(n)) for n in range(5)])
        assert first_texts(await store.items.list(limit=2)) == ["3", "4"]
        assert first_texts(await store.items.list(limit=9)) == ["0", "1", "2", "3", "4"]
        assert await store.items.list(limit=0) == []

    async def test_negative_limit_is_refused(self, store: Store):
        """A negative limit is a ValueError, not 'everything'."""
        with pytest.raises(ValueError):
            await store.items.list(limit=-1)

    async def test_channel_filter(self, store: Store):
        """channel selects items by their channel id."""
        await store.items.insert_many(
            [make_item("r1"), make_item("x", channel="discord:g1:other"), make_item("r2"), make_item("n", channel=None)]
        )
        assert first_texts(await store.items.list(channel="discord:g1:room")) == ["r1", "r2"]

    async def test_agent_filter(self, store: Store):
        """agent selects the rows belonging to that agent only."""
        await store.items.insert_many([make_item("all"), make_item("s", agent="scout"), make_item("l", agent="lead")])
        assert first_texts(await store.items.list(agent="scout")) == ["s"]

    async def test_filters_and_limit_combine(self, store: Store):
        """limit applies to the filtered items, not to all items."""
        await store.items.insert_many(
            [make_item("s1", agent="scout"), make_item("x"), make_item("s2", agent="scout"), make_item("y")]
        )
        assert first_texts(await store.items.list(agent="scout", channel="discord:g1:room", limit=1)) == ["s2"]

    async def test_pages_through_long_lists(self, store: Store):
        """More items than one read page come back complete and in order."""
        count = items_module.READ_PAGE_SIZE * 2 + 7
        await store.items.insert_many([make_item(str(n)) for n in range(count)])
        assert first_texts(await store.items.list()) == [str(n) for n in range(count)]
        assert first_texts(await store.items.list(limit=count - 3)) == [str(n) for n in range(3, count)]


class TestListAgainstAModel:
    @settings(max_examples=examples(40), deadline=None)
    @given(
        rows=st.lists(
            st.tuples(st.sampled_from([None, "c1", "c2"]), st.sampled_from([None, "scout", "lead"])), max_size=30
        ),
        channel=st.sampled_from([None, "c1", "c2", "c3"]),
        agent=st.sampled_from([None, "scout", "lead"]),
        limit=st.none() | st.integers(min_value=0, max_value=35),
    )
    def test_list_matches_filtering_a_python_list(self, rows, channel, agent, limit):
        """list(channel, agent, limit) equals filtering the inserted items in Python and keeping the last limit."""
        model = [
            (str(n), row_channel, row_agent)
            for n, (row_channel, row_agent) in enumerate(rows)
            if (channel is None or row_channel == channel) and (agent is None or row_agent == agent)
        ]
        expected = [text for text, _, _ in model]
        if limit is not None:
            expected = expected[max(0, len(expected) - limit) :] if limit else []

        async def run() -> list[str]:
            with tempfile.TemporaryDirectory() as folder:
                async with open_store(Path(folder) / "m.db") as store:
                    await store.items.insert_many(
                        [make_item(str(n), channel=c, agent=a) for n, (c, a) in enumerate(rows)]
                    )
                    return first_texts(await store.items.list(limit=limit, channel=channel, agent=agent))

        assert asyncio.run(run()) == expected


def keyed(text: str = "hello", *, message: str = "m-1", digest: str = "d" * 64, channel: str = "discord:g1:room",
          server: str = "discord", conversation: str = "conv_1", thread: str | None = None) -> NewItem:
    """A channel item carrying its redelivery key, as Ingest builds it."""
    item = make_item(text, server=server, channel=channel)
    return msgspec.structs.replace(item, metadata={**item.metadata, "messageId": message}, dedup_digest=digest,
                                   conversation_id=conversation, thread_id=thread)


async def row_count(store: Store) -> int:
    return len(await store.items.list())


class TestRedelivery:
    async def test_an_identical_redelivery_stores_nothing_and_names_the_original(self, store: Store):
        """The same (channel, message, server, digest) again is a duplicate carrying the original's id and conversation."""
        (first,) = await store.items.insert_many([keyed("first", conversation="conv_a")])
        async with store.transaction():
            (again,) = await store.items.insert_many_nocommit([keyed("again", conversation="conv_b")])
        assert (again.id, again.duplicate, again.conversation_id) == (first, True, "conv_a")
        assert first_texts(await store.items.list()) == ["first"]

    async def test_a_batch_holding_a_message_twice_stores_it_once(self, store: Store):
        """Two copies in one insert: the first is stored, the second is its duplicate, the rest are stored in order."""
        async with store.transaction():
            written = await store.items.insert_many_nocommit(
                [keyed("a"), make_item("plain"), keyed("a-again"), keyed("b", message="m-2")])
        assert [w.duplicate for w in written] == [False, False, True, False]
        assert written[2].id == written[0].id
        assert [w.id for w in written if not w.duplicate] == [item.id for item in await store.items.list()]
        assert first_texts(await store.items.list()) == ["a", "plain", "b"]

    async def test_an_edit_with_a_new_body_is_its_own_item(self, store: Store):
        """Same message id, a different delivered digest (chat:edited): a second row."""
        ids = await store.items.insert_many([keyed("v1", digest="1" * 64), keyed("v2", digest="2" * 64)])
        assert ids[0] != ids[1] and await row_count(store) == 2

    async def test_the_key_is_per_connector_and_channel(self, store: Store):
        """The same message id and body in another channel or from another connector is another item."""
        await store.items.insert_many([keyed(), keyed(channel="discord:g2:room"), keyed(server="zulip")])
        assert await row_count(store) == 3

    async def test_items_without_a_key_are_never_deduplicated(self, store: Store):
        """Rows with no dedup digest (pushes, local input, agents' rows) are all stored."""
        plain = msgspec.structs.replace(keyed(), dedup_digest=None)
        await store.items.insert_many([plain, plain, plain])
        assert await row_count(store) == 3

    async def test_thread_and_conversation_are_columns(self, store: Store):
        """thread_id is a column: thread_of reads it, not the JSON."""
        await store.items.insert_many([keyed(thread="topic-a")])
        assert await store.items.thread_of("discord", "discord:g1:room", "m-1") == "topic-a"

    async def test_ids_come_from_the_database_across_chunks(self, store: Store, monkeypatch: pytest.MonkeyPatch):
        """A batch split into several INSERT statements keeps order and the duplicate mapping across them."""
        monkeypatch.setattr(items_module, "ROWS_PER_INSERT", 2)
        async with store.transaction():
            written = await store.items.insert_many_nocommit(
                [keyed("a"), keyed("b", message="m-2"), keyed("a2"), make_item("c"), keyed("b2", message="m-2")])
        assert [w.duplicate for w in written] == [False, False, True, False, True]
        assert (written[2].id, written[4].id) == (written[0].id, written[1].id)
        assert first_texts(await store.items.list()) == ["a", "b", "c"]

    @settings(max_examples=examples(40), deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.sampled_from(["x", "y"]), st.booleans()),
                    max_size=25),
           st.integers(min_value=1, max_value=4))
    def test_batches_store_each_key_once_like_a_set(self, deliveries, batch):
        """Whatever the batching, each distinct key is stored once, first copy kept, every copy mapped to it."""
        async def run() -> tuple[list[ItemWritten], list[StoredItem]]:
            with tempfile.TemporaryDirectory() as folder:
                async with open_store(Path(folder) / "m.db") as store:
                    items = [keyed(f"{n}", message=m, digest=d * 64) if has_key
                             else msgspec.structs.replace(keyed(f"{n}"), dedup_digest=None)
                             for n, (m, d, has_key) in enumerate(deliveries)]
                    written: list[ItemWritten] = []
                    for start in range(0, len(items), batch):
                        async with store.transaction():
                            written += await store.items.insert_many_nocommit(items[start : start + batch])
                    return written, await store.items.list()

        written, stored = asyncio.run(run())
        first_of: dict[tuple[str, str], int] = {}
        expected_texts = []
        for n, (m, d, has_key) in enumerate(deliveries):
            if not has_key or (m, d) not in first_of:
                expected_texts.append(str(n))
                if has_key:
                    first_of[(m, d)] = n
        assert first_texts(stored) == expected_texts
        id_of_text = {item.content[0]["text"]: item.id for item in stored}
        for n, ((m, d, has_key), w) in enumerate(zip(deliveries, written)):
            original = str(first_of[(m, d)]) if has_key else str(n)
            assert w.id == id_of_text[original] and w.duplicate == (original != str(n))


class TestExport:
    async def test_export_line_is_the_documented_shape(self, store: Store):
        """A stored item exports exactly docs/provenance.md §6's keys, in its order, with nulls kept."""
        example = EXPORTED_EXAMPLE
        await store.items.insert_many(
            [
                NewItem(
                    role=example["role"],
                    content=example["content"],
                    metadata=example["metadata"],
                    created_at=example["createdAt"],
                    participant=example["participant"],
                )
            ]
        )
        (item,) = await store.items.list()
        line = export_line(item)
        assert b"\n" not in line
        decoded = json.loads(line)
        assert decoded == example
        assert list(decoded) == ["id", "agent", "participant", "role", "content", "metadata", "createdAt"]
        assert list(decoded["metadata"]) == list(example["metadata"])

    def test_export_decodes_back_into_a_stored_item(self):
        """The export line decodes back into the same StoredItem."""
        item = msgspec.json.decode(json.dumps(EXPORTED_EXAMPLE), type=StoredItem)
        assert item.created_at == EXPORTED_EXAMPLE["createdAt"]
        assert json.loads(export_line(item)) == EXPORTED_EXAMPLE


class TestAgentReads:
    async def test_last_id_is_the_newest_item_or_zero(self, store: Store):
        """last_id is 0 on an empty store, then the newest item's id whoever it belongs to."""
        assert await store.items.last_id() == 0
        ids = await store.items.insert_many([make_item("a"), make_item("b", agent="scout")])
        assert await store.items.last_id() == ids[-1]

    async def test_after_reads_past_a_cursor_younger_than_a_time(self, store: Store):
        """after(cursor, since_ms=T) is the items above the cursor created at or after T, oldest first, pageable."""
        ids = await store.items.insert_many([make_item(f"i{n}", created_at=1_000 * n) for n in range(6)])
        assert [i.id for i in await store.items.after(ids[1])] == ids[2:]
        assert [i.id for i in await store.items.after(0, since_ms=3_000)] == ids[3:]
        first_page = await store.items.after(ids[0], since_ms=2_000, limit=2)
        assert [i.id for i in first_page] == ids[2:4]
        assert [i.id for i in await store.items.after(first_page[-1].id, since_ms=2_000, limit=2)] == ids[4:]
        assert await store.items.after(ids[-1]) == [] and await store.items.after(0, limit=0) == []

    async def test_after_as_written_gives_back_the_new_items_with_their_columns(self, store: Store):
        """after_as_written returns (id, NewItem) equal to what was written, thread, conversation and key included."""
        threaded = msgspec.structs.replace(make_item("t", created_at=5), thread_id="topic", conversation_id="conv_1",
                                           dedup_digest="d" * 64)
        unscoped = make_item("push", server="disc", channel=None, created_at=6)
        old = make_item("old", created_at=1)
        ids = await store.items.insert_many([old, threaded, unscoped])
        assert await store.items.after_as_written(0, since_ms=5) == [(ids[1], threaded), (ids[2], unscoped)]
        assert await store.items.after_as_written(ids[0], limit=1) == [(ids[1], threaded)]

    async def test_context_rows_are_everyones_and_the_agents_own(self, store: Store):
        """context_rows(agent, limit) is the newest `limit` rows with no agent or this agent, oldest first."""
        owners = [None, "scout", "other", None, "other", "scout", None]
        ids = await store.items.insert_many([make_item(f"r{n}", agent=a) for n, a in enumerate(owners)])
        mine = [i for i, a in zip(ids, owners) if a in (None, "scout")]
        assert [r.id for r in await store.items.context_rows("scout", limit=100)] == mine
        assert [r.id for r in await store.items.context_rows("scout", limit=3)] == mine[-3:]
        assert [r.agent for r in await store.items.context_rows("other", limit=100)] == [None, "other", None,
                                                                                           "other", None]
        assert await store.items.context_rows("scout", limit=0) == []

    async def test_context_rows_of_one_conversation(self, store: Store):
        """With conversation_id, only that conversation's rows (everyone's and the agent's own) are returned."""
        rows = [("c1", None), ("c2", None), ("c1", "scout"), ("c1", "other"), (None, None), ("c1", None)]
        ids = await store.items.insert_many([msgspec.structs.replace(make_item(f"{n}", agent=agent),
                                                                     conversation_id=conversation)
                                             for n, (conversation, agent) in enumerate(rows)])
        got = await store.items.context_rows("scout", limit=10, conversation_id="c1")
        assert [r.id for r in got] == [ids[0], ids[2], ids[5]]
        assert [r.id for r in await store.items.context_rows("scout", limit=2, conversation_id="c1")] == ids[2::3]

    @settings(max_examples=examples(50), deadline=None)
    @given(st.lists(st.sampled_from([None, "a", "b"]), max_size=30), st.integers(min_value=0, max_value=40))
    def test_context_rows_agree_with_filtering_everything(self, owners: list[str | None], limit: int):
        """For any owners and limit, context_rows equals the last `limit` of all rows filtered to the agent's view."""
        async def scenario(path: Path) -> tuple[list[int], list[int]]:
            async with open_store(path) as opened:
                await opened.items.insert_many([make_item(str(n), agent=a) for n, a in enumerate(owners)])
                everything = [i.id for i in await opened.items.list() if i.agent in (None, "a")]
                got = [i.id for i in await opened.items.context_rows("a", limit=limit)]
                return got, everything[-limit:] if limit else []

        with tempfile.TemporaryDirectory() as folder:
            got, expected = asyncio.run(scenario(Path(folder) / "c.db"))
        assert got == expected

    async def test_get_many_returns_the_stored_ones_once_by_id(self, store: Store, monkeypatch: pytest.MonkeyPatch):
        """get_many gives each stored id once, ascending, leaving out unknown ids, across several queries."""
        monkeypatch.setattr(items_module, "IDS_PER_QUERY", 2)
        ids = await store.items.insert_many([make_item(f"g{n}") for n in range(5)])
        found = await store.items.get_many([ids[4], ids[0], 999, ids[2], ids[0]])
        assert [(i.id, i.content[0]["text"]) for i in found] == [(ids[0], "g0"), (ids[2], "g2"), (ids[4], "g4")]
        assert await store.items.get_many([]) == []
