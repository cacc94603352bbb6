"""Prometheus metrics at `[metrics] listen` (docs/operations.md#metrics).

    metrics = Metrics(outbox=…, turns=…, secrets=…, connectors=…, timings=timings, …)  # with the host, before it runs
    listener = await metrics.listen(config.metrics.listen)
    tg.start_soon(metrics.serve, listener)         # /metrics on the loop, plus the loop-lag sampler

One registry per host (never prometheus_client's global one): the counters
are read from the components at each scrape (collector.py), the
histograms are observed where the components time them (timings.py).
Only this package imports prometheus_client (a `protected` contract in
pyproject.toml).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

import anyio
import structlog
from anyio import TypedAttributeProvider
from anyio.abc import Listener, SocketAttribute, SocketStream
from anyio.streams.stapled import MultiListener
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mcplhost.config import listen_address
from mcplhost.errors import OperatorError
from mcplhost.ingest import Ingest
from mcplhost.logs import LimitedLog, SuppressedTotals
from mcplhost.secrets import Secrets
from mcplhost.speech.outbox import OutboxSender
from mcplhost.store.interfaces import Outbox, Turns
from mcplhost.supervisor.handle import ConnectorHandle

from .collector import HostCollector
from .http import MAX_CLIENTS, serve_client
from .timings import Timings
from .turns import TurnTally

__all__ = ["Metrics", "Timings"]

log = structlog.get_logger()


class Metrics:
    """One host's registry: its collector over the components and its histograms."""

    def __init__(self, *, outbox: Outbox, turns: Turns, secrets: Secrets, connectors: Mapping[str, ConnectorHandle],
                 ingest: Ingest, outbox_senders: Mapping[str, OutboxSender],
                 peer_admissions: Callable[[], Mapping[str, int]], suppressed: SuppressedTotals,
                 timings: Timings) -> None:
        self._outbox = outbox
        self._turns_ledger = turns
        self._secrets = secrets
        self.registry = registry = timings.registry
        self.timings = timings
        self.collector = HostCollector(connectors=connectors, ingest=ingest, outbox_senders=outbox_senders,
                                       peer_admissions=peer_admissions, suppressed=suppressed)
        registry.register(self.collector)
        self._turns = TurnTally()
        self._limiter = anyio.CapacityLimiter(MAX_CLIENTS)
        self._client_events = LimitedLog(log)  # clients choose how often they time out: a bounded log

    async def render(self) -> tuple[bytes, str]:
        """The text format of every metric now, and its content type; secret values redacted, as in a log line
        (docs/agents.md#secrets: a label is a connector's or agent's name, or a word the host chose, but a
        name can still be a token pasted in the wrong place)."""
        self.collector.outbox_pending = await self._outbox.count("pending")
        self.collector.turns = await self._turns.read(self._turns_ledger)
        return self._secrets.redact_bytes(generate_latest(self.registry)), CONTENT_TYPE_LATEST

    async def listen(self, listen: str) -> MultiListener[SocketStream]:
        """Bind `listen` (HOST:PORT, validated by check-config); OperatorError when it cannot be bound."""
        host, port = listen_address(listen)
        try:
            listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
        except OSError as exc:
            raise cannot_listen(listen, exc) from None
        log.info("metrics.listening", address=bound_address(listener))
        return listener

    async def serve(self, listener: Listener[SocketStream]) -> None:
        """Answer scrapes and sample the loop's lag until cancelled; the listener is closed on the way out."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.timings.sample_loop_lag)
            tg.start_soon(self._client_events.run)
            async with listener:
                await listener.serve(self._client, task_group=tg)

    async def _client(self, stream: SocketStream) -> None:
        await serve_client(stream, self.render, self._limiter, self._client_events)


def cannot_listen(listen: str, exc: OSError) -> OperatorError:
    return OperatorError(f"metrics.listen: cannot listen on {listen}: {exc.strerror or exc}",
                         "choose a free address in [metrics] listen, or remove it")


def refuse_taken_listen(listen: str) -> None:
    """Raise what `Metrics.listen` would when `listen` cannot be bound now (another daemon's port, say), before
    the start creates anything; each address it resolves to is bound and let go as the listener binds it
    (SO_REUSEADDR, so a port just let go by a stopped daemon is free). Port 0 is always free."""
    host, port = listen_address(listen)
    if port == 0:
        return
    try:
        for family, kind, proto, _name, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                        flags=socket.AI_PASSIVE):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as exc:
        raise cannot_listen(listen, exc) from None


def bound_address(listener: TypedAttributeProvider) -> str:
    """HOST:PORT the listener is bound to (the port chosen, when 0 was asked for)."""
    address = listener.extra(SocketAttribute.local_address)
    if isinstance(address, str):  # a UNIX socket's path: metrics listens on TCP only
        return address
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
