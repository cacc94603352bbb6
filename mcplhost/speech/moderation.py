"""Moderation of what an agent publishes, fail-closed (docs/agents.md#moderation).

    verdict = await moderator.check(text, agent, destination)   # never raises
    if not verdict.allowed: ...                                 # the segment becomes a draft

A `Moderator` answers one `Verdict` per segment. Anything but a clear "allow"
refuses: a refusal, a check that failed (`failed`: the command exited
non-zero, printed something that is not a verdict, timed out, the endpoint
answered an error). The pure parts (the request the command reads, the
verdict it prints, the refusal from flagged categories) are functions here;
`CommandModerator` is the I/O of kind "command". Kind "openai" needs the SDK,
which only the model backends import: mcplhost/agents/backends/moderator.py.

This module must not import mcplhost.agents (agents import speech).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Protocol

import anyio
import msgspec
import structlog
from anyio.abc import Process

from mcplhost.config import ModerationConfig
from mcplhost.speech.routing import Destination, Segment

log = structlog.get_logger()

#: The draft reason of a segment moderation refused, or whose check failed (docs/agents.md#drafts).
MODERATION = "moderation"
#: The most a moderation command may print on stdout: a verdict is a small object; more is an error.
MAX_VERDICT_BYTES = 64 * 1024
#: The most of a command's stderr kept for its log line (the rest is read and dropped).
MAX_STDERR_CHARS = 2000
#: The most of a verdict's reason that is logged.
MAX_REASON_CHARS = 300
#: How long a killed command may take to be reaped before it is left to the kernel.
REAP_S = 2.0
_READ_CHUNK = 65536


class Verdict(msgspec.Struct, frozen=True):
    """One check's answer: `allowed`, or why not; `failed` when the check itself did not work."""

    allowed: bool
    reason: str = ""
    failed: bool = False


class Moderator(Protocol):
    """Checks one segment before it is queued for publish; `check` never raises (an error is a failed verdict)."""

    async def check(self, text: str, agent: str, destination: str) -> Verdict: ...

    async def aclose(self) -> None: ...


def failure(reason: str) -> Verdict:
    """A check that did not work: refused all the same (fail-closed)."""
    return Verdict(allowed=False, reason=reason[:MAX_REASON_CHARS], failed=True)


def destination_name(destination: Destination) -> str:
    """A destination as a moderator is told it: `connector/channel-id`."""
    return f"{destination.server_id}/{destination.channel_id}"


async def check_publish(moderator: Moderator | None, text: str, agent: str, destination: Destination) -> Verdict:
    """One segment's verdict (allowed without a moderator); a refusal is logged, without the text."""
    if moderator is None:
        return Verdict(allowed=True)
    where = destination_name(destination)
    try:
        verdict = await moderator.check(text, agent, where)
    except Exception as exc:  # a Moderator must not raise; should one, the segment is still refused
        log.warning("moderation.check_raised", agent=agent, destination=where, exc_info=True)
        verdict = failure(f"{type(exc).__name__}: {exc}")
    if not verdict.allowed:
        log.warning("moderation.failed" if verdict.failed else "moderation.refused", agent=agent, destination=where,
                    reason=verdict.reason, chars=len(text))
    return verdict


async def moderated(moderator: Moderator | None, segments: list[Segment], agent: str) -> list[Segment]:
    """`segments` with every routed one that moderation does not allow turned into a draft (reason MODERATION)."""
    if moderator is None:
        return segments
    checked: list[Segment] = []
    for segment in segments:
        if segment.destination is not None and not (
                await check_publish(moderator, segment.text, agent, segment.destination)).allowed:
            segment = Segment(text=segment.text, destination=None, reason=MODERATION, target=segment.destination)
        checked.append(segment)
    return checked


# --- kind "command": the pure parts ------------------------------------------------------


class _CommandVerdict(msgspec.Struct):
    allow: bool
    reason: str = ""


def command_request(text: str, agent: str, destination: str) -> bytes:
    """What the command reads on stdin: one JSON object, destination as `connector/channel-id`.

    ASCII with escapes, so any model text (a lone surrogate included) is valid JSON in valid UTF-8.
    """
    return json.dumps({"text": text, "agent": agent, "destination": destination}).encode("ascii")


def command_verdict(stdout: bytes, returncode: int | None) -> Verdict:
    """The verdict a finished command gave: `{"allow": bool, "reason": str}` and exit status 0, or a failure."""
    if returncode != 0:
        return failure(f"moderation command exited with status {returncode}")
    try:
        answer = msgspec.json.decode(stdout, type=_CommandVerdict)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return failure(f"moderation command printed no verdict: {str(exc)[:MAX_REASON_CHARS]}")
    return Verdict(allowed=answer.allow, reason=answer.reason[:MAX_REASON_CHARS])


def flagged_verdict(flagged: bool, categories: Mapping[str, object]) -> Verdict:
    """A moderations-endpoint result: refused when flagged, the reason naming the flagged categories."""
    if not flagged:
        return Verdict(allowed=True)
    names = sorted(name for name, hit in categories.items() if hit is True)
    return Verdict(allowed=False, reason=("flagged: " + ", ".join(names)) if names else "flagged")


# --- kind "command": the I/O ----------------------------------------------------------------


class CommandModerator:
    """Kind "command": one run of the executable per segment, no shell, bounded by `timeout_s` as a whole.

    The command runs in its own process group, which is killed when the time
    is up or the turn is cancelled; its environment is the host's without the
    host's api key variables (`withheld`), as connectors get it.
    """

    def __init__(self, config: ModerationConfig, *, withheld: frozenset[str] = frozenset(),
                 environ: Mapping[str, str] = os.environ) -> None:
        if config.command is None:
            raise ValueError('[moderation] kind "command" needs command')  # mcplhost/config/ refuses it first
        self._argv = list(config.command)
        self._timeout_s = config.timeout_s
        self._env = {name: value for name, value in environ.items() if name not in withheld}

    async def check(self, text: str, agent: str, destination: str) -> Verdict:
        try:
            process = await anyio.open_process(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, env=self._env, start_new_session=True)
        except OSError as exc:
            return failure(f"moderation command could not start: {exc.strerror or exc}")
        stdout, stderr = bytearray(), bytearray()
        try:
            with anyio.fail_after(self._timeout_s):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_drain, process.stderr, stderr, MAX_STDERR_CHARS)
                    tg.start_soon(_feed, process, command_request(text, agent, destination))
                    overflow = await _read_bounded(process.stdout, stdout, MAX_VERDICT_BYTES)
                    if overflow:
                        tg.cancel_scope.cancel()
                if overflow:
                    return failure(f"moderation command printed more than {MAX_VERDICT_BYTES} bytes")
                await process.wait()
        except TimeoutError:
            return failure(f"moderation command gave no verdict within {self._timeout_s:g} s")
        finally:
            await _kill(process)
            if stderr:
                log.info("moderation.stderr", agent=agent, destination=destination,
                         stderr=stderr[:MAX_STDERR_CHARS].decode(errors="replace"))
        return command_verdict(bytes(stdout), process.returncode)

    async def aclose(self) -> None:
        return None


async def _feed(process: Process, request: bytes) -> None:
    """Write the request and close stdin; a command that exits without reading it is judged by its exit."""
    assert process.stdin is not None
    try:
        await process.stdin.send(request)
        await process.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass


async def _read_bounded(stream: anyio.abc.ByteReceiveStream | None, into: bytearray, limit: int) -> bool:
    """Read `stream` to its end into `into`; True as soon as it holds more than `limit` bytes."""
    assert stream is not None
    while True:
        try:
            chunk = await stream.receive(_READ_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        into += chunk
        if len(into) > limit:
            return True


async def _drain(stream: anyio.abc.ByteReceiveStream | None, into: bytearray, limit: int) -> None:
    """Read `stream` to its end, keeping its first `limit` bytes (a full pipe would block the command)."""
    assert stream is not None
    while True:
        try:
            chunk = await stream.receive(_READ_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        into += chunk[:max(0, limit - len(into))]


async def _kill(process: Process) -> None:
    """Kill the command's whole group (a shell script's children too) and reap it, shielded and bounded."""
    with anyio.CancelScope(shield=True):
        try:
            os.killpg(process.pid, signal.SIGKILL)  # it leads its own group (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass
        with anyio.move_on_after(REAP_S):
            await process.aclose()  # closes its pipes and reaps it
