"""Hostile wire input through real processes: deep lines through `mcplhost run`, a peer that stops reading,
a peer over its byte budget. Each keeps a neighbour served.

The deep-line test runs the real daemon with scripted connectors
(tests/cli/support.py). The others drive `Session` over real child pipes
(`anyio.open_process`), so the pipe's own back-pressure is what is measured.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import anyio
import pytest

from mcplhost.rpc import ConnectionClosed, Deferred, RequestTimeout, Session, SessionLimits
from mcplhost.rpc.limits import MAX_NESTING_DEPTH

from ..builders import incoming, message, register
from ..cli.support import daemon, scripted_connector, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, record, wait_for

DEEP_PARAMS = "[" * 2000 + "]" * 2000


def deep_notification() -> dict[str, Any]:
    return {"raw": '{"jsonrpc":"2.0","method":"channels/incoming","params":{"messages":' + DEEP_PARAMS + "}}"}


def deep_request(request_id: int) -> dict[str, Any]:
    return {"raw": '{"jsonrpc":"2.0","id":%d,"method":"ping","params":' % request_id + DEEP_PARAMS + "}"}


def parse_errors(name: str, folder: Any) -> list[dict[str, Any]]:
    return [m for m in record(folder, name).received if m.get("error", {}).get("code") == -32700]


class TestDeepLinesThroughTheDaemon:
    async def test_deep_lines_before_and_after_the_handshake_leave_the_daemon_and_a_neighbour_running(
            self, tmp_path) -> None:
        """Nested 2,000 deep, before initialize is answered and after the policy: -32700 each; nothing stops."""
        hostile = scripted_connector("hostile", {
            "manifest": {"version": "0.5"}, "after": "start",
            "steps": [deep_notification(), deep_request(900), {"wait": "featureSets/update"},
                      deep_notification(), deep_request(901), {"request": "ping", "params": {}}],
        }, tmp_path, grant=[])
        neighbour = scripted_connector("neighbour", {
            "manifest": CHAT_MANIFEST,
            "steps": [register("room:1"), incoming(message("room:1", "m-1"))],
        }, tmp_path, grant=CHAT_GRANT)
        config = write_config(tmp_path, [hostile, neighbour])
        async with daemon(config, tmp_path) as run:
            await run.wait_event("host.ready")
            await wait_for(lambda: record(tmp_path, "hostile").done and record(tmp_path, "neighbour").done)
            await wait_for(lambda: len(parse_errors("hostile", tmp_path)) == 4)
            assert run.process.returncode is None  # still running
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        refused = parse_errors("hostile", tmp_path)
        assert all(m["id"] is None and str(MAX_NESTING_DEPTH) in m["error"]["message"] for m in refused)
        hostile_rec, neighbour_rec = record(tmp_path, "hostile"), record(tmp_path, "neighbour")
        kinds = [(e["kind"], e.get("step"), e.get("message", {}).get("id")) for e in hostile_rec.events]
        assert kinds.index(("step", 1, None)) < kinds.index(("out", None, 1))  # both sent before initialize's answer
        assert hostile_rec.answer(5) == {"kind": "answer", "step": 5, "result": {}}  # the connection went on
        assert neighbour_rec.answer(1)["result"]["results"][0]["accepted"] is True
        assert len(run.events("rpc.line_refused")) == 4
        assert len([e for e in hostile_rec.events if e["kind"] == "start"]) == 1  # one life: never restarted


# A child that answers nothing and reads nothing: its stdin fills and stays full.
DEAF = "import time; time.sleep(60)"
# A child that echoes every request it reads with a result {} (a neighbour that keeps working).
ECHO = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message and "method" in message:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {}}) + "\\n")
        sys.stdout.flush()
"""
# A child that writes COUNT requests of SIZE bytes each as fast as the pipe takes them, then waits.
FLOOD = """
import json, sys
count, size = int(sys.argv[1]), int(sys.argv[2])
for n in range(count):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": "hold", "params": ["x" * size]}) + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


async def child(code: str, *args: str) -> Any:
    return await anyio.open_process([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)


class TestAPeerThatStopsReading:
    async def test_requests_fail_at_their_timeouts_and_the_stalled_write_breaks_the_connection(self) -> None:
        """Lines of 256 KiB overfill the pipe: each request fails at 0.5 s, and the session ends on its own."""
        async with await child(DEAF) as deaf, await child(ECHO) as echo:
            session = Session(deaf.stdin, deaf.stdout,  # type: ignore[arg-type]
                              limits=SessionLimits(write_stall_s=1.5))
            neighbour = Session(echo.stdin, echo.stdout)  # type: ignore[arg-type]
            outcomes: list[float] = []

            async def call() -> None:
                start = anyio.current_time()
                with pytest.raises(RequestTimeout):
                    await session.request("big", ["x" * (256 * 1024)], timeout=0.5)
                outcomes.append(anyio.current_time() - start)

            ended = anyio.Event()

            async def run_until_it_ends(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                await session.run(task_status=task_status)
                ended.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(neighbour.run)
                    await tg.start(run_until_it_ends)
                    async with anyio.create_task_group() as calls:
                        for _ in range(8):
                            calls.start_soon(call)
                    await neighbour.request("ping", timeout=2)  # the neighbour is served meanwhile
                    await wait_for(lambda: session.statistics()["write_stalls"] == 1)
                    with anyio.fail_after(3):
                        await ended.wait()  # its run returns on its own: the child's stdout never ended
                    with pytest.raises(ConnectionClosed):
                        await session.request("after", timeout=0.5)
                    assert await neighbour.request("ping", timeout=2) is not None
                    tg.cancel_scope.cancel()
            assert len(outcomes) == 8 and max(outcomes) < 1.5
            deaf.kill()


class TestAPeerOverItsBudget:
    async def test_the_reader_pauses_the_neighbour_is_served_and_the_rest_is_processed_after(self) -> None:
        """40 held requests of 256 KiB against a 2 MiB budget: reading pauses under the budget, then all answer."""
        count, size, budget = 40, 256 * 1024, 2 * 1024 * 1024
        release = anyio.Event()
        held = 0

        async def on_request(method: str, params: Any) -> Any:
            async def work() -> Any:
                nonlocal held
                held += 1
                await release.wait()
                return {"ok": True}
            return Deferred(work)

        async with await child(FLOOD, str(count), str(size)) as flood, await child(ECHO) as echo:
            session = Session(flood.stdin, flood.stdout, on_request=on_request,  # type: ignore[arg-type]
                              limits=SessionLimits(max_pending_bytes=budget))
            neighbour = Session(echo.stdin, echo.stdout)  # type: ignore[arg-type]
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(neighbour.run)
                    tg.start_soon(session.run)
                    await wait_for(lambda: session.statistics()["reading_paused"])
                    await anyio.wait_all_tasks_blocked()
                    paused = session.statistics()
                    assert paused["pending_bytes"] <= budget
                    assert paused["requests"] == held < count  # the rest is still in the pipe, not in memory
                    for _ in range(5):
                        await neighbour.request("ping", timeout=2)  # served while the flood waits
                    release.set()
                    await wait_for(lambda: session.statistics()["requests"] == count and held == count)
                    await wait_for(lambda: session.statistics()["pending_bytes"] == 0)
                    tg.cancel_scope.cancel()
            assert session.statistics()["budget_pauses"] >= 1


class TestAPushBehindInference:
    async def test_a_push_written_after_eight_inference_requests_is_acked_while_the_model_holds_them(
            self, tmp_path) -> None:
        """Through `mcplhost run`, a hostile connector writes 8 inference/request and a push/event in
        one write, the model answering none of them: the push is acked on its own commit, before any admitted
        inference is answered (it was held until the 4 admitted ones ended)."""
        from ..agents.llm_server import LlmServer, Reply
        from ..builders import push

        ids = [f"r{i}" for i in range(8)]
        ask = {"featureSet": "think", "stream": False, "messages": [{"role": "user", "content": "2+2?"}]}
        lines = [{"jsonrpc": "2.0", "id": i, "method": "inference/request", "params": ask} for i in ids]
        lines.append({"jsonrpc": "2.0", "id": "p", "method": "push/event", "params": push("e-1")})
        manifest = {"version": "0.5", "pushEvents": True, "inferenceRequest": {}, "featureSets": {
            "think": {"description": "asks the model", "uses": ["inferenceRequest"]},
            "chat": {"description": "chat", "uses": ["pushEvents"]}}}
        llm = LlmServer(default=Reply(hang=True)).start()
        try:
            hostile = scripted_connector("hostile", {"manifest": manifest, "steps": [
                {"request": "push/event", "params": push("e-0")},  # leaves an idle worker behind, as traffic does
                {"raw": "\n".join(json.dumps(line) for line in lines)}]}, tmp_path,
                grant=["inferenceRequest", "pushEvents"])
            config = write_config(tmp_path, [hostile])
            with config.open("a", encoding="utf-8") as text:
                text.write(f'\n[inference]\n[inference.backend]\nkind = "openai"\nmodel = "m"\n'
                           f'base_url = "{llm.openai_base_url}"\ntimeout_s = 30\nmax_retries = 0\n')
            async with daemon(config, tmp_path) as run:
                await run.wait_event("host.ready")

                def answered() -> dict[str, Any]:
                    return {m["id"]: m for m in record(tmp_path, "hostile").received if "method" not in m}

                acked = await wait_for(lambda: answered().get("p"))
                inferences = [answered().get(i) for i in ids]  # as they stood when the push was acked
                # The admitted four reach the model on their own schedule (an HTTP request may still be on its
                # way at the ack); the model answers none of them, so the ack did not wait for any.
                await wait_for(lambda: len(llm.requests) >= 4)
                at_model = len(llm.requests)
                llm.close()  # the held requests fail now, so the stop need not wait for them
                llm = None
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
        finally:
            if llm is not None:
                llm.close()
        assert acked["result"] == {"accepted": True}
        assert at_model == 4
        assert [a["error"]["data"]["reason"] for a in inferences if a is not None] == ["busy"] * 4
