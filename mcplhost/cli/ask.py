"""The commands that ask the running daemon over its control socket: status, restart-connector."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
import msgspec

from ..config import (
    control_socket_path,
)
from ..control.client import NoDaemon, ask
from ..control.status import Status, render_table
from ..control.wire import Request, RestartRequest, StatusRequest
from ..errors import OperatorError
from .common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .serve import _run_config

# --- the control socket ------------------------------------------------------------------


class DaemonRefused(OperatorError):
    """The daemon answered, and refused the request."""


def _ask_daemon(args: argparse.Namespace, request: Request) -> Any:
    """The daemon's answer; no daemon answering is one stderr line and exit 2 (the caller returns it)."""
    path = control_socket_path(_run_config(args.config))
    try:
        answer = anyio.run(ask, path, request)
    except NoDaemon as exc:
        print(f"mcplhost: {exc}", file=sys.stderr)
        return None
    if not answer.ok:
        raise DaemonRefused(answer.error or "the daemon refused the request")
    return answer


def cmd_status(args: argparse.Namespace) -> int:
    answer = _ask_daemon(args, StatusRequest())
    if answer is None:
        return EXIT_USAGE
    if not isinstance(answer.status, msgspec.Raw):
        raise DaemonRefused("the daemon's answer holds no status object")
    problems = answer.problems
    if args.json:
        sys.stdout.buffer.write(bytes(answer.status) + b"\n")
        sys.stdout.flush()
    elif not args.check:
        for line in render_table(msgspec.json.decode(bytes(answer.status), type=Status)):
            print(line)
    if not args.check:
        return EXIT_OK
    for problem in problems:
        print(problem, file=sys.stderr if args.json else sys.stdout)
    return EXIT_ERROR if problems else EXIT_OK


def cmd_restart_connector(args: argparse.Namespace) -> int:
    if _ask_daemon(args, RestartRequest(name=args.name)) is None:
        return EXIT_USAGE
    print(f"{args.name}: restarting now, with a fresh restart budget")
    return EXIT_OK
