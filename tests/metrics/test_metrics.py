"""`/metrics` over real HTTP after known traffic through a real host (docs/operations.md#metrics).

A scripted connector subprocess sends a known mix (accepted, duplicate and
refused messages and pushes, refused requests); the scrape, parsed with
prometheus_client's own parser, must say exactly what the store, the
connector's answers and the handle's statistics say.
"""

from __future__ import annotations

import anyio
import msgspec
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from mcplhost.config import Config, MetricsConfig, RestartConfig
from mcplhost.metrics import http as metrics_http
from mcplhost.metrics.http import MAX_HEAD_BYTES
from mcplhost.protocol.ports import State

from ..agents.support import agent_config
from ..agents.support import scripted as scripted_backend
from ..builders import incoming, message, push, register
from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, http_exchange, record, scripted, stored_items, wait_for
from ..memory_pair import memory_host

#: Requests for a method no host knows, sent to flood one log event (mcpl.refused) past its allowance.
UNKNOWN_REQUESTS = 14
#: Slow clients beside a scrape (docs/operations.md#metrics): more than the places the server once had.
SLOW_CLIENTS = 24
#: How long a scrape may take beside them, and how often a trickling client sends its next header byte.
SCRAPE_WITHIN_S, TRICKLE_S = 2.0, 0.1
#: Scrapes made, each once every slow client has been let go and come back that many times.
SCRAPE_ROUNDS = 2


def with_metrics(config: Config, listen: str = "127.0.0.1:0") -> Config:
    return msgspec.structs.replace(config, metrics=MetricsConfig(listen=listen))


async def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of GET /metrics, keyed by (sample name, sorted labels)."""
    answer = await http_exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


class TestCountersAfterKnownTraffic:
    async def test_items_refusals_up_restarts_and_suppressed_lines_are_exact(self, tmp_path) -> None:
        """Accepted, duplicate and refused items, refusals by reason, up, restarts and a flood's suppressed count."""
        steps = [
            register("d:1"),
            incoming(message("d:1", "m-1"), message("d:1", "m-2"), message("d:9", "m-3")),  # m-3: no such channel
            incoming(message("d:1", "m-1")),  # an identical redelivery
            {"request": "push/event", "params": push("e-1")},
            {"request": "push/event", "params": push("e-1")},  # a repeated eventId
            {"request": "push/event", "params": push("e-2", feature_set="nope")},  # undeclared feature set
            {"requests": [["nosuch/method", {}]] * UNKNOWN_REQUESTS},
        ]
        spec = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT)
        with capture_logs():
            async with memory_host(with_metrics(config_with(tmp_path, spec))) as host:
                await wait_for(lambda: record(tmp_path, "disc").done)
                samples = await scrape(host.metrics_address)
                stats = host.connectors["disc"].statistics()
        rec = record(tmp_path, "disc")
        answered = rec.answer(1)["result"]["results"]
        assert [r["accepted"] for r in answered] == [True, True, False]
        stored = await stored_items(tmp_path)
        lanes = [item.metadata["source"]["lane"] for item in stored]

        def items(lane: str, outcome: str) -> float:
            return sample(samples, "mcplhost_items_total", connector="disc", lane=lane, outcome=outcome)

        assert items("channels/incoming", "accepted") == lanes.count("channels/incoming") == 2
        assert items("channels/incoming", "duplicate") == 1
        assert items("channels/incoming", "refused") == 1
        assert items("push/event", "accepted") == lanes.count("push/event") == 1
        assert items("push/event", "duplicate") == 1
        assert items("push/event", "refused") == 1
        assert "error" in rec.answer(5)
        refused = {labels: value for (name, labels), value in samples.items() if name == "mcplhost_refusals_total"}
        assert refused == {
            (("connector", "disc"), ("method", "(unknown)"), ("reason", "method_not_found")): UNKNOWN_REQUESTS,
            (("connector", "disc"), ("method", "push/event"), ("reason", "feature_set_not_declared")): 1,
        }
        assert sample(samples, "mcplhost_connector_up", connector="disc") == 1
        assert sample(samples, "mcplhost_connector_restarts_total", connector="disc") == stats.restarts == 0
        # mcpl.refused: one line per refused request, 10 written per window, the rest counted.
        assert sample(samples, "mcplhost_log_suppressed_total", connector="disc",
                      event="mcpl.refused") == UNKNOWN_REQUESTS + 1 - 10
        assert sample(samples, "mcplhost_quota_refusals_total", connector="disc", quota="items") == 0
        assert sample(samples, "mcplhost_outbox_pending") == 0
        assert sample(samples, "mcplhost_publish_total", connector="disc", outcome="delivered") == 0
        assert sample(samples, "mcplhost_store_commit_seconds_count") >= 3
        assert ("mcplhost_loop_lag_seconds_count", ()) in samples

    async def test_restarts_and_refusals_outlive_a_process_life(self, tmp_path) -> None:
        """A connector that refuses once and exits each life: restarts equal status's, its refusals add up."""
        steps = [{"request": "nosuch/method", "params": {}}, {"exit": 1}]
        restart = RestartConfig(policy="on-failure", backoff_initial_s=0.01, backoff_max_s=60, burst=2, window_s=60)
        spec = scripted("flaky", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT,
                        restart=restart)
        with capture_logs():
            async with memory_host(with_metrics(config_with(tmp_path, spec))) as host:
                handle = host.connectors["flaky"]
                await handle.wait_state(State.SLOW_LANE)
                samples = await scrape(host.metrics_address)
                stats = handle.statistics()
        assert stats.restarts == 1
        assert sample(samples, "mcplhost_connector_restarts_total", connector="flaky") == stats.restarts
        assert sample(samples, "mcplhost_connector_up", connector="flaky") == 0
        assert sample(samples, "mcplhost_refusals_total", connector="flaky", method="(unknown)",
                      reason="method_not_found") == 2

    async def test_a_turn_is_timed_and_its_wake_latency_observed(self, tmp_path) -> None:
        """An item that wakes an agent: one turn in mcplhost_turn_seconds, one wake latency observed."""
        steps = [register("d:1"), incoming(message("d:1", "m-1"))]
        spec = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT)
        config = msgspec.structs.replace(with_metrics(config_with(tmp_path, spec)),
                                         agents=[agent_config(backend=scripted_backend("noted"))])
        with capture_logs() as logs:
            async with memory_host(config) as host:
                await wait_for(lambda: any(e["event"] == "agent.turn" for e in logs))
                samples = await scrape(host.metrics_address)
        assert sample(samples, "mcplhost_turn_seconds_count", agent="scout", outcome="completed") == 1
        assert sample(samples, "mcplhost_wake_latency_seconds_count") == 1


class TestServing:
    async def test_binds_the_address_written_and_answers_only_metrics(self, tmp_path) -> None:
        """Loopback as written; 404 for another path, 405 for another method, HEAD without a body."""
        async with memory_host(with_metrics(config_with(tmp_path))) as host:
            address = host.metrics_address
            assert address is not None and address.startswith("127.0.0.1:")
            other = await http_exchange(address, b"GET /other HTTP/1.1\r\n\r\n")
            post = await http_exchange(address, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            head = await http_exchange(address, b"HEAD /metrics HTTP/1.0\r\n\r\n")
            junk = await http_exchange(address, b"\x00\xff junk\r\n\r\n")
        assert other.startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert post.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in post
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        assert junk.startswith(b"HTTP/1.1 400 ")

    async def test_a_request_line_too_long_is_refused_at_once(self, tmp_path) -> None:
        """A request line past MAX_HEAD_BYTES, never finished: 414 at once, the connection closed."""
        async with memory_host(with_metrics(config_with(tmp_path))) as host:
            with anyio.fail_after(2):  # well inside the request timeout: refused on size, not on time
                line = await http_exchange(host.metrics_address, b"GET /" + b"a" * (MAX_HEAD_BYTES + 10))
                headers = await http_exchange(host.metrics_address,
                                     b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"b" * MAX_HEAD_BYTES)
        assert line.startswith(b"HTTP/1.1 414 ")
        assert headers.startswith(b"HTTP/1.1 431 ")

    async def test_an_address_in_use_is_one_operator_error(self, tmp_path) -> None:
        """A second host on the first one's metrics address fails to run with an OperatorError naming it."""
        from mcplhost.errors import OperatorError
        from mcplhost.host import open_host

        async with memory_host(with_metrics(config_with(tmp_path))) as host:
            taken = host.metrics_address
            other = tmp_path / "other"
            other.mkdir()
            async with open_host(with_metrics(config_with(other), taken)) as second:
                try:
                    await second.run(anyio.Event())
                except OperatorError as exc:
                    assert str(exc).startswith(f"metrics.listen: cannot listen on {taken}")
                else:
                    raise AssertionError("the second host ran")


class TestHostileClients:
    async def test_a_silent_client_is_dropped_after_the_time_bound(self, tmp_path, monkeypatch) -> None:
        """A client that connects and sends nothing is closed once HEAD_TIMEOUT_S has passed."""
        monkeypatch.setattr(metrics_http, "HEAD_TIMEOUT_S", 0.2)
        async with memory_host(with_metrics(config_with(tmp_path))) as host:
            assert await http_exchange(host.metrics_address, b"") == b""  # closed without an answer, within 5 s

    async def test_past_the_client_cap_a_client_gets_503_at_once(self, tmp_path, monkeypatch) -> None:
        """MAX_CLIENTS idle clients hold every place: the next one is answered 503, and a scrape works after."""
        monkeypatch.setattr(metrics_http, "HEAD_TIMEOUT_S", metrics_http.REQUEST_TIMEOUT_S)  # none dropped meanwhile
        async with memory_host(with_metrics(config_with(tmp_path))) as host:
            address, port = host.metrics_address.rsplit(":", 1)
            idle = [await anyio.connect_tcp(address, int(port)) for _ in range(metrics_http.MAX_CLIENTS)]
            try:
                # Accepted in order, each task takes its place first: the next client finds none left.
                refused = await http_exchange(host.metrics_address, b"GET /metrics HTTP/1.1\r\n\r\n")
            finally:
                for stream in idle:
                    await stream.aclose()
            assert refused.startswith(b"HTTP/1.1 503 ")
            with anyio.fail_after(5):  # the places come back as the server sees each idle client close
                while not (await http_exchange(host.metrics_address, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(
                        b"HTTP/1.1 200"):
                    pass

    async def test_two_dozen_slow_clients_never_keep_a_fresh_scrape_waiting(self, tmp_path) -> None:
        """24 local clients that connect and send nothing, or trickle a header a byte at a time, and come back as
        soon as they are dropped: with all of them connected, a scrape is answered 200 within 2 s, each time
        (they held all 8 places for 5 s each, and 19 of 24 scrapes got 503)."""
        async with memory_host(with_metrics(config_with(tmp_path))) as host:
            address, port = host.metrics_address.rsplit(":", 1)
            connected, dropped = set(), [0] * SLOW_CLIENTS

            async def slow(n: int) -> None:
                while True:
                    async with await anyio.connect_tcp(address, int(port)) as stream:
                        connected.add(n)
                        try:
                            if n % 2:
                                await stream.send(b"GET /metrics HTTP/1.1\r\n")
                                while True:
                                    await stream.send(b"X")
                                    await anyio.sleep(TRICKLE_S)  # the trickle's pace, not a wait for anything
                            else:
                                await stream.receive()  # ends when the server lets go
                        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                            pass
                    connected.discard(n)
                    dropped[n] += 1

            async with anyio.create_task_group() as clients:
                for n in range(SLOW_CLIENTS):
                    clients.start_soon(slow, n)
                for freed in range(SCRAPE_ROUNDS):  # each round after every slow client was let go and came back
                    await wait_for(lambda: min(dropped) >= freed and len(connected) == SLOW_CLIENTS)  # noqa: B023
                    answer = await http_exchange(host.metrics_address, b"GET /metrics HTTP/1.1\r\n\r\n",
                                                 timeout=SCRAPE_WITHIN_S)
                    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:100]
                clients.cancel_scope.cancel()
