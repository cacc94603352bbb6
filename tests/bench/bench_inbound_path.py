"""The whole inbound path, connector to committed row, through real subprocesses.

Two workloads, each as items/s and as a ratio to a plain batched SQLite
insert of the same rows (sqlite3 executemany, 50 rows per transaction,
same schema and pragmas) measured in the same run:

- batches of 50 messages per channels/incoming request, one connector;
- one message per request, from 4 connectors at once (commits grouped
  across concurrent requests; each item is still acknowledged only after
  its commit).

Goals (README.md#performance): >= 20,000 items/s and >= 25% of the plain-insert rate in
batches of 50; >= 5,000 items/s for one message per request. Each ratio is
also printed per CPU second of this process, which a loaded machine
disturbs least (the host's start and stop count against it).

Then reads beside the writes, over a store already holding SEEDED items:
the one-message-per-request workload again, alone and with a task reading
a turn's context for a quiet conversation (context_rows, CONTEXT_ROWS rows,
context_scope "conversation") every READ_INTERVAL_S. Each with and without the
conversation index (migration 0005, dropped for "no index"), and with reads
through the StoreReader or, as before it, through the writer's connection
and lock (`open_store(reader_connections=0)`), all in the same run.

Then, with `watchdog`, the watchdog's cost: the first two workloads again, in
alternating rounds without and with WATCHDOG_USEC set (WATCHDOG=1 datagrams
to a real notify socket every WATCHDOG_BENCH_USEC / 2, far more often than
the shipped unit's WatchdogSec=30 asks), printing the ratio of the median
rates and, as the noise to read it against, the spread of the rounds without.

    .venv/bin/python tests/bench/bench_inbound_path.py [ITEMS] [reads|watchdog|quotas]   # one of those parts alone

Quotas (docs/operations.md#quotas): the one-message-per-request workload
with the per-connector quota check (the default quotas, counted in memory
and written in each commit) and without it (ingest patched back to storing
unchecked and uncounted, as before quotas), interleaved, as a ratio in one run.

    .venv/bin/python tests/bench/bench_inbound_path.py [ITEMS] quotas   # only the quota check's cost

Secrets (docs/agents.md#secrets): both workloads with no secret and with 4
configured, alternating rounds, as a ratio of the best rates in one run.

    .venv/bin/python tests/bench/bench_inbound_path.py [ITEMS] secrets

Explain (docs/agents.md#explain): the in-process workload with no agent, with
an agent that hears everything and wakes on nothing (what explain recomputes
later costs the inbound path nothing), and with an agent whose per-sender
cap refuses every item but the first (one decision recorded for each, in the
background), interleaved, as ratios to no agent in one run.

    .venv/bin/python tests/bench/bench_inbound_path.py [ITEMS] explain
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import anyio
import msgspec
import structlog

import mcplhost.host
from mcplhost import logs
from mcplhost.agents.turns.runner import CONTEXT_ROWS
from mcplhost.config import AgentConfig, BackendConfig, Config, ConnectorConfig, RestartConfig, StoreConfig
from mcplhost.host import Host
from mcplhost.ingest import Ingest
from mcplhost.ingest.connector_quotas import ConnectorQuota
from mcplhost.ingest.quotas import QuotaLimits, QuotaWindow
from mcplhost.store import body_bytes, open_store
from mcplhost.systemd import Notifier, watchdog_interval_s

HERE = Path(__file__).resolve().parent
#: Runs per workload; the best host rate and the best plain rate are compared.
ROUNDS = 2
#: Items stored before a run with reads; the quiet conversation's are the oldest QUIET of them.
SEEDED = 200_000
QUIET = 1000
QUIET_CONVERSATION = "conv-quiet"
#: One context read starts this often (a turn every 50 ms), or as soon as the last ended when reads are slower.
READ_INTERVAL_S = 0.05
#: Rounds of the workloads beside reads, each round running every variant once.
READ_ROUNDS = 3
#: The watchdog part's WATCHDOG_USEC: a ping every 20 ms, 750 times as often as WatchdogSec=30's 15 s.
WATCHDOG_BENCH_USEC = 40_000
#: Rounds of the watchdog part, each running the workload without, then with the watchdog.
WATCHDOG_ROUNDS = 5


def connector(name: str, folder: Path, count: int, batch: int, inflight: int) -> ConnectorConfig:
    return ConnectorConfig(
        name=name,
        command=[sys.executable, str(HERE / "flood_connector.py")],
        env={"FLOOD_COUNT": str(count), "FLOOD_BATCH": str(batch), "FLOOD_INFLIGHT": str(inflight),
             "FLOOD_NAME": name, "FLOOD_RESULT": str(folder / f"{name}.json")},
        grant=["channels.register", "channels.incoming"],
        restart=RestartConfig(policy="never"),
        request_timeout_s=60,
    )


async def run_host(folder: Path, connectors: list[ConnectorConfig], *, reads: list[float] | None = None,
                   notifier: Notifier | None = None, watchdog_s: float | None = None) -> tuple[float, int]:
    """Run the host until every connector reports; return the slowest connector's seconds and items accepted.

    `reads`: also read a quiet conversation's context over and over meanwhile, each read's seconds appended.
    `notifier`, `watchdog_s`: systemd's, as `mcplhost run` passes them.
    """
    config = Config(store=StoreConfig(path=str(folder / "host.db")), connectors=connectors)
    stop = anyio.Event()
    results = [folder / f"{c.name}.json" for c in connectors]

    async def read_contexts(host: Host) -> None:
        items = host.store.items
        while True:  # paced, as turns are: both read paths are asked for the same reads
            started = time.perf_counter()
            await items.context_rows("scout", limit=CONTEXT_ROWS, conversation_id=QUIET_CONVERSATION)
            assert reads is not None
            reads.append(time.perf_counter() - started)
            await anyio.sleep(max(0.0, READ_INTERVAL_S - reads[-1]))

    async with mcplhost.host.open_host(config, notifier=notifier) as host, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(host.run, stop, watchdog_s=watchdog_s))
        async with anyio.create_task_group() as reading:
            if reads is not None:
                reading.start_soon(read_contexts, host)
            with anyio.fail_after(600):
                while not all(p.exists() for p in results):
                    await anyio.sleep(0.05)
            reading.cancel_scope.cancel()
        stop.set()
    reports = [json.loads(p.read_text()) for p in results]
    return max(r["seconds"] for r in reports), sum(r["accepted"] for r in reports)


def plain_insert(rows_db: Path, folder: Path, *, indexes: bool = True) -> float:
    """Rows/s of a plain batched insert of the rows the host stored (50 per transaction), same columns.

    `indexes`: into the same schema, the items table's indexes included; else into the bare table (its
    integer primary key only), the cheapest store of the same rows SQLite has.
    """
    source = sqlite3.connect(rows_db)
    columns = ("agent, participant, role, content, metadata, server_id, channel_id, message_id, thread_id,"
               " conversation_id, dedup_digest, created_at")
    rows = source.execute(f"SELECT {columns} FROM items ORDER BY id").fetchall()
    kinds = "('table', 'index')" if indexes else "('table')"
    schema = [r[0] for r in source.execute(
        f"SELECT sql FROM sqlite_master WHERE tbl_name = 'items' AND type IN {kinds} AND sql IS NOT NULL"
        " ORDER BY type = 'index'")]
    source.close()
    target_path = folder / ("plain.db" if indexes else "plain-bare.db")
    target_path.unlink(missing_ok=True)
    target = sqlite3.connect(target_path, isolation_level=None)
    target.execute("PRAGMA journal_mode = WAL")
    target.execute("PRAGMA synchronous = NORMAL")
    for statement in schema:
        target.execute(statement)
    insert = f"INSERT INTO items ({columns}) VALUES ({', '.join('?' * 12)})"
    start = time.perf_counter()
    for offset in range(0, len(rows), 50):
        target.execute("BEGIN")
        target.executemany(insert, rows[offset : offset + 50])
        target.execute("COMMIT")
    seconds = time.perf_counter() - start
    target.close()
    return len(rows) / seconds


async def ratios(items: int) -> None:
    """Both workloads, each as a ratio to a plain batched insert of the same rows, with and without the indexes."""
    for label, connectors_count, batch, inflight in (
        ("batches of 50, 1 connector", 1, 50, 8),
        ("1 message per request, 4 connectors", 4, 1, 64),
    ):
        rate = plain = bare = cpu_rate = cpu_plain = cpu_bare = 0.0
        for _ in range(ROUNDS):  # interleaved, best of each: the machine is noisy
            with tempfile.TemporaryDirectory() as name:
                folder = Path(name)
                per = items // connectors_count
                specs = [connector(f"c{i}", folder, per, batch, inflight) for i in range(connectors_count)]
                cpu = time.process_time()
                seconds, accepted = await run_host(folder, specs)
                cpu_rate = max(cpu_rate, accepted / (time.process_time() - cpu))
                assert accepted == per * connectors_count, f"only {accepted} items were accepted"
                rate = max(rate, accepted / seconds)
                for indexes in (True, False):
                    cpu = time.process_time()
                    rows_per_s = plain_insert(folder / "host.db", folder, indexes=indexes)
                    per_cpu = accepted / (time.process_time() - cpu)
                    if indexes:
                        plain, cpu_plain = max(plain, rows_per_s), max(cpu_plain, per_cpu)
                    else:
                        bare, cpu_bare = max(bare, rows_per_s), max(cpu_bare, per_cpu)
        print(f"{label:>38}: {rate:>9,.0f} items/s | plain batched insert {plain:>9,.0f} rows/s, ratio {rate / plain:.0%}"
              f" | into a table with no index {bare:>9,.0f} rows/s, ratio {rate / bare:.0%}"
              f"  ({accepted:,} items, best of {ROUNDS})")
        # Per CPU second of this process (the host's threads, its start and stop included; the connector's
        # own process not): the same comparison, steadier on a shared machine (a wait for a core is not counted).
        print(f"{'per CPU second':>38}: {cpu_rate:>9,.0f} items   | plain batched insert {cpu_plain:>9,.0f} rows,   "
              f"ratio {cpu_rate / cpu_plain:.0%} | into a table with no index {cpu_bare:>9,.0f} rows,   "
              f"ratio {cpu_rate / cpu_bare:.0%}")


async def main(items: int) -> None:
    await ratios(items)
    await beside_reads(items)
    await watchdog_overhead(items)


async def seeded_store(path: Path, *, index: bool) -> None:
    """A migrated store holding SEEDED items (the oldest QUIET in the quiet conversation), with or without 0005's index."""
    async with open_store(path):
        pass
    conn = sqlite3.connect(path, isolation_level=None)
    content = json.dumps([{"type": "text", "text": "an older message of an ordinary length, seeded"}])
    metadata = json.dumps({"serverId": "seed", "channelId": "seed:g1:room"})
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO items (participant, role, content, metadata, server_id, channel_id, conversation_id, created_at)"
        " VALUES ('Alice', 'user', ?, ?, 'seed', 'seed:g1:room', ?, ?)",
        ((content, metadata, QUIET_CONVERSATION if n < QUIET else f"conv-{n % 50}", n) for n in range(SEEDED)))
    conn.execute("COMMIT")
    if not index:
        conn.execute("DROP INDEX items_by_conversation")
    conn.close()


async def beside_reads(items: int) -> None:
    print(f"1 message per request, 4 connectors, over {SEEDED:,} stored items; reads: context_rows of a quiet"
          f" conversation, {CONTEXT_ROWS} rows, one every {READ_INTERVAL_S * 1000:.0f} ms")
    original_open_store = mcplhost.host.open_store
    with tempfile.TemporaryDirectory() as name:
        templates = Path(name)
        for index in (True, False):
            await seeded_store(templates / f"index-{index}.db", index=index)
        # (index, reads, shared): shared = the path before the StoreReader, every read through the writer's lock.
        variants = [(True, False, False), (False, False, False), (False, True, True), (False, True, False),
                    (True, True, True), (True, True, False)]
        rates: dict[tuple[bool, bool, bool], float] = {variant: 0.0 for variant in variants}
        latencies: dict[tuple[bool, bool, bool], list[float]] = {variant: [] for variant in variants}
        plain: dict[tuple[bool, bool, bool], float] = {}
        for _ in range(READ_ROUNDS):  # interleaved, best of each: the machine is noisy
            for variant in variants:
                index, reads, shared = variant
                mcplhost.host.open_store = (functools.partial(original_open_store, reader_connections=0) if shared
                                            else original_open_store)
                try:
                    with tempfile.TemporaryDirectory() as run:
                        folder = Path(run)
                        shutil.copy(templates / f"index-{index}.db", folder / "host.db")
                        specs = [connector(f"c{i}", folder, items // 4, 1, 64) for i in range(4)]
                        seen: list[float] | None = [] if reads else None
                        seconds, accepted = await run_host(folder, specs, reads=seen)
                        if not reads:  # the index's cost to SQLite alone: the same rows, same indexes, plain inserts
                            plain[variant] = max(plain.get(variant, 0.0), plain_insert(folder / "host.db", folder))
                finally:
                    mcplhost.host.open_store = original_open_store
                assert accepted == items // 4 * 4, f"only {accepted} items were accepted"
                rates[variant] = max(rates[variant], accepted / seconds)
                latencies[variant].extend(seen or [])
        for (index, reads, shared), rate in rates.items():
            label = (f"{'index' if index else 'no index'}, "
                     + ("no reads" if not reads else "reads via the writer's lock" if shared else "reads via StoreReader"))
            seen = latencies[(index, reads, shared)]
            read_text = (f" | {len(seen) / READ_ROUNDS:,.0f} reads per run, median {statistics.median(seen) * 1000:.1f} ms"
                         if seen else "")
            plain_text = (f" | plain batched insert of its rows {plain[(index, reads, shared)]:,.0f} rows/s"
                          if (index, reads, shared) in plain else "")
            print(f"{label:>38}: {rate:>9,.0f} items/s (best of {READ_ROUNDS}){read_text}{plain_text}")


class NotifyReceiver:
    """systemd's side of NOTIFY_SOCKET (abstract namespace): a thread reads every datagram as it comes,
    as systemd does, so the daemon's sends never find the queue full; it counts the WATCHDOG=1."""

    def __init__(self) -> None:
        self.address = f"@mcplhost-bench-{uuid.uuid4().hex}"
        self.pings = 0
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind("\0" + self.address[1:])
        self._marked = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while (data := self._socket.recv(4096)) != b"bench:end":
            if data == b"bench:mark":
                self._marked.set()
            self.pings += data == b"WATCHDOG=1"

    def take(self) -> int:
        """The pings counted since the last call: a mark is sent and awaited, so every earlier datagram is read."""
        self._marked.clear()
        self._send(b"bench:mark")
        self._marked.wait()
        pings, self.pings = self.pings, 0
        return pings

    def _send(self, data: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(data, "\0" + self.address[1:])

    def close(self) -> None:
        self._send(b"bench:end")
        self._thread.join()
        self._socket.close()


async def watchdog_overhead(items: int) -> None:
    """The same inbound load without and with WATCHDOG_USEC, alternating; the ratio of the medians, and the noise.

    The noise: half the spread (max - min) of the rounds without, relative to their median.
    """
    os.environ.pop("WATCHDOG_PID", None)  # unset counts as ours
    print(f"watchdog: WATCHDOG_USEC={WATCHDOG_BENCH_USEC} (a ping every {WATCHDOG_BENCH_USEC / 2000:.0f} ms)"
          f" against none, {WATCHDOG_ROUNDS} alternating rounds, medians")
    for label, connectors_count, batch, inflight in (
        ("batches of 50, 1 connector", 1, 50, 8),
        ("1 message per request, 4 connectors", 4, 1, 64),
    ):
        rates: dict[bool, list[float]] = {False: [], True: []}
        pings = 0
        receiver = NotifyReceiver()
        try:
            for round_ in range(WATCHDOG_ROUNDS):
                for watchdog in (False, True) if round_ % 2 == 0 else (True, False):  # ABBA: drift cancels
                    if watchdog:
                        os.environ["WATCHDOG_USEC"] = str(WATCHDOG_BENCH_USEC)
                    else:
                        os.environ.pop("WATCHDOG_USEC", None)
                    notifier = Notifier(receiver.address, structlog.get_logger())
                    try:
                        with tempfile.TemporaryDirectory() as name:
                            folder = Path(name)
                            per = items // connectors_count
                            specs = [connector(f"c{i}", folder, per, batch, inflight) for i in range(connectors_count)]
                            seconds, accepted = await run_host(folder, specs, notifier=notifier,
                                                               watchdog_s=watchdog_interval_s())
                    finally:
                        notifier.close()
                    assert accepted == per * connectors_count, f"only {accepted} items were accepted"
                    rates[watchdog].append(accepted / seconds)
                    received = receiver.take()
                    assert watchdog or received == 0, "pings came without WATCHDOG_USEC"
                    pings += received
        finally:
            receiver.close()
        os.environ.pop("WATCHDOG_USEC", None)
        without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
        noise = (max(rates[False]) - min(rates[False])) / without
        # Each round's two runs are neighbours in time, so their ratio is the least touched by the machine's drift.
        paired = statistics.median(w / o for w, o in zip(rates[True], rates[False], strict=True))
        print(f"{label:>38}: without {without:>9,.0f} items/s | with {with_:>9,.0f} items/s | ratio {with_ / without:.3f}"
              f" (median of the rounds' own ratios {paired:.3f}) | spread of the rounds without ±{noise / 2:.1%}"
              f" | {pings} pings received")


#: Requests in flight at once in the in-process quota comparison (as 4 connectors x 64).
IN_PROCESS_INFLIGHT = 256


async def ingest_rate(items: int, agents: list[AgentConfig] | None = None, decided: list[int] | None = None) -> float:
    """Items/s of Ingest.store_messages, one message per request, IN_PROCESS_INFLIGHT at once, over a real store.

    `agents`: an AgentsRuntime with them is fed the Stored events meanwhile
    (as the host runs it); `decided` then gets the wake decisions written.
    """
    import structlog

    from mcplhost.agents.wiring import build_agents
    from mcplhost.ingest import Stored
    from mcplhost.protocol.intake import AdmittedMessage
    from mcplhost.speech.echoes import EchoMemory
    from mcplhost.store.writer import GroupWriter

    with tempfile.TemporaryDirectory() as run:
        async with open_store(Path(run) / "host.db") as store, anyio.create_task_group() as tg:
            writer = GroupWriter(store)
            await tg.start(writer.run)
            send, receive = anyio.create_memory_object_stream[Stored](1024)
            if agents is not None:
                runtime = build_agents(Config(agents=agents), store, writer, {})
                await tg.start(runtime.run, receive)
            intake = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox),
                            events=send if agents is not None else None)
            sent = iter(range(items))

            async def one_connector(name: str) -> None:
                for n in sent:
                    await intake.store_messages(name, "channels/incoming", [AdmittedMessage(
                        channel_id="disc:g1:room", label="#room", message_id=f"m-{n}", participant="Alice",
                        content=[{"type": "text", "text": f"an ordinary chat message of an ordinary length {n}"}])])

            started = time.perf_counter()
            async with anyio.create_task_group() as senders:
                for lane in range(IN_PROCESS_INFLIGHT):
                    senders.start_soon(one_connector, f"c{lane % 4}")
            seconds = time.perf_counter() - started
            if decided is not None:
                with anyio.fail_after(60):  # the background writes catch up (not timed: off the inbound path)
                    while (count := await _decisions(store)) < items - 4:
                        await anyio.sleep(0.05)
                decided.append(count)
            tg.cancel_scope.cancel()
    return items / seconds


async def _decisions(store: object) -> int:
    async with store.reader.connection() as conn:  # type: ignore[attr-defined]
        ((count,),) = await conn.execute_fetchall("SELECT count(*) FROM wake_decisions")
    return int(count)


#: Rounds of the explain comparison, each running every variant once.
EXPLAIN_ROUNDS = 5


async def explain_cost(items: int) -> None:
    """The inbound cost of explain's recording: no agent, an agent that wakes on nothing, one capped on every item."""
    quiet = AgentConfig(name="quiet", wake_on=["push"], backend=BackendConfig(kind="scripted", script=["ok"]))
    capped = AgentConfig(name="capped", wake_on=["all"], max_wakes_per_sender_per_hour=1,
                         backend=BackendConfig(kind="scripted", script=["ok"] * 8))
    variants: list[tuple[str, list[AgentConfig] | None]] = [
        ("no agent", None), ("agent waking on nothing", [quiet]), ("agent sender-capped on every item", [capped])]
    rates = {label: 0.0 for label, _ in variants}
    decided: list[int] = []
    print(f"1 message per request, {IN_PROCESS_INFLIGHT} in flight, in process (ingest → commit → agents)")
    for round_number in range(EXPLAIN_ROUNDS):  # interleaved, order alternating, best of each: the machine is noisy
        for label, agents in variants[:: 1 if round_number % 2 == 0 else -1]:
            rate = await ingest_rate(items, agents, decided if agents == [capped] else None)
            rates[label] = max(rates[label], rate)
    base = rates["no agent"]
    for label, rate in rates.items():
        print(f"{label:>38}: {rate:>9,.0f} items/s | ratio to no agent {rate / base:.3f} (best of {EXPLAIN_ROUNDS})")
    print(f"{'decisions written per capped run':>38}: {min(decided):,} of {items:,} items")


async def quotas_in_process(items: int, checked: tuple, unchecked: tuple) -> None:
    """The same comparison without connector processes: ingest and the commit only, where the check's cost is."""
    rates = {"with quotas": 0.0, "without": 0.0}
    variants = [("with quotas", checked), ("without", unchecked)]
    for round_number in range(QUOTA_ROUNDS):
        for label, steps in variants[:: 1 if round_number % 2 == 0 else -1]:
            _use_quota_steps(steps)
            try:
                rates[label] = max(rates[label], await ingest_rate(items))
            finally:
                _use_quota_steps(checked)
    print(f"{'in process (ingest → commit), with':>38}: {rates['with quotas']:>9,.0f} items/s,"
          f" without {rates['without']:,.0f} | ratio {rates['with quotas'] / rates['without']:.3f}"
          f" (best of {QUOTA_ROUNDS})")


#: Rounds of the quota comparison, each running both variants.
QUOTA_ROUNDS = 5


class _Unchecked:
    """Ingest's quota steps replaced by none: nothing reserved, nothing counted (the path before quotas)."""

    @staticmethod
    def reserve_all(self: ConnectorQuota, now: int, items: int, size: int) -> bool:
        return True

    @staticmethod
    def release(self: ConnectorQuota, at: int, size: int) -> None:
        return None

    @staticmethod
    async def store(self: Ingest, server_id: str, quota: ConnectorQuota, accepted_at: int, items: list,
                    sizes: list, reserved: list, rows: list, searched: object) -> list:
        return await self.writer.store_items(items, rows=rows, searched=searched)


def _use_quota_steps(steps: tuple) -> None:
    """Put the quota's reservation and release and ingest's charged store in place: checked, or `_Unchecked`'s."""
    ConnectorQuota.reserve_all, ConnectorQuota.release, Ingest._store_charged = steps  # type: ignore[method-assign]


async def quotas(items: int) -> None:
    print("1 message per request, 4 connectors: with the quota check (default quotas) and without it")
    checked = (ConnectorQuota.reserve_all, ConnectorQuota.release, Ingest._store_charged)
    unchecked = (_Unchecked.reserve_all, _Unchecked.release, _Unchecked.store)
    rates = {"with quotas": 0.0, "without": 0.0}
    variants = [("with quotas", checked), ("without", unchecked)]
    for round_number in range(QUOTA_ROUNDS):  # interleaved, order alternating, best of each: the machine is noisy
        for label, steps in variants[:: 1 if round_number % 2 == 0 else -1]:
            _use_quota_steps(steps)
            try:
                with tempfile.TemporaryDirectory() as run:
                    folder = Path(run)
                    specs = [connector(f"c{i}", folder, items // 4, 1, 64) for i in range(4)]
                    seconds, accepted = await run_host(folder, specs)
            finally:
                _use_quota_steps(checked)
            assert accepted == items // 4 * 4, f"only {accepted} items were accepted"
            rates[label] = max(rates[label], accepted / seconds)
    for label, rate in rates.items():
        print(f"{label:>38}: {rate:>9,.0f} items/s (best of {QUOTA_ROUNDS})")
    print(f"{'ratio with/without':>38}: {rates['with quotas'] / rates['without']:.3f}")
    await quotas_in_process(items, checked, unchecked)
    # The check's own CPU per message, steadier than the rates on a loaded machine: size it, reserve it.
    content = [{"type": "text", "text": "[source: c0 · #room · Alice] "},
               {"type": "text", "text": "an ordinary chat message of an ordinary length, sent to the room"}]
    window, now, rounds = QuotaWindow(QuotaLimits()), 1_790_000_000_000, 200_000
    started = time.perf_counter()
    for n in range(rounds):
        window.reserve(now + n, body_bytes(content))
    per_message = (time.perf_counter() - started) / rounds
    print(f"{'quota check per message (in process)':>38}: {per_message * 1e6:.2f} µs"
          f" = {per_message * rates['without']:.1%} of an item's time at the rate without")



#: Rounds of the secrets part, each running the workload with no secret and with SECRETS_BENCH_COUNT.
SECRETS_ROUNDS = 3
SECRETS_BENCH_COUNT = 4


async def secrets_overhead(items: int) -> None:
    """The whole inbound path with no secret configured and with 4 (connector `env` entries named *_TOKEN), in
    alternating rounds: the ratio of the best rates (docs/agents.md#secrets: every item is redacted before it is
    stored)."""
    print(f"secrets: 1 message per request and batches of 50, with 0 and {SECRETS_BENCH_COUNT} secrets,"
          f" {SECRETS_ROUNDS} alternating rounds, best of each")
    for label, connectors_count, batch, inflight in (
        ("batches of 50, 1 connector", 1, 50, 8),
        ("1 message per request, 4 connectors", 4, 1, 64),
    ):
        rates: dict[int, float] = {0: 0.0, SECRETS_BENCH_COUNT: 0.0}
        for round_ in range(SECRETS_ROUNDS):
            for count in (0, SECRETS_BENCH_COUNT) if round_ % 2 == 0 else (SECRETS_BENCH_COUNT, 0):
                with tempfile.TemporaryDirectory() as name:
                    folder = Path(name)
                    per = items // connectors_count
                    specs = [connector(f"c{i}", folder, per, batch, inflight) for i in range(connectors_count)]
                    tokens = {f"BENCH_{n}_TOKEN": f"bench-secret-value-{n}-{uuid.uuid4().hex}" for n in range(count)}
                    specs[0] = msgspec.structs.replace(specs[0], env={**specs[0].env, **tokens})
                    seconds, accepted = await run_host(folder, specs)
                    assert accepted == per * connectors_count, f"only {accepted} items were accepted"
                    rates[count] = max(rates[count], accepted / seconds)
        without, with_ = rates[0], rates[SECRETS_BENCH_COUNT]
        print(f"{label:>38}: 0 secrets {without:>9,.0f} items/s | {SECRETS_BENCH_COUNT} secrets {with_:>9,.0f} items/s"
              f" | ratio {with_ / without:.3f}")
    # The checks' own CPU per item, steadier than the rates on a loaded machine: ingest's one search over the
    # item's JSON, and the store writer's one search over the row it writes.
    from mcplhost.secrets import Secrets
    from mcplhost.store.redacting import RedactingWriter

    secrets = Secrets({f"BENCH_{n}_TOKEN": f"bench-secret-value-{n}-{uuid.uuid4().hex}"
                       for n in range(SECRETS_BENCH_COUNT)})
    content = [{"type": "text", "text": "[source: c0 · #room · Alice] "},
               {"type": "text", "text": "an ordinary chat message of an ordinary length, sent to the room"}]
    metadata = {"serverId": "c0", "channelId": "room", "messageId": "m-1", "timestamp": "2026-01-01T00:00:00Z",
                "source": {"serverId": "c0", "channelId": "room", "label": "#room", "tags": ["chat:addressed"],
                           "author": {"id": "u-1", "name": "Alice"}}}
    row = [None, "u-1", "user", json.dumps(content), json.dumps(metadata), "c0", "room", "m-1", None, "conv-1",
           "digest-0123456789", 1_790_000_000_000]
    writer, rounds = RedactingWriter(None, secrets), 50_000  # type: ignore[arg-type]
    started = time.perf_counter()
    for _ in range(rounds):
        secrets.find_json([content, metadata])
        writer._redacted(row)
    per_item = (time.perf_counter() - started) / rounds
    print(f"{'secret checks per item (in process)':>38}: {per_item * 1e6:.2f} µs"
          f" = {per_item * rates[0]:.1%} of an item's time at the one-message rate without")


#: The parts a second argument may name alone.
PARTS = {"ratio": ratios, "reads": beside_reads, "watchdog": watchdog_overhead, "quotas": quotas, "secrets": secrets_overhead,
         "explain": explain_cost}

if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000
    logs.configure("json", "warning")  # as `mcplhost run` configures it, quieter
    anyio.run(PARTS[sys.argv[2]] if len(sys.argv) > 2 else main, count)
