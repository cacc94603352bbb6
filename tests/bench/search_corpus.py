"""A large store of varied chat text for the search benchmarks, built once and cached under /tmp.

`corpus_store(items)` returns the path of a store (today's schema, migrated by `open_store`) holding
`items` items written straight into the items table with the rows the inbound pipeline writes: a source
header block and a body block, the metadata of docs/provenance.md §6, the key columns. Bodies are drawn
from a Zipf-weighted vocabulary of 40,000 made-up words and about a hundred common English ones, with
mentions, numbers, links and emoji, 1 to 25 words each (about 78 characters on average): not one repeated
body. 100 channels on 5 connectors, one year of timestamps, 3% of rows an agent's own.

Planted, at known ids (`PLANTED`): a rare word, a phrase, and a mid-frequency word, so the benchmarks
can say which ids a query must find. `indexed_store(items)` is a copy with the search index built
(through the indexer, `SqliteSearchIndex.index_next`).

    .venv/bin/python tests/bench/search_corpus.py [ITEMS]   # build (or find) both, print their sizes
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import anyio

from mcplhost.store import open_store
from mcplhost.store.migrate import load_migrations

CACHE = Path("/tmp/mcplhost-bench-search")
SEED = 26
YEAR_MS = 365 * 24 * 3600 * 1000
START_MS = 1_760_000_000_000
CONNECTORS = ("discord", "slack", "zulip", "matrix", "irc")
CHANNELS_PER_CONNECTOR = 20
AGENT_ROWS = 0.03
#: What is planted, and in how many items (spread evenly over the ids, the oldest and newest included).
RARE_WORD = "Zanzibarite"  # 20 items, capitalised: a case-insensitive query finds them by "zanzibarite"
PHRASE = "the blue harbour lights"  # 12 items; its words are common elsewhere ("the", "blue", "lights")
COMMON_WORD = "deployment"  # 1 item in 200
ABSENT_WORD = "qwertzuiopasdf"
PLANTED = {RARE_WORD: 20, PHRASE: 12}
COMMON_EVERY = 200

COMMON = ("the a to and i you it is that of in for on this we be have are not with just so but do was what "
          "can if at my all me they like no get your up will one about out there know think how now yes its im "
          "dont good when time go people see would an thanks ok lol yeah right back some more really well from "
          "by then make also new here or as did got them want work any way been because day need too much should "
          "going today still could thing why after our sure first over even last than great nice let pretty only "
          "blue lights harbour").split()
SYLLABLES = ("ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo ga ge gi go ha he hi ho ja ka ke ki ko la "
             "le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po pu ra re ri ro ru sa se si so su ta te ti to "
             "tu va ve vi vo wa we wi xa ya yo za ze zi zo an en in on un ar er ir or ur al el il ol ul st tr pl "
             "gr br ch sh th").split()
EMOJI = ("🙂", "😂", "👍", "🎉", "🔥", "❤️", "🤔")


def _vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < 40_000:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered


def planted_ids(items: int) -> dict[str, list[int]]:
    """The ids each planted text is in (ids 1..items)."""
    found = {text: [1 + round(k * (items - 1) / (count - 1)) for k in range(count)] for text, count in PLANTED.items()}
    found[COMMON_WORD] = list(range(COMMON_EVERY // 2, items + 1, COMMON_EVERY))
    return found


def bodies(items: int) -> list[str]:
    rng = random.Random(SEED)
    vocabulary = _vocabulary(rng)
    cumulative: list[float] = []
    total = 0.0
    for rank in range(len(vocabulary)):
        total += 1 / (rank + 1)
        cumulative.append(total)
    names = ["@" + word for word in vocabulary[:300]]
    out: list[str] = []
    choices, random_ = rng.choices, rng.random
    for _ in range(items):
        count = rng.randint(1, 25)
        words = choices(vocabulary, cum_weights=cumulative, k=count)
        for j in range(count):
            r = random_()
            if r < 0.45:
                words[j] = COMMON[int(random_() * len(COMMON))]
            elif r < 0.47:
                words[j] = names[int(random_() * len(names))]
            elif r < 0.48:
                words[j] = str(int(random_() * 100_000))
            elif r < 0.485:
                words[j] = EMOJI[int(random_() * len(EMOJI))]
            elif r < 0.488:
                words[j] = f"https://example.org/{words[j]}/{rng.getrandbits(32):x}"
        text = " ".join(words)
        if random_() < 0.3:
            text = text.capitalize()
        if random_() < 0.2:
            text += "?!."[int(random_() * 3)]
        out.append(text)
    for text, ids in planted_ids(items).items():
        for item_id in ids:
            words = out[item_id - 1].split(" ")
            at = rng.randint(0, len(words))
            out[item_id - 1] = " ".join([*words[:at], text, *words[at:]])
    return out


COLUMNS = ("agent, participant, role, content, metadata, server_id, channel_id, message_id, thread_id,"
           " conversation_id, dedup_digest, created_at")


def _rows(texts: list[str]):
    rng = random.Random(SEED + 1)
    channels = [(server, f"{server}:g1:c{n}") for server in CONNECTORS for n in range(CHANNELS_PER_CONNECTOR)]
    step = YEAR_MS // max(1, len(texts))
    for n, text in enumerate(texts):
        server, channel = channels[int(rng.random() * len(channels))]
        created = START_MS + n * step
        if rng.random() < AGENT_ROWS:
            yield ("scout", None, "assistant", json.dumps([{"type": "text", "text": text}]),
                   json.dumps({"kind": "speech", "serverId": server, "channelId": channel, "turnId": n}),
                   server, channel, None, None, None, None, created)
            continue
        header = f"[source: {server} / {channel} · #{channel.rsplit(':', 1)[1]}]"
        message_id = f"m-{n}"
        digest = hashlib.sha256(text.encode()).hexdigest()
        author = f"user{int(rng.random() * 500)}"
        metadata = {"serverId": server, "channelId": channel, "messageId": message_id, "threadId": None,
                    "eventId": None, "featureSet": None, "tags": [],
                    "source": {"kind": "channel", "lane": "channels/incoming", "serverId": server,
                               "channelId": channel, "label": "#room", "messageId": message_id,
                               "acceptedAt": created, "sourceTimestamp": None},
                    "sourceHeader": header, "sourceBodyDigest": digest, "storedBodyDigest": digest,
                    "adapter": {"mentions": []}, "authorId": author}
        yield (None, author, "user", json.dumps([{"type": "text", "text": header}, {"type": "text", "text": text}]),
               json.dumps(metadata), server, channel, message_id, None, f"conv-{channel}", digest, created)


def _build(path: Path, items: int) -> None:
    async def migrate() -> None:
        async with open_store(path):
            pass

    anyio.run(migrate)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO items ({COLUMNS}) VALUES ({', '.join('?' * 12)})", _rows(bodies(items)))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def schema_tag() -> str:
    """A short digest of the migrations: a cached store is rebuilt when the schema changes."""
    digest = hashlib.sha256()
    for migration in load_migrations():
        digest.update(migration.sql.encode())
    return digest.hexdigest()[:8]


def corpus_store(items: int) -> Path:
    """The cached store of `items` items without its index built (mark 0), built if missing."""
    path = CACHE / f"corpus-{items}-{schema_tag()}.db"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        partial = path.with_suffix(".building")
        for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
            leftover.unlink(missing_ok=True)
        _build(partial, items)
        partial.rename(path)
        print(f"built {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return path


def indexed_store(items: int) -> Path:
    """The cached store of `items` items with its search index built, built (from `corpus_store`) if missing."""
    path = CACHE / f"indexed-{items}-{schema_tag()}.db"
    if not path.exists():
        started = time.perf_counter()
        partial = path.with_suffix(".building")
        shutil.copyfile(corpus_store(items), partial)

        async def build() -> None:
            async with open_store(partial) as store:
                while await store.search_index.index_next(20_000):
                    pass
                while await store.search_index.merge_step(10_000):  # tidy, as a daemon leaves it once caught up
                    pass

        anyio.run(build)
        conn = sqlite3.connect(partial, isolation_level=None)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        partial.rename(path)
        print(f"indexed {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return path


def copy_of(source: Path, folder: Path) -> Path:
    """A private copy of a cached store (the cache itself is never opened for writing by a benchmark)."""
    target = folder / "host.db"
    shutil.copyfile(source, target)
    return target


if __name__ == "__main__":
    from mcplhost import logs

    logs.configure(level="warning")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    for path in (corpus_store(count), indexed_store(count)):
        print(path, f"{path.stat().st_size / 1e6:.0f} MB")
