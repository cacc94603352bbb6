"""How soon a publish queued on one host is sent by the host that owns its connector
(docs/operations.md#several-hosts-on-one-store): figures for README.md.

Two hosts in this process on one PostgreSQL database (tests/postgres.py's server): host A owns connector `chat`
(the scripted connector in memory, answering every publish delivered); host B is configured for no connector and
queues one publish for `chat` at a time, as a turn does. The figure is the time from B's commit to A's sender
counting the publish delivered (the connector's answer included), PUBLISHES times, median and max:

- by NOTIFY (the host's look at the queue set to an hour, so only the notification can bring it in time);
- by the look alone (the notification sent on a channel nobody hears), for comparison: about SHARED_POLL_S / 2
  on average, at most SHARED_POLL_S, plus the send.

    .venv/bin/python tests/bench/bench_publish_across_hosts.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost import host  # noqa: E402
from mcplhost.speech import shared  # noqa: E402
from mcplhost.speech.outbox import SHARED_POLL_S  # noqa: E402
from mcplhost.store import outbox  # noqa: E402
from mcplhost.store.operations import PublishSpeech  # noqa: E402
from tests.memory_pair import memory_host  # noqa: E402
from tests.postgres import start_server  # noqa: E402
from tests.speech.test_outbox import publish_entry  # noqa: E402
from tests.test_shared_routing import chat, host_config, state  # noqa: E402

PUBLISHES = 20


async def latencies(url: str, folder: Path) -> list[float]:
    a_folder, b_folder = state(folder, "a"), state(folder, "b")
    async with memory_host(host_config(url, "a", a_folder, chat(a_folder))) as a, \
            memory_host(host_config(url, "b", b_folder)) as b:
        stats = a.outbox_senders["chat"].stats
        took = []
        for n in range(PUBLISHES):
            speech, entry = publish_entry(f"publish {n}", server="chat")
            started = time.monotonic()
            await b.writer.write(PublishSpeech(speech, [entry]))
            with anyio.fail_after(10):
                while stats["delivered"] <= n:
                    await anyio.sleep(0.001)
            took.append(time.monotonic() - started)
        return took


async def main() -> None:
    server = start_server()
    try:
        for name, poll_s in (("notify", 3600.0), ("poll", SHARED_POLL_S)):
            if name == "poll":
                outbox.PUBLISH_CHANNEL = "nobody_listens"  # every notification is lost
            host.serve_shared_outbox = partial(shared.serve_shared_outbox, poll_s=poll_s)  # type: ignore[assignment]
            with tempfile.TemporaryDirectory() as folder:
                took = await latencies(server.create_database().url, Path(folder))
            print(json.dumps({"by": name, "publishes": PUBLISHES,
                              "median_ms": round(statistics.median(took) * 1000, 1),
                              "max_ms": round(max(took) * 1000, 1)}))
    finally:
        server.stop()


if __name__ == "__main__":
    anyio.run(main)
