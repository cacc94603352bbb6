"""`mcplhost search`: newest hits first across pages, bounded memory, timed-out expressions reported, the
filters, and a store from before the search index served at once and indexed in the background."""

from __future__ import annotations

import functools
import json
import signal
import threading
import tracemalloc
from pathlib import Path

import anyio
import regex
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.store import NewItem, StoredItem, open_reader, open_store, readers
from mcplhost.store.db import SCAN_WORKERS
from mcplhost.store.items import READ_PAGE_SIZE
from mcplhost.store.readers import REGEX_TIMEOUT_S, TIMED_OUT_IDS_KEPT, compile_query, scan, search_items

from ..builders import incoming, message, register
from ..harness import CHAT_GRANT, CHAT_MANIFEST, record, wait_for
from .support import cli, daemon, scripted_connector, write_config

#: Matches "hello" at once, and backtracks past REGEX_TIMEOUT_S on a long run of a's with a b at its end.
SLOW_OR_HELLO = r"(a|aa)+$|hello"
SLOW_BODY = "a" * 60 + "b"


async def seed(db: Path, bodies: list[str], *, migrations_folder: Path | None = None,
               channels: tuple[str, ...] = ("disc:g1:room",)) -> None:
    """One item per body, ids 1.. in order, created a minute apart, in the channels in turn."""
    async with open_store(db, migrations_folder=migrations_folder) as store:
        await store.items.insert_many([
            NewItem(role="user", content=[{"type": "text", "text": body}],
                    metadata={"serverId": "disc", "channelId": channels[n % len(channels)]},
                    created_at=1_790_000_000_000 + n * 60_000, participant="Alice")
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
                found = await search_items(store, "needle", deadline_s=3600)  # under tracemalloc, a slow walk
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert found.hits == [] and found.searched == 20_000
        assert peak < 10_000_000, f"peak {peak} bytes"


    async def test_the_search_reads_newest_first_and_stops_at_the_limit(self, tmp_path) -> None:
        """When every item matches, finding the newest 5 tests 5 items, not the table."""
        await seed(tmp_path / "host.db", [f"needle {n}" for n in range(READ_PAGE_SIZE * 3)])
        async with open_reader(tmp_path / "host.db") as store:
            found = await search_items(store, "needle", limit=5)
        assert [hit["id"] for hit in found.hits] == list(range(READ_PAGE_SIZE * 3, READ_PAGE_SIZE * 3 - 5, -1))
        assert found.searched == 5 and not found.stopped_early


class TestFilters:
    async def test_channel_and_since_narrow_the_hits(self, tmp_path) -> None:
        """--channel keeps one channel id, --since the items created at or after the time (epoch ms here)."""
        await seed(tmp_path / "host.db", [f"needle {n}" for n in range(6)], channels=("disc:g1:a", "disc:g1:b"))
        by_channel = search(tmp_path / "host.db", "needle", "--channel", "disc:g1:b")
        since = search(tmp_path / "host.db", "needle", "--since", str(1_790_000_000_000 + 4 * 60_000))
        assert [line.split()[0] for line in by_channel.stdout.splitlines()] == ["6", "4", "2"]
        assert [line.split()[0] for line in since.stdout.splitlines()] == ["6", "5"]


class TestTheDeadline:
    async def test_a_search_cut_short_prints_its_hits_and_one_warning_and_exits_0(self, tmp_path) -> None:
        """--timeout ends the search with what it found; stderr says where it stopped."""
        await seed(tmp_path / "host.db", ["hello old", *[SLOW_BODY] * 20, "hello new"])
        # 2 s: four REGEX_TIMEOUT_S, of the twenty slow bodies' 10 s. How many bodies time out before the deadline
        # depends on the machine's load (the regex module's 0.5 s ran 1.4 s at load 7, and a body the deadline
        # cuts is not counted as timed out), so the timed-out line, said before the stop, may be missing; which
        # bodies time out is tested on a fake clock (TestScan) and in TestTimedOutExpressions.
        result = search(tmp_path / "host.db", "--regex", SLOW_OR_HELLO, "--timeout", "2")
        assert result.returncode == 0, result.stderr
        assert [line.split()[0] for line in result.stdout.splitlines()] == ["22"]
        *timed_out, stopped = result.stderr.splitlines()
        assert all(line.startswith("mcplhost: warning: the regular expression ran out of time") for line in timed_out)
        assert len(timed_out) <= 1, result.stderr
        assert stopped.startswith("mcplhost: warning: the search stopped after 2 s with 1 hits; items older than id")

    async def test_a_search_that_finds_no_free_worker_within_its_deadline_says_it_searched_nothing(
            self, tmp_path) -> None:
        """SCAN_WORKERS searches at once; one more waits for a slot only until its deadline."""
        await seed(tmp_path / "host.db", [SLOW_BODY] * 40)
        async with open_store(tmp_path / "host.db") as store, anyio.create_task_group() as busy:
            for _ in range(SCAN_WORKERS):
                busy.start_soon(functools.partial(search_items, store, SLOW_OR_HELLO, as_regex=True, deadline_s=60))
            await wait_for(lambda: store.reader is not None and store.reader.scan_slots.value == 0)
            started = anyio.current_time()
            found = await search_items(store, "hello", deadline_s=0.5)
            took = anyio.current_time() - started
            busy.cancel_scope.cancel()
        assert found.stopped_early and found.searched == 0 and found.oldest_searched is None
        assert took >= 0.5, took  # and it gave up: the busy searches hold their slots for up to 60 s

    def test_a_timeout_that_is_not_seconds_is_a_usage_error(self, tmp_path) -> None:
        result = search(tmp_path / "host.db", "x", "--timeout", "soon")
        assert result.returncode == 2 and "--timeout" in result.stderr


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


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedPattern:
    """A pattern whose search of a body "<cost> hit|miss" takes `cost` seconds on the clock, as `regex` would time out."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def search(self, text: str, timeout: float) -> regex.Match[str] | None:
        cost, outcome = text.split()
        if float(cost) > timeout:
            self.clock.now += timeout
            raise TimeoutError("regular expression timed out")
        self.clock.now += float(cost)
        return regex.search("hit", text) if outcome == "hit" else None


def costed_items(outcomes: list[tuple[bool, float, bool]]) -> list[StoredItem]:
    """Items newest first (ids descending) whose bodies CostedPattern reads; the flag: whether `where` takes it."""
    return [StoredItem(id=len(outcomes) - n, agent=None, participant="Alice", role="user",
                       content=[{"type": "text", "text": f"{cost} {'hit' if hit else 'miss'}"}],
                       metadata={"heard": heard}, created_at=0)
            for n, (hit, cost, heard) in enumerate(outcomes)]


#: One item: whether it matches, what testing it costs (seconds), whether the caller's `where` takes it.
ITEMS = st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.1, 0.4, 0.6, 3.0]), st.booleans()), max_size=40)


class TestScan:
    @given(ITEMS, st.integers(min_value=0, max_value=6), st.sampled_from([0.5, 1.0, 2.5, 100.0]))
    def test_scan_matches_a_model_of_newest_first_with_one_deadline(
            self, outcomes: list[tuple[bool, float, bool]], limit: int, deadline: float) -> None:
        """Hits newest first, stop at `limit`; every timeout met is reported; the deadline ends it, reported."""
        clock = FakeClock()
        result = scan(costed_items(outcomes), CostedPattern(clock), limit, deadline=deadline, stop=threading.Event(),
                      where=lambda item: item.metadata["heard"], clock=clock)
        now, hits, timed_out, searched, stopped = 0.0, [], [], 0, False
        for position, (hit, cost, heard) in enumerate(outcomes):
            item_id = len(outcomes) - position
            if len(hits) >= limit:
                break
            if now >= deadline:
                stopped = True
                break
            if not heard:
                continue
            allowed = min(REGEX_TIMEOUT_S, deadline - now)
            if cost > allowed:
                now += allowed
                if now >= deadline:
                    stopped = True
                    break
                timed_out.append(item_id)
            else:
                now += cost
                if hit:
                    hits.append(item_id)
            searched += 1
        assert [h["id"] for h in result.hits] == hits
        assert result.hits == sorted(result.hits, key=lambda h: -h["id"]) and len(result.hits) <= limit
        assert (result.searched, result.timed_out, result.stopped_early) == (searched, len(timed_out), stopped)
        assert result.timed_out_ids == timed_out[:TIMED_OUT_IDS_KEPT]
        assert clock.now <= deadline  # no match ever ran past the one deadline

    def test_an_item_the_engine_gives_up_on_for_memory_is_counted_like_a_timeout(self, monkeypatch) -> None:
        """A fuzzy group repeated makes `regex` raise MemoryError on a short body after ~0.3-0.6 GB and about a second
        here (a faster machine gets there inside the 0.5 s per item): that item is left out and counted, and the
        search goes on. The time per item is lifted so the give-up, not the timeout, comes first on any machine."""
        monkeypatch.setattr(readers, "REGEX_TIMEOUT_S", 60.0)
        pattern = compile_query("(?>(?:é{i<=1,d<=1})+)", as_regex=True, ignore_case=False)
        items = [StoredItem(id=item_id, agent=None, participant="Alice", role="user",
                            content=[{"type": "text", "text": body}], metadata={}, created_at=0)
                 for item_id, body in ((3, "éa"), (2, "ab" * 36), (1, "é"))]
        result = scan(items, pattern, 10, deadline=float("inf"), stop=threading.Event())
        assert [hit["id"] for hit in result.hits] == [3, 1]
        assert (result.searched, result.timed_out, result.timed_out_ids, result.stopped_early) == (3, 1, [2], False)

    def test_a_set_stop_flag_ends_the_scan_before_the_next_item(self) -> None:
        """The flag a cancelled caller sets is checked between rows."""
        stop = threading.Event()
        tested: list[int] = []

        def where(item: StoredItem) -> bool:
            tested.append(item.id)
            stop.set()
            return True

        clock = FakeClock()
        scan(costed_items([(False, 0.0, True)] * 5), CostedPattern(clock), 5, deadline=10, stop=stop, where=where,
             clock=clock)
        assert tested == [5]


#: Items of the previous release's store: enough that the indexer logs its build (INDEX_BUILD_LOG_ROWS).
BACKLOG = 12_000


class TestAStoreFromThePreviousRelease:
    async def test_run_serves_it_at_once_and_indexes_it_in_the_background(self, tmp_path) -> None:
        """A store the migrations before the search index's made, with items: `run` migrates it without indexing, serves the
        connector (host.ready) before the indexer starts, and builds the index in the background; a search
        beside it, wherever the build has got to, finds the fresh item and the old ones."""
        from mcplhost.store.search_index import INDEX_BUILD_LOG_ROWS

        from ..store.test_search_index import previous_release

        assert BACKLOG >= INDEX_BUILD_LOG_ROWS
        previous = tmp_path / "previous-release"
        previous.mkdir()
        for migration in previous_release():
            (previous / f"{migration.version:04d}_{migration.name}.sql").write_text(migration.sql)
        db = tmp_path / "host.db"
        await seed(db, [f"{'old needle' if n % 1000 == 0 else 'hay'} {n}" for n in range(BACKLOG)],
                   migrations_folder=previous)
        steps = [register("disc:g1:room"), incoming(message("disc:g1:room", "m-1", "a fresh needle"))]
        config = write_config(tmp_path, [scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps},
                                                            tmp_path, grant=CHAT_GRANT)])
        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: record(tmp_path, "disc").done)  # the fresh item was acknowledged: committed
            found = search(db, "needle", "--json")
            await run.wait_event("store.index_built", timeout=60)
            during = [e["event"] for e in run.lines()
                      if e.get("event") in ("store.migration_applied", "host.ready", "store.index_building")]
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        # The migrations since that release (the search index's and any later one), then ready, then the build.
        ready = during.index("host.ready")
        assert set(during[:ready]) == {"store.migration_applied"} and during[ready:] == ["host.ready",
                                                                                        "store.index_building"]
        assert run.events("store.index_building")[0]["behind"] >= BACKLOG
        hits = [json.loads(line) for line in found.stdout.splitlines()]
        assert hits[0]["snippet"] == "a fresh needle"
        assert [hit["id"] for hit in hits[1:]] == list(range(BACKLOG - 999, 0, -1000))
