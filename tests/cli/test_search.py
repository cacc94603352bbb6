"""`mcplhost search`: newest hits first across pages, bounded memory, and timed-out expressions reported."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.readers import TIMED_OUT_IDS_KEPT, NewestHits, search_items
from mcplhost.store import NewItem, open_reader, open_store
from mcplhost.store.items import READ_PAGE_SIZE

from .support import cli

#: Matches "hello" at once, and backtracks past REGEX_TIMEOUT_S on a long run of a's with a b at its end.
SLOW_OR_HELLO = r"(a|aa)+$|hello"
SLOW_BODY = "a" * 60 + "b"


async def seed(db: Path, bodies: list[str]) -> None:
    """One item per body, ids 1.. in order, in channel disc:g1:room."""
    async with open_store(db) as store:
        await store.items.insert_many([
            NewItem(role="user", content=[{"type": "text", "text": body}],
                    metadata={"serverId": "disc", "channelId": "disc:g1:room"},
                    created_at=1_790_000_000_000 + n, participant="Alice")
            for n, body in enumerate(bodies)
        ])


def search(db: Path, *args: str):
    return cli("search", "--db", str(db), *args)


class TestResults:
    async def test_the_newest_hits_come_first_across_pages(self, tmp_path) -> None:
        """With more items than one read page, --limit keeps the newest matches, newest first."""
        bodies = [f"item {n} {'needle' if n % 7 == 0 else 'hay'}" for n in range(READ_PAGE_SIZE * 2 + 50)]
        await seed(tmp_path / "host.db", bodies)
        result = search(tmp_path / "host.db", "needle", "--json", "--limit", "5")
        assert result.returncode == 0, result.stderr
        hits = [json.loads(line) for line in result.stdout.splitlines()]
        newest = [n + 1 for n in range(len(bodies)) if n % 7 == 0][-5:][::-1]
        assert [hit["id"] for hit in hits] == newest
        assert hits[0]["snippet"] == bodies[newest[0] - 1] and hits[0]["channelId"] == "disc:g1:room"
        assert result.stderr == ""

    async def test_memory_stays_near_one_page_whatever_the_table_holds(self, tmp_path) -> None:
        """Searching 20 MB of bodies allocates a few pages' worth at most, not the table."""
        body = "x" * 1000
        await seed(tmp_path / "host.db", [body] * 20_000)
        async with open_reader(tmp_path / "host.db") as store:
            tracemalloc.start()
            try:
                found = await search_items(store, "needle")
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert found.hits == [] and found.searched == 20_000
        assert peak < 10_000_000, f"peak {peak} bytes"


class TestTimedOutExpressions:
    async def test_items_the_expression_timed_out_on_are_reported_not_dropped(self, tmp_path) -> None:
        """The hits are printed, and one stderr line counts and names the items the expression could not test."""
        await seed(tmp_path / "host.db", ["hello one", SLOW_BODY, "nothing", SLOW_BODY, "hello two"])
        result = search(tmp_path / "host.db", "--regex", SLOW_OR_HELLO)
        assert result.returncode == 0
        assert [line.split()[0] for line in result.stdout.splitlines()] == ["5", "1"]
        (warning,) = result.stderr.splitlines()
        assert warning.startswith("mcplhost: warning: the regular expression ran out of time")
        assert "on 2 of 5 items" in warning and "(ids 4, 2)" in warning

    async def test_a_timeout_older_than_a_full_window_of_hits_is_not_reported(self, tmp_path) -> None:
        """With --limit hits all newer than the slow item, nothing was left out, so nothing is said."""
        await seed(tmp_path / "host.db", [SLOW_BODY, "hello one", "hello two"])
        result = search(tmp_path / "host.db", "--regex", SLOW_OR_HELLO, "--limit", "2")
        assert result.returncode == 0 and result.stderr == ""
        assert [line.split()[0] for line in result.stdout.splitlines()] == ["3", "2"]


#: One scanned item: a hit, a miss or a timeout.
OUTCOMES = st.lists(st.sampled_from(["hit", "miss", "timeout"]), max_size=60)


class TestNewestHits:
    @given(OUTCOMES, st.integers(min_value=0, max_value=8))
    def test_the_window_matches_a_model_that_keeps_everything(self, outcomes: list[str], limit: int) -> None:
        """Hits are the newest `limit`; timeouts counted are exactly those newer than a full window's oldest hit."""
        window = NewestHits(limit)
        for item_id, outcome in enumerate(outcomes, start=1):
            if outcome == "hit":
                window.hit({"id": item_id})
            elif outcome == "miss":
                window.miss()
            else:
                window.timeout(item_id)
        result = window.result()
        hit_ids = [i for i, o in enumerate(outcomes, start=1) if o == "hit"]
        kept = hit_ids[max(0, len(hit_ids) - limit):] if limit else []
        if limit == 0:
            could_have_been = []
        else:
            oldest = kept[0] if len(kept) == limit else 0
            could_have_been = [i for i, o in enumerate(outcomes, start=1) if o == "timeout" and i > oldest]
        assert [hit["id"] for hit in result.hits] == kept[::-1]
        assert result.searched == len(outcomes)
        assert result.timed_out == len(could_have_been)
        assert result.timed_out_ids == could_have_been[::-1][:TIMED_OUT_IDS_KEPT]
