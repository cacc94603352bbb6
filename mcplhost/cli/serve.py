"""`mcplhost run` and `mcplhost dev`: the host until a signal, SIGHUP a reload (docs/operations.md#reload)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from .. import logs
from ..config import (
    Config,
    ConfigMissing,
    ConsoleConfig,
    control_socket_path,
    daemon_lock,
    default_config_path,
    read_config,
)
from ..console import FeedFormat
from ..control.server import refuse_taken_socket
from ..errors import ConfigError, OperatorError
from ..hardening import refuse_inspection_by_same_user
from ..host import Host, open_host
from ..lock import hold_database, refuse_if_held
from ..metrics import refuse_taken_listen
from ..protocol.grants import unknown_grant_problem
from ..reload import Reloads
from ..store.items import NewItem
from ..supervisor.children import recording_children
from ..systemd import Notifier, watchdog_interval_s
from .common import EXIT_OK, usable_database

# --- run / dev -----------------------------------------------------------------


async def _serve(config: Config, *, notifier: Notifier | None = None,
                 on_stored: Callable[[list[NewItem]], None] | None = None, seconds: float | None = None,
                 console: Callable[[], Coroutine[Any, Any, None]] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                 reread: Callable[[], Config] | None = None,
                 opened: Callable[[Host], None] | None = None) -> None:
    """Build the host and run it until SIGTERM/SIGINT (or `seconds` of `sleep`, dev's clock), then stop it
    gracefully. SIGHUP reads the config again with `reread` and applies it (docs/operations.md#reload).
    `opened`: called with the host once it is built and bound, before it runs (dev's banner names the
    console's address)."""
    stop = anyio.Event()
    watchdog = watchdog_interval_s()
    reloads = Reloads(reread)

    async def watch_signals(signals: AsyncIterator[int]) -> None:
        # SIGHUP is caught so that it never kills the daemon without its graceful stop; its reload runs in a
        # task of its own (mcplhost/reload.py), so SIGTERM is read, and stops the daemon, while one waits.
        async for signum in signals:
            structlog.get_logger().info("host.signal", signal=signal.Signals(signum).name)
            if signum == signal.SIGHUP:
                reloads.request()
                continue
            stop.set()
            return

    async def stop_after(delay: float) -> None:
        await sleep(delay)
        stop.set()

    # The handlers are ours before anything else runs and until the host is closed: a signal that comes while
    # the store opens waits in the receiver (the stop follows as soon as the host runs), and none is left to
    # the event loop, which would turn it into a cancellation that the start swallows.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_signals, signals)
            if seconds is not None:
                tg.start_soon(stop_after, seconds)
            if console is not None:  # dev's console relay (dev.ConsoleRelay), cancelled with the rest
                tg.start_soon(console)
            async with open_host(config, notifier=notifier, on_stored=on_stored,
                                 feed_format=console_lines() if config.console.listen else None) as host:
                if opened is not None:
                    opened(host)
                tg.start_soon(reloads.run, host, stop)
                await host.run(stop, watchdog_s=watchdog)
            tg.cancel_scope.cancel()


def _run_host(config: Config, *, notifier: Notifier | None = None,
              on_stored: Callable[[list[NewItem]], None] | None = None, seconds: float | None = None,
              console: Callable[[], Coroutine[Any, Any, None]] | None = None,
              sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
              reread: Callable[[], Config] | None = None, opened: Callable[[Host], None] | None = None) -> None:
    """Run `_serve`; an operator error raised inside its task groups comes out as itself.

    Task groups wrap what their tasks raise in an ExceptionGroup; a store that
    cannot be opened must still reach `main` as the one-line StoreError.
    """
    try:
        anyio.run(lambda: _serve(config, notifier=notifier, on_stored=on_stored, seconds=seconds, console=console,
                                 sleep=sleep, reread=reread, opened=opened))
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len(leaves) == 1 and isinstance(leaves[0], OperatorError):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def console_lines() -> FeedFormat:
    """The web console's live feed reads as dev's live view: mcplhost/dev.py formats both (passed down, since the
    console sits below dev: docs/architecture.md#layers)."""
    from ..dev import describe_event, describe_item

    return FeedFormat(item=describe_item, event=describe_event)


#: The address `dev --console` serves the console on: loopback, and a free port (printed on the banner).
DEV_CONSOLE_LISTEN = "127.0.0.1:0"


def _run_config(given: Path | None) -> Config:
    """The config `run` uses; a missing file says where it was looked for and how to point elsewhere."""
    path = given or default_config_path()
    try:
        return read_config(path, start_problems=False, unknown_grant=unknown_grant_problem)[0]
    except ConfigMissing as exc:
        if given is not None:
            raise
        origin = "from MCPLHOST_CONFIG" if os.environ.get("MCPLHOST_CONFIG") else "the default"
        raise ConfigError(exc.message, f"{origin}; pass --config PATH or set MCPLHOST_CONFIG") from None


def refuse_taken(config: Config) -> None:
    """Refuse a start whose database, control socket or metrics address another daemon holds, before it creates
    anything: the lock, the children file and the database are made only by a start that can go on (the lock
    is taken, and the socket and the address are bound, after this all the same)."""
    lock = daemon_lock(config)
    refuse_if_held(lock.subject, lock=lock.path, explanation=lock.explanation)
    refuse_taken_socket(control_socket_path(config))
    if config.metrics.listen:
        refuse_taken_listen(config.metrics.listen)


def cmd_run(args: argparse.Namespace) -> int:
    logs.configure(args.log_format, args.log_level)
    config = _run_config(args.config)
    refuse_taken(config)
    if not refuse_inspection_by_same_user():  # before any child: none may read our environment (api keys)
        structlog.get_logger().warning("host.inspectable", detail="could not mark the daemon non-dumpable: a "
                                       "connector running as the same user can read /proc/<pid>/environ")
    lock = daemon_lock(config)
    with hold_database(lock.subject, lock=lock.path, explanation=lock.explanation) as held, \
            recording_children(held):
        notifier = Notifier.from_environment(structlog.get_logger())
        try:
            _run_host(config, notifier=notifier, reread=lambda: _run_config(args.config))
        finally:
            notifier.close()
    return EXIT_OK


def _announce_console(host: Host, width: int) -> None:
    """The banner's last line under `dev --console`: where the web console is (never cut: it is copied)."""
    if host.console is not None and host.console.address is not None:
        print(f"  web console: http://{host.console.address}/ (docs/operations.md#console)",
              file=sys.stderr)


def cmd_dev(args: argparse.Namespace) -> int:
    from ..dev import (
        ConsoleRelay,
        LiveView,
        clock_sleep,
        config_beside,
        dev_config,
        fit,
        introduction,
        start_fresh,
        write_config,
    )

    view = LiveView.for_stream(sys.stdout)
    shown = args.verbose or args.log_format is not None or args.log_level is not None
    logs.configure(args.log_format or "console", args.log_level or "info", tap=view.event, show=shown)
    db = usable_database(args.db)
    view.database = str(db)
    refuse_taken(dev_config(db.resolve()))
    with hold_database(db.resolve()) as lock, recording_children(lock), ConsoleRelay() as relay:
        replaced = start_fresh(db)
        config = dev_config(db.resolve(), console_socket=relay.path)
        if args.console:
            config = msgspec.structs.replace(config, console=ConsoleConfig(listen=DEV_CONSOLE_LISTEN))
        write_config(config, config_beside(db))
        view.connectors = [c.name for c in config.connectors]
        width = LiveView.for_stream(sys.stderr).width
        for line in introduction(config, db, verbose=shown, replaced=replaced):
            print(fit(line, width), file=sys.stderr)
        _run_host(config, on_stored=view.items, seconds=args.seconds, console=relay.run, sleep=clock_sleep,
                  opened=lambda host: _announce_console(host, width))
    logs.shutdown()  # the log lines first, then the last word
    print(f"mcplhost dev: stopped; read it with: mcplhost messages --db {db}", file=sys.stderr)  # not cut: copied
    return EXIT_OK
