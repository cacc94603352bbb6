"""Tests for mcplhost/store/turns.py and its operations: the turns ledger, its export line and the spend reads."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.store import OUTCOMES, Store, Turn, open_store, turn_line
from mcplhost.store import turns as turns_module
from mcplhost.store.migrate import default_folder, load_migrations
from mcplhost.store.operations import (
    BeginTurn,
    CloseUnfinishedTurns,
    FinishTurn,
    RecordTurn,
)
from mcplhost.store.turns import usage_record

from .conftest import make_item
from .test_writer import running, together

# README.md#commands: `mcplhost turns --json` prints these keys, in this order.
EXPORT_KEYS = ["id", "agent", "wakeItemIds", "startedAt", "endedAt", "outcome", "reason", "model", "usage", "requestDigest"]
DIGEST = "ab" * 32
HOUR_MS = 3_600_000


def finish(turn_id: int, *, outcome: str = "completed", usage: dict | None = None, ended_at: int = 2_000,
           model: str | None = "gpt-4o-mini", digest: str | None = DIGEST) -> FinishTurn:
    return FinishTurn(turn_id, ended_at, outcome, model, usage, digest)


class TestBeginAndFinish:
    async def test_a_begun_turn_is_running_with_nulls_for_what_it_lacks(self, store: Store):
        """BeginTurn gives a new id; the row exports with every key, end, outcome, model, usage and digest null."""
        async with running(store) as writer:
            turn_id = await writer.write(BeginTurn("scout", (3, 5), 1_000))
        (turn,) = await store.turns.list()
        line = json.loads(turn_line(turn))
        assert list(line) == EXPORT_KEYS
        assert line == {"id": turn_id, "agent": "scout", "wakeItemIds": [3, 5], "startedAt": 1_000, "endedAt": None,
                        "outcome": None, "reason": None, "model": None, "usage": None, "requestDigest": None}

    async def test_finishing_records_outcome_model_usage_and_digest(self, store: Store):
        """FinishTurn fills the row; the backends' snake_case usage is exported in camelCase."""
        async with running(store) as writer:
            turn_id = await writer.write(BeginTurn("scout", (7,), 1_000))
            usage = {"input_tokens": 120, "output_tokens": 30, "cached_tokens": 100}
            assert await writer.write(finish(turn_id, usage=usage)) is True
        turn = await store.turns.get(turn_id)
        assert turn == Turn(id=turn_id, agent="scout", wake_item_ids=[7], started_at=1_000, ended_at=2_000, reason=None,
                            outcome="completed", model="gpt-4o-mini",
                            usage={"inputTokens": 120, "outputTokens": 30, "cachedTokens": 100},
                            request_digest=DIGEST)

    async def test_hook_injections_are_kept_with_the_turn_but_not_exported(self, store: Store):
        """FinishTurn's injections are read back by turns.injections; the export line keeps README.md#commands's keys."""
        injections = {"system": ["be brief"], "before_user": [], "after_user": ["[hook] weather: rain"]}
        async with running(store) as writer:
            turn_id = await writer.write(BeginTurn("scout", (1,), 1_000))
            plain = await writer.write(BeginTurn("scout", (2,), 1_000))
            await writer.submit(FinishTurn(turn_id, 2_000, "completed", None, None, DIGEST, injections),
                                finish(plain))
        assert await store.turns.injections(turn_id) == injections
        assert await store.turns.injections(plain) is None and await store.turns.injections(999) is None
        assert all(list(json.loads(turn_line(t))) == EXPORT_KEYS for t in await store.turns.list())

    def test_injections_that_cannot_be_stored_are_refused_when_built(self):
        """An injections value with no JSON form is refused before it reaches a group commit."""
        with pytest.raises(TypeError):
            FinishTurn(1, 0, "completed", None, None, None, {"system": object()})

    async def test_a_turn_ends_once(self, store: Store):
        """A second FinishTurn of the same turn, or of an unknown one, changes nothing and reports False."""
        async with running(store) as writer:
            turn_id = await writer.write(BeginTurn("scout", (), 1_000))
            ends = finish(turn_id), finish(turn_id, outcome="failed"), finish(999)
            committed = await writer.submit(*ends)
            assert [committed[end] for end in ends] == [True, False, False]
            assert await writer.write(finish(turn_id, outcome="aborted")) is False
        turn = await store.turns.get(turn_id)
        assert turn is not None and turn.outcome == "completed"

    async def test_a_mistaken_finish_never_fails_the_writes_it_shares_a_commit_with(self, store: Store):
        """An unknown turn's FinishTurn in the same group as inbound items: the items are still stored."""
        async with running(store) as writer:
            stored, finished = await together(lambda: writer.store_items([make_item("inbound")]),
                                              lambda: writer.write(finish(12345)))
        assert finished is False and [i.id for i in await store.items.list()] == [stored[0].id]

    async def test_begin_and_finish_of_different_turns_share_a_group(self, store: Store):
        """Concurrent writes land in one commit; each BeginTurn gets its own id, in the order submitted."""
        async with running(store) as writer:
            first = await writer.write(BeginTurn("a", (1,), 1))
            b, end, c, d = BeginTurn("b", (2,), 2), finish(first), BeginTurn("c", (3,), 3), BeginTurn("d", (4,), 4)
            second, finished, both = await together(lambda: writer.write(b), lambda: writer.write(end),
                                                    lambda: writer.submit(c, d))
        third, fourth = both[c], both[d]
        assert finished is True and first < second and third < fourth
        by_id = {t.id: (t.agent, t.outcome) for t in await store.turns.list()}
        assert by_id == {first: ("a", "completed"), second: ("b", None), third: ("c", None), fourth: ("d", None)}

    @pytest.mark.parametrize("bad", [
        {"outcome": "done"}, {"digest": "AB" * 32}, {"digest": "ab"}, {"usage": {"input_tokens": -1}},
        {"usage": {"outputTokens": 1.5}}, {"usage": {"input_tokens": True}},
    ])
    def test_a_bad_value_is_refused_when_built(self, bad: dict):
        """An unknown outcome, a digest that is not 64 lowercase hex, or a bad token count is a ValueError at once."""
        with pytest.raises(ValueError):
            finish(1, **bad)

    def test_begin_needs_an_agent(self):
        """A turn without its agent's name is refused when built."""
        with pytest.raises(ValueError):
            BeginTurn("", (1,), 0)

    async def test_record_turn_writes_a_whole_turn(self, store: Store):
        """RecordTurn stores a turn begun and ended at once, e.g. a held wake with no model and no usage."""
        async with running(store) as writer:
            turn_id = await writer.write(RecordTurn("scout", (4, 9), 5_000, 5_000, "held"))
        turn = await store.turns.get(turn_id)
        assert turn is not None
        assert (turn.outcome, turn.started_at, turn.ended_at, turn.model, turn.usage) == ("held", 5_000, 5_000,
                                                                                          None, None)

    async def test_a_host_killed_mid_turn_leaves_a_row_closed_as_aborted_on_start(self, store: Store):
        """CloseUnfinishedTurns ends only turns still running, as aborted, and says how many."""
        async with running(store) as writer:
            done = await writer.write(BeginTurn("scout", (1,), 1_000))
            await writer.submit(finish(done))
            left = await writer.write(BeginTurn("scout", (2,), 3_000))
            assert await writer.write(CloseUnfinishedTurns(4_000)) == 1
            assert await writer.write(CloseUnfinishedTurns(5_000)) == 0
        outcomes = {t.id: (t.outcome, t.ended_at) for t in await store.turns.list()}
        assert outcomes == {done: ("completed", 2_000), left: ("aborted", 4_000)}

    async def test_the_ledger_survives_a_reopen(self, db_path: Path):
        """A finished turn is on disk: a new connection reads it back unchanged."""
        async with open_store(db_path) as store, running(store) as writer:
            turn_id = await writer.write(BeginTurn("scout", (1,), 1_000))
            await writer.submit(finish(turn_id, usage={"input_tokens": 1, "output_tokens": 2}))
            before = await store.turns.list()
        async with open_store(db_path) as store:
            assert await store.turns.list() == before


class TestSpendReads:
    async def test_usage_since_sums_input_and_output_tokens_of_one_agent(self, store: Store):
        """usage_since counts inputTokens + outputTokens of the agent's turns begun at or after the time."""
        async with running(store) as writer:
            for agent, started, usage in [("scout", 0, {"input_tokens": 1_000, "output_tokens": 1}),
                                          ("scout", HOUR_MS, {"input_tokens": 10, "output_tokens": 5,
                                                              "cached_tokens": 9_999}),
                                          ("scout", 2 * HOUR_MS, None),
                                          ("other", HOUR_MS, {"inputTokens": 7, "outputTokens": 7})]:
                turn_id = await writer.write(BeginTurn(agent, (), started))
                await writer.submit(finish(turn_id, usage=usage, ended_at=started + 1))
        assert await store.turns.usage_since("scout", HOUR_MS) == 15
        assert await store.turns.usage_since("scout", 0) == 1_016
        assert await store.turns.usage_since("other", 0) == 14
        assert await store.turns.usage_since("nobody", 0) == 0

    async def test_count_since_counts_turns_that_ran(self, store: Store):
        """count_since counts running and ended turns of the agent since the time; held wakes ran nothing."""
        async with running(store) as writer:
            await writer.submit(RecordTurn("scout", (), 0, 1, "completed"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS, HOUR_MS, "held"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS, HOUR_MS + 1, "failed"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS, HOUR_MS + 1, "aborted"))
            await writer.submit(BeginTurn("scout", (), HOUR_MS + 2))
            await writer.submit(RecordTurn("other", (), HOUR_MS, HOUR_MS, "completed"))
        assert await store.turns.count_since("scout", HOUR_MS) == 3
        assert await store.turns.count_since("scout", 0) == 4
        assert await store.turns.count_since("other", 0) == 1

    async def test_health_is_the_newest_failure_until_a_turn_completes(self, store: Store):
        """lastError: the newest completed-or-failed turn, when it failed, as "reason: cause"; aborted and held
        turns neither set nor clear it; failed turns counted from the time asked (docs/operations.md)."""
        async with running(store) as writer:
            assert (await store.turns.health("scout", 0)).last_error is None
            await writer.submit(RecordTurn("scout", (), 0, 1, "failed", reason="backend_error"))
            turn_id = await writer.write(BeginTurn("scout", (), HOUR_MS))
            await writer.submit(FinishTurn(turn_id, HOUR_MS + 1, "failed", None, None, None, reason="backend_error",
                                           cause="missing_key"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS + 2, HOUR_MS + 3, "aborted", reason="shutdown"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS + 4, HOUR_MS + 4, "held", reason="token_budget"))
            await writer.submit(RecordTurn("other", (), HOUR_MS, HOUR_MS + 1, "completed"))
            health = await store.turns.health("scout", HOUR_MS)
            assert (health.last_error, health.failed_since) == ("backend_error: missing_key", 1)
            assert (await store.turns.health("scout", 0)).failed_since == 2
            assert await store.turns.health("other", 0) == turns_module.TurnHealth(None, 0)
            await writer.submit(RecordTurn("scout", (), HOUR_MS + 5, HOUR_MS + 6, "completed"))
            assert (await store.turns.health("scout", HOUR_MS)).last_error is None
            assert (await store.turns.health("scout", HOUR_MS)).failed_since == 1

    async def test_outcome_counts_settle_below_the_oldest_running_turn(self, store: Store):
        """Counts above an id, split at the oldest running turn: what lies below it never changes again."""
        async with running(store) as writer:
            first = await writer.write(RecordTurn("scout", (), 0, 1, "completed"))
            running_id = await writer.write(BeginTurn("scout", (), 2))
            await writer.submit(RecordTurn("scout", (), 3, 4, "failed"), RecordTurn("lead", (), 3, 4, "failed"))
            counts = await store.turns.outcome_counts(0)
            assert counts.through == first and counts.settled == {("scout", "completed"): 1}
            assert counts.unsettled == {("scout", "failed"): 1, ("lead", "failed"): 1}
            await writer.submit(finish(running_id, outcome="aborted"))
            later = await store.turns.outcome_counts(counts.through)
            assert later.through == running_id + 2 and later.unsettled == {}
            assert later.settled == {("scout", "aborted"): 1, ("scout", "failed"): 1, ("lead", "failed"): 1}
            assert (await store.turns.outcome_counts(later.through)).settled == {}

    async def test_started_since_gives_the_start_times_count_since_counts(self, store: Store):
        """started_since lists the ran turns' start times since the time, oldest first; limit keeps the newest."""
        async with running(store) as writer:
            await writer.submit(RecordTurn("scout", (), 0, 1, "completed"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS + 5, HOUR_MS + 6, "failed"))
            await writer.submit(RecordTurn("scout", (), HOUR_MS, HOUR_MS, "held"))
            await writer.submit(BeginTurn("scout", (), HOUR_MS + 9))
            await writer.submit(RecordTurn("scout", (), HOUR_MS + 1, HOUR_MS + 2, "aborted"))
            await writer.submit(RecordTurn("other", (), HOUR_MS, HOUR_MS, "completed"))
        assert await store.turns.started_since("scout", HOUR_MS) == [HOUR_MS + 1, HOUR_MS + 5, HOUR_MS + 9]
        assert len(await store.turns.started_since("scout", HOUR_MS)) == await store.turns.count_since(
            "scout", HOUR_MS)
        assert await store.turns.started_since("scout", 0, limit=2) == [HOUR_MS + 5, HOUR_MS + 9]
        assert await store.turns.started_since("scout", 0, limit=0) == []
        assert await store.turns.started_since("nobody", 0) == []
        with pytest.raises(ValueError, match="limit"):
            await store.turns.started_since("scout", 0, limit=-1)


class TestList:
    async def test_limit_gives_the_newest_oldest_first_and_agent_filters(self, store: Store):
        """list(limit=N) is the newest N turns in id order; agent= keeps one agent's turns."""
        async with running(store) as writer:
            ids = [await writer.write(BeginTurn("a" if n % 2 else "b", (n,), n)) for n in range(6)]
        assert [t.id for t in await store.turns.list()] == ids
        assert [t.id for t in await store.turns.list(limit=2)] == ids[-2:]
        assert [t.id for t in await store.turns.list(agent="a")] == ids[1::2]
        assert [t.id for t in await store.turns.list(agent="a", limit=2)] == ids[3::2]
        assert await store.turns.list(limit=0) == [] and await store.turns.list(agent="nobody") == []
        with pytest.raises(ValueError):
            await store.turns.list(limit=-1)

    async def test_iterate_pages_through_a_long_ledger(self, store: Store, monkeypatch: pytest.MonkeyPatch):
        """Reading more turns than a page returns each exactly once, in order."""
        monkeypatch.setattr(turns_module, "READ_PAGE_SIZE", 3)
        async with running(store) as writer:
            begins = [BeginTurn("a", (n,), n) for n in range(10)]
            committed = await writer.submit(*begins)
            ids = [committed[begin] for begin in begins]
        assert [t.id async for t in store.turns.iterate()] == ids
        assert [t.wake_item_ids for t in await store.turns.list(limit=7)] == [[n] for n in range(3, 10)]

    async def test_many_turns_begun_in_one_group_span_insert_chunks(self, store: Store,
                                                                    monkeypatch: pytest.MonkeyPatch):
        """More BeginTurns than one INSERT holds still get ids in the order they were submitted."""
        monkeypatch.setattr(turns_module, "TURNS_PER_INSERT", 4)
        async with running(store) as writer:
            begins = [BeginTurn(f"a{n}", (n,), n) for n in range(11)]
            committed = await writer.submit(*begins)
            ids = [committed[begin] for begin in begins]
        assert ids == sorted(ids) and len(set(ids)) == 11
        assert [(t.id, t.agent) for t in await store.turns.list()] == [(i, f"a{n}") for n, i in enumerate(ids)]


class TestUsageRecord:
    @given(st.dictionaries(st.sampled_from(["input_tokens", "output_tokens", "cached_tokens"]),
                           st.integers(min_value=0, max_value=2**53)))
    def test_snake_and_camel_spellings_are_one_record(self, usage: dict):
        """A usage dict and its camelCase spelling normalise to the same record, whose spend is input + output."""
        camel = {turns_module.USAGE_KEYS[k]: v for k, v in usage.items()}
        record = usage_record(usage)
        assert record == usage_record(camel) == camel
        end = turns_module.TurnEnd(1, 0, "completed", usage=usage)
        assert end.tokens == usage.get("input_tokens", 0) + usage.get("output_tokens", 0)

    def test_unknown_keys_are_kept(self):
        """A backend's extra usage detail is recorded as given."""
        assert usage_record({"input_tokens": 1, "reasoning": 4}) == {"inputTokens": 1, "reasoning": 4}


class TestMigration0003:
    async def test_a_version_2_database_gains_the_ledger_and_keeps_its_items(self, tmp_path: Path):
        """Migrating a database made by 0001-0002 adds turns and agent_cursors and touches no item."""
        folder = tmp_path / "v2"
        folder.mkdir()
        for name in ("0001_initial.sql", "0002_idempotent_items.sql"):
            shutil.copy(Path(str(default_folder())) / name, folder / name)
        db = tmp_path / "old.db"
        async with open_store(db, migrations_folder=folder) as store:
            await store.items.insert_many([make_item("kept")])
        async with open_store(db) as store:
            assert [i.content[0]["text"] for i in await store.items.list()] == ["kept"]
            assert await store.turns.list() == [] and await store.cursors.all() == {}
        with sqlite3.connect(db) as conn:
            versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")]
        conn.close()
        assert versions == [m.version for m in load_migrations()]


def test_outcomes_are_the_four_of_agents_md():
    """The ledger's outcomes are exactly docs/agents.md#turns's."""
    assert OUTCOMES == ("completed", "failed", "aborted", "held")

