"""Benchmark reading hostile connector answers: the loop's longest stall, in a worker thread and on the loop.

Typed answers (protocol/answers.py) judge list entries one by one, and a
malformed entry costs msgspec an exception (about 1–2 µs), so a line of
millions of them is seconds of work. protocol/jobs.py reads a `tools/list`
page, and agents/tools/toolbox.py a `tools/call` result, in a worker thread; this
prints what each costs and how long the event loop could not run meanwhile,
next to the same read done on the loop (what a reader without the thread
would stall for). The answers are near the line bound (rpc/limits.py
MAX_LINE_BYTES, 16 MiB).

Run: .venv/bin/python tests/bench/bench_answers.py [entries]   (default: as many as fit in a line)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from looplag import LoopLagProbe  # type: ignore[import-not-found]  # run from tests/bench, as the others

from mcplhost.agents.tools.outcome import call_result_blocks
from mcplhost.inbound import mark_openings
from mcplhost.protocol.jobs import read_tools_page
from mcplhost.rpc.limits import MAX_LINE_BYTES

#: Entries of each answer: each 2 bytes ("1,"), so the answer is just under the line bound.
ENTRIES = int(sys.argv[1]) if len(sys.argv) > 1 else (MAX_LINE_BYTES - 64) // 2


def answer(member: str) -> msgspec.Raw:
    return msgspec.Raw(b'{"' + member.encode() + b'":[' + b",".join([b"1"] * ENTRIES) + b"]}")


async def measure(label: str, read: Callable[[msgspec.Raw], Any], raw: msgspec.Raw) -> None:
    for where in ("worker thread", "on the loop"):
        async with LoopLagProbe() as probe:
            await anyio.sleep(0.05)
            started = time.perf_counter()
            if where == "worker thread":
                await anyio.to_thread.run_sync(read, raw)
            else:
                read(raw)
            took = time.perf_counter() - started
            await anyio.sleep(0.05)
        print(f"{label}, {where}: {took:.2f} s; {probe.summary()}")


def untyped_tools_page(raw: msgspec.Raw) -> int:
    """The reading before typed answers, as a baseline: decode to Python values, then probe each entry."""
    page = msgspec.json.decode(raw)
    tools = page.get("tools") if isinstance(page, dict) else None
    return sum(1 for tool in tools if not (isinstance(tool, dict) and isinstance(tool.get("name"), str)))


def untyped_call_result(raw: msgspec.Raw) -> int:
    """The tools/call reading before typed answers, as a baseline: probe each block, then mark them all."""
    result = msgspec.json.decode(raw)
    blocks = []
    for block in result.get("content") if isinstance(result, dict) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            blocks.append({"type": "text", "text": block["text"]})
        else:
            blocks.append({"type": "text", "text": f"[host] a {kind if isinstance(kind, str) else 'malformed'}"
                                                   " block of the result is left out"})
    return len(mark_openings(blocks))


async def baseline(label: str, read: Callable[[msgspec.Raw], Any], raw: msgspec.Raw) -> None:
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.05)
        started = time.perf_counter()
        read(raw)
        took = time.perf_counter() - started
        await anyio.sleep(0.05)
    print(f"baseline, untyped {label} (isinstance probing, as before), on the loop: {took:.2f} s; {probe.summary()}")


async def main() -> None:
    print(f"{ENTRIES:,} malformed entries in a {len(answer('tools')) / (1 << 20):.1f} MiB answer")
    await baseline("tools/list page", untyped_tools_page, answer("tools"))
    await measure("tools/list page", read_tools_page, answer("tools"))
    await baseline("tools/call result", untyped_call_result, answer("content"))
    await measure("tools/call result", call_result_blocks, answer("content"))


if __name__ == "__main__":
    anyio.run(main)
