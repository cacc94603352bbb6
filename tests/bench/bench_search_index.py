"""The search index at a million items (docs/operations.md#searching): queries, the agent tool, index lag,
inbound with and without the indexer, the index's size, and a daemon building it.

Over the cached stores of tests/bench/search_corpus.py (ITEMS items of varied chat text, default
1,000,000; built once, ~15 minutes, then reused from /tmp):

- queries: `mcplhost search` for a present word, a phrase, an absent word, a case-insensitive word and a
  literal regular expression, each RUNS times through the command's main function in this process (its
  imports done, so the figure is the time beyond the command's own start-up, which is printed too), p50 and
  max; each query's hits are checked against the planted ids. Goal: <= 100 ms. The absent word again over the
  store without its index: the scan every search was before.
- tool: `history_search` through an agent's ToolBox call (what a model's tool call runs, marking included), for
  an agent that hears everything, one connector of five, and one channel of a hundred. Goal: < 1 s.
- lag: `mcplhost run` over a copy of the indexed store, a connector (paced_connector.py) sending LAG_RATE
  items/s, one per request; every PROBE_EVERY-th holds a unique word, and its ack time is recorded. This
  process, the outside checker, searches for each such word as soon as it is acked, until found: the time
  from the ack to found, and the rows above the index's mark then. Goal: found within 1 s.
- inbound: tests/bench/bench_inbound_path.py's two workloads through `mcplhost run`'s host, with the indexer and
  without it (patched out), in alternating rounds of one run; best of each. Goal: with >= 80% of without.
  ingest: the same comparison in process (Ingest and the group writer, one message per request, no connector
  process), less noisy on a shared machine.
- size: the index's pages (dbstat) against the bodies it holds (their text as searched, UTF-8) and the items table.
- build: `mcplhost run` (a subprocess, no connector) over a copy of the store without its index: seconds until
  `host.ready`, seconds to build, the daemon's RSS sampled meanwhile, and a search while it builds.

    .venv/bin/python tests/bench/bench_search_index.py [ITEMS] [queries|tool|lag|inbound|size|build ...]
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import structlog
from search_corpus import (  # beside this file: the script's folder is on sys.path
    ABSENT_WORD,
    COMMON_WORD,
    PHRASE,
    RARE_WORD,
    copy_of,
    corpus_store,
    indexed_store,
    planted_ids,
)

from mcplhost import cli, logs
from mcplhost.agents.model import ToolCall
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.config import AgentConfig
from mcplhost.store import open_reader, open_store
from mcplhost.store.readers import search_items
from mcplhost.store.search_index import index_text

HERE = Path(__file__).resolve().parent
ITEMS = 1_000_000
RUNS = 7
LAG_RATE = 1000
LAG_SECONDS = int(os.environ.get("LAG_SECONDS", "20"))
PROBE_EVERY = 250
INBOUND_ITEMS = 40_000
INBOUND_ROUNDS = 3
INGEST_ITEMS = 30_000
INGEST_ROUNDS = 5
IN_PROCESS_INFLIGHT = 256
#: (label, arguments of `mcplhost search` after the query, the query)
QUERIES = (
    ("present word", COMMON_WORD, ()),
    ("phrase", PHRASE, ()),
    ("absent word", ABSENT_WORD, ()),
    ("case-insensitive", RARE_WORD.upper(), ("-i",)),
    ("literal regex", r"harbour\s+lights", ("--regex",)),
)


def summary(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms, max {ordered[-1] * 1000:7.1f} ms"


def command(db: Path, query: str, *flags: str) -> float:
    """Seconds of `mcplhost search` as a process, start-up included."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mcplhost", "search", "--db", str(db), query, *flags],
                   capture_output=True, text=True, check=True)
    return time.perf_counter() - started


def in_process(db: Path, query: str, *flags: str) -> tuple[float, list[int]]:
    """Seconds of `mcplhost search` run by its main function in this process (imports done: the command's
    start-up left out), and the ids it printed."""
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli.main(["search", "--db", str(db), query, *flags])
    seconds = time.perf_counter() - started
    logs.configure(level="warning")  # the command configured its own
    assert code == 0
    return seconds, [int(line.split()[0]) for line in out.getvalue().splitlines()]


def expected_ids(label: str, items: int) -> list[int] | None:
    planted = planted_ids(items)
    return {"present word": planted[COMMON_WORD][::-1][:50], "case-insensitive": planted[RARE_WORD][::-1],
            "absent word": []}.get(label)


def check(label: str, ids: list[int], items: int) -> None:
    want = expected_ids(label, items)
    if want is not None:
        assert ids == want, (label, ids[:5], want[:5])
    elif label == "phrase":
        assert set(planted_ids(items)[PHRASE]) <= set(ids), label


def queries(items: int) -> None:
    db = indexed_store(items)
    with tempfile.TemporaryDirectory() as folder:
        empty = Path(folder) / "empty.db"
        anyio.run(migrated, empty)
        startup = [command(empty, ABSENT_WORD) for _ in range(3)]
        print(f"  `mcplhost search` as a process over an empty store (its start-up): {summary(startup)}")
    for label, query, flags in QUERIES:
        runs = [in_process(db, query, *flags) for _ in range(RUNS)]
        check(label, runs[0][1], items)
        print(f"  {label:>17}: {summary([seconds for seconds, _ in runs])} beyond start-up  ({len(runs[0][1])} hits;"
              f" {query!r} {' '.join(flags)})")
    seconds, _ = in_process(corpus_store(items), ABSENT_WORD, "--timeout", "300")
    print(f"  absent word over the same store without its index (every row scanned, as before): {seconds:.1f} s")


async def migrated(path: Path) -> None:
    async with open_store(path):
        pass


def tool(items: int) -> None:
    db = indexed_store(items)  # built (or reused) before the loop starts: building runs a loop of its own
    anyio.run(tool_calls_at, db)


async def tool_calls_at(db: str | Path) -> None:
    async with open_reader(db) as store:
        await tool_calls(store)


async def tool_calls(store: Any) -> None:
    """Time `history_search` tool calls over an open reader: three hears filters, four queries."""
    for hears in (None, ["slack"], ["discord/discord:g1:c3"]):
        box = ToolBox(AgentConfig(name="scout", hears=hears), {}, store)
        for label, query in (("present word", COMMON_WORD), ("phrase", PHRASE), ("absent word", ABSENT_WORD),
                             ("rare word", RARE_WORD)):
            times = []
            for n in range(RUNS):
                started = time.perf_counter()
                outcome = await box.call(ToolCall(id=f"c{n}", name="history_search",
                                                  arguments={"query": query, "limit": 20}))
                times.append(time.perf_counter() - started)
            hits = len(json.loads(outcome.blocks[0]["text"])["hits"])
            print(f"  hears {str(hears or 'everything'):<27} {label:>12}: {summary(times)}  ({hits} hits)",
                  flush=True)


def lag(items: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        db = copy_of(indexed_store(items), folder)
        acks = folder / "acks.jsonl"
        acks.touch()
        connector = {"name": "paced", "command": [sys.executable, str(HERE / "paced_connector.py")],
                     "grant": ["channels.register", "channels.incoming"], "request_timeout_s": 120,
                     "env": {"PACED_RATE": str(LAG_RATE), "PACED_SECONDS": str(LAG_SECONDS),
                             "PACED_PROBE_EVERY": str(PROBE_EVERY), "PACED_ACKS": str(acks)}}
        config = folder / "mcplhost.toml"
        config.write_text(f'[store]\npath = "{db}"\n\n[[connectors]]\n'
                          + "".join(f"{key} = {json.dumps(value)}\n" for key, value in connector.items()
                                    if key != "env")
                          + "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in connector["env"].items())
                          + " }\n")
        with open(folder / "run.log", "wb") as log:
            daemon = subprocess.Popen([sys.executable, "-m", "mcplhost", "run", "--config", str(config)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        found_after: list[float] = []
        behind: list[int] = []
        done: float | None = None
        try:
            anyio.run(_probe_acks, db, acks, found_after, behind)
            done = next(json.loads(line)["done"] for line in acks.read_text().splitlines() if '"done"' in line)
        finally:
            daemon.terminate()
            daemon.wait(60)
    print(f"  {LAG_RATE * LAG_SECONDS / done:,.0f} items/s stored through `mcplhost run`; a fresh item found by a search"
          f" in another process after its ack: {summary(found_after)} ({len(found_after)} probes)")
    print(f"  rows above the index's mark: p50 {statistics.median(behind):.0f}, max {max(behind)}")


async def _probe_acks(db: Path, acks: Path, found_after: list[float], behind: list[int]) -> None:
    """Search for each probe word as soon as its ack is recorded (this process is the outside checker), each
    in a task of its own, so one slow search does not delay the next probe; until the connector is done."""

    async def probe(ack: dict[str, Any]) -> None:
        async with open_reader(db) as store:
            while not (await search_items(store, ack["word"], limit=1)).hits:
                pass
            found_after.append(time.time() - ack["acked"])
            behind.append((await store.search_index.progress()).behind)

    seen = 0
    with anyio.fail_after(LAG_SECONDS * 10 + 120):
        async with anyio.create_task_group() as probes:
            while True:
                lines = acks.read_text().splitlines()
                fresh = [json.loads(line) for line in lines[seen:] if line.endswith("}")]
                seen += len(fresh)
                for ack in fresh:
                    if "done" in ack:
                        return  # the probes started finish before the task group ends
                    probes.start_soon(probe, ack)
                await anyio.sleep(0.01)


async def inbound(items: int) -> None:
    import bench_inbound_path as path

    import mcplhost.host

    async def no_indexer(*_: Any, **__: Any) -> None:
        await anyio.sleep_forever()

    real = mcplhost.host.run_indexer
    for label, connectors_count, batch, inflight in (
        ("batches of 50, 1 connector", 1, 50, 8),
        ("1 message per request, 4 connectors", 4, 1, 64),
    ):
        rates: dict[str, list[float]] = {"without": [], "with": []}
        for _ in range(INBOUND_ROUNDS):
            for variant in ("without", "with"):
                mcplhost.host.run_indexer = real if variant == "with" else no_indexer  # type: ignore[assignment]
                with tempfile.TemporaryDirectory() as name:
                    folder = Path(name)
                    per = INBOUND_ITEMS // connectors_count
                    specs = [path.connector(f"c{i}", folder, per, batch, inflight) for i in range(connectors_count)]
                    seconds, accepted = await path.run_host(folder, specs)
                    assert accepted == per * connectors_count
                    rates[variant].append(accepted / seconds)
        mcplhost.host.run_indexer = real  # type: ignore[assignment]
        best = {variant: max(values) for variant, values in rates.items()}
        print(f"  {label:>38}: with the indexer {best['with']:>8,.0f} items/s, without {best['without']:>8,.0f}"
              f" | ratio {best['with'] / best['without']:.0%}  (best of {INBOUND_ROUNDS} each, alternating;"
              f" with: {', '.join(f'{r:,.0f}' for r in rates['with'])}; without:"
              f" {', '.join(f'{r:,.0f}' for r in rates['without'])})")


async def ingest(items: int) -> None:
    """Inbound in this process (Ingest.store_messages, one message per request, IN_PROCESS_INFLIGHT at once, the
    group writer), with the indexer running beside it and without, alternating rounds: the daemon's own cost of
    the index without the connectors' processes and the wire."""
    from mcplhost.ingest import Ingest
    from mcplhost.protocol.intake import AdmittedMessage
    from mcplhost.speech.echoes import EchoMemory
    from mcplhost.store.search_index import run_indexer
    from mcplhost.store.writer import GroupWriter

    async def rate(indexer: bool) -> tuple[float, int]:
        with tempfile.TemporaryDirectory() as name:
            async with open_store(Path(name) / "host.db") as store, anyio.create_task_group() as tg:
                writer = GroupWriter(store)
                await tg.start(writer.run)
                if indexer:
                    tg.start_soon(run_indexer, store.search_index)
                intake = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox))
                sent = iter(range(INGEST_ITEMS))

                async def one_connector(lane: int) -> None:
                    for n in sent:
                        await intake.store_messages(f"c{lane % 4}", "channels/incoming", [AdmittedMessage(
                            channel_id="disc:g1:room", label="#room", message_id=f"m-{n}", participant="Alice",
                            content=[{"type": "text", "text": f"an ordinary chat message of an ordinary length {n}"}])])

                started = time.perf_counter()
                async with anyio.create_task_group() as senders:
                    for lane in range(IN_PROCESS_INFLIGHT):
                        senders.start_soon(one_connector, lane)
                seconds = time.perf_counter() - started
                behind = (await store.search_index.progress()).behind
                tg.cancel_scope.cancel()
        return INGEST_ITEMS / seconds, behind

    rates: dict[bool, list[float]] = {True: [], False: []}
    behind: list[int] = []
    for _ in range(INGEST_ROUNDS):
        for indexer in (False, True):
            value, left = await rate(indexer)
            rates[indexer].append(value)
            if indexer:
                behind.append(left)
    best = {indexer: max(values) for indexer, values in rates.items()}
    print(f"  in process, 1 message per request: with the indexer {best[True]:,.0f} items/s, without"
          f" {best[False]:,.0f} | ratio {best[True] / best[False]:.0%} (best of {INGEST_ROUNDS} each, alternating;"
          f" medians {statistics.median(rates[True]):,.0f} / {statistics.median(rates[False]):,.0f}); the index"
          f" {statistics.median(behind):,.0f} items behind when the flood ended")


def size(items: int) -> None:
    conn = sqlite3.connect(f"file:{indexed_store(items)}?mode=ro", uri=True)
    conn.create_function("body_text", 2, index_text, deterministic=True)
    pages = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat WHERE name LIKE 'items%' GROUP BY name"))
    index = sum(size for name, size in pages.items() if name.startswith("items_search"))
    ((bodies, content),) = conn.execute(
        "SELECT sum(length(CAST(body_text(content, metadata) AS BLOB))), sum(length(CAST(content AS BLOB)))"
        " FROM items")
    conn.close()
    print(f"  the index: {index / 1e6:.1f} MB; the bodies as searched: {bodies / 1e6:.1f} MB"
          f" -> {index / bodies:.2f} times their size")
    print(f"  (the content column, headers included: {content / 1e6:.1f} MB; the items table and its indexes:"
          f" {sum(s for n, s in pages.items() if not n.startswith('items_search')) / 1e6:.0f} MB)")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def build(items: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        db = copy_of(corpus_store(items), folder)
        config = folder / "mcplhost.toml"
        config.write_text(f'[store]\npath = "{db}"\n')
        log_path = folder / "run.log"
        started = time.perf_counter()
        with open(log_path, "wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "mcplhost", "run", "--config", str(config)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        samples: list[int] = []
        events: dict[str, float] = {}
        searched: str | None = None
        try:
            while "store.index_built" not in events:
                if process.poll() is not None:
                    raise RuntimeError(f"the daemon exited: {log_path.read_text()[-2000:]}")
                if "host.ready" in events:
                    samples.append(rss_kb(process.pid))
                for line in log_path.read_text().splitlines():
                    event = json.loads(line).get("event")
                    if event in ("host.ready", "store.index_building", "store.index_built") and event not in events:
                        events[event] = time.perf_counter() - started
                if searched is None and "host.ready" in events:
                    seconds, hits = in_process(db, RARE_WORD)
                    searched = f"{seconds * 1000:.0f} ms beyond start-up, {len(hits)} hits"
                time.sleep(0.5)
        finally:
            process.terminate()
            process.wait(30)
    print(f"  host.ready after {events.get('host.ready', 0):.1f} s; index built after"
          f" {events['store.index_built'] - events.get('store.index_building', 0):.0f} s of building")
    print(f"  daemon RSS while it builds: at host.ready {samples[0] / 1024:.0f} MB, p50 {statistics.median(samples) / 1024:.0f}"
          f" MB, max {max(samples) / 1024:.0f} MB ({len(samples)} samples)")
    print(f"  a search while it builds: {searched}")


PARTS = {"queries": queries, "tool": tool, "lag": lag, "inbound": inbound, "ingest": ingest, "size": size,
         "build": build}


def main() -> None:
    logs.configure(level="warning")
    args = sys.argv[1:]
    items = int(args.pop(0)) if args and args[0].isdigit() else ITEMS
    for part in args or list(PARTS):
        print(f"{part}:", flush=True)
        run = PARTS[part]
        if part in ("size", "queries", "build", "lag", "tool"):
            run(items)  # type: ignore[call-arg]
        else:
            anyio.run(functools.partial(run, items))  # type: ignore[arg-type]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
