"""`mcplhost backup` under load, `messages --since` and `--follow` (docs/operations.md#backups-retention-and-following)."""

from __future__ import annotations

import json
import signal
import sqlite3
import stat
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.cli.common import EPOCH_MS_MAX_DIGITS, FOLLOW_POLL_S, SINCE_UNITS_MS, parse_since
from mcplhost.store import NewItem, open_reader, open_store

from ..harness import PYTHON, config_with
from ..memory_pair import memory_host
from ..properties import examples
from .support import cli, cli_env

NOW = 1_800_000_000_000


def item(text: str, created_at: int, channel: str = "disc:g1:a", agent: str | None = None) -> NewItem:
    return NewItem(role="user", content=[{"type": "text", "text": text}],
                   metadata={"serverId": "disc", "channelId": channel}, created_at=created_at, agent=agent,
                   participant="Alice")


class TestSinceGrammar:
    @settings(max_examples=examples(80), deadline=None)
    @given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31)))
    def test_iso_utc_times_read_back_to_the_millisecond(self, moment: datetime) -> None:
        moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000, tzinfo=UTC)
        text = moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{moment.microsecond // 1000:03d}Z"
        assert parse_since(text, NOW) == (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)

    @settings(max_examples=examples(80), deadline=None)
    @given(st.integers(0, 10**9 - 1), st.sampled_from(sorted(SINCE_UNITS_MS)))
    def test_relative_times_count_back_from_now(self, amount: int, unit: str) -> None:
        ago = amount * SINCE_UNITS_MS[unit]
        if ago > 100 * 366 * 86_400_000:
            with pytest.raises(ValueError):
                parse_since(f"{amount}{unit}", NOW)
        else:
            assert parse_since(f"{amount}{unit}", NOW) == NOW - ago

    @settings(max_examples=examples(100), deadline=None)
    @given(st.text(alphabet="0123456789smhdTZ:.-+ x", max_size=30) | st.text(max_size=20))
    def test_anything_else_is_a_value_error_never_another_exception(self, text: str) -> None:
        try:
            value = parse_since(text, NOW)
        except ValueError:
            return
        assert isinstance(value, int)

    @pytest.mark.parametrize("text", ["2026-12-01T10:00:00", "2026-12-01T10:00:00+02:00", "2026-12-01",
                                      "2026-02-30T00:00:00Z", "yesterday", "10 m", "-5m", "1.5h", "10w", "",
                                      "1" * (EPOCH_MS_MAX_DIGITS + 1), "١٢٣"])
    def test_refused(self, text: str) -> None:
        with pytest.raises(ValueError):
            parse_since(text, NOW)

    def test_the_documented_forms(self) -> None:
        assert parse_since("2026-12-01T10:00:00Z", NOW) == 1_796_119_200_000
        assert parse_since("2026-12-01T10:00Z", NOW) == 1_796_119_200_000
        assert parse_since("1796119200000", NOW) == 1_796_119_200_000
        assert parse_since("10m", NOW) == NOW - 600_000
        assert parse_since("3d", NOW) == NOW - 3 * 86_400_000


class TestSince:
    async def test_only_items_created_at_or_after_time(self, tmp_path: Path) -> None:
        db = tmp_path / "host.db"
        async with open_store(db) as store:
            await store.items.insert_many([item(f"t{n}", 1_796_119_200_000 + (n - 2) * 1000) for n in range(5)])
        result = cli("messages", "--db", str(db), "--json", "--since", "2026-12-01T10:00:00Z")
        assert result.returncode == 0, result.stderr
        assert [json.loads(line)["content"][-1]["text"] for line in result.stdout.splitlines()] == ["t2", "t3", "t4"]
        limited = cli("messages", "--db", str(db), "--json", "--since", "1796119200000", "--limit", "1")
        assert [json.loads(line)["content"][-1]["text"] for line in limited.stdout.splitlines()] == ["t4"]

    def test_a_bad_time_is_one_usage_line(self, tmp_path: Path) -> None:
        result = cli("messages", "--db", str(tmp_path / "x.db"), "--since", "yesterday")
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert "not a time: 'yesterday'" in line and "10m" in line


class TestBackup:
    async def test_under_load_the_copy_is_whole_and_holds_what_was_committed_before(self, tmp_path: Path) -> None:
        db, out = tmp_path / "host.db", tmp_path / "backups" / "copy.db"
        out.parent.mkdir()
        committed = 0
        stop = anyio.Event()
        async with memory_host(config_with(tmp_path)) as host:  # the daemon's store and group writer, running
            writer = host.writer

            async def load() -> None:
                nonlocal committed
                n = 0
                while not stop.is_set():
                    await writer.store_items([item(f"load {n}-{k} " + "x" * 500, NOW) for k in range(50)])
                    committed += 50
                    n += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(load)
                while committed < 5000:  # a database of many pages, growing while it is copied
                    await anyio.sleep(0.01)
                before = committed
                result = await anyio.to_thread.run_sync(lambda: cli("backup", "--db", str(db), str(out)))
                during = committed - before
                stop.set()
                tg.cancel_scope.cancel()
        assert result.returncode == 0, result.stderr
        assert during > 0, "nothing was committed while the backup ran: not a test under load"
        assert "integrity_check ok" in result.stdout
        with sqlite3.connect(out) as copy:
            assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        async with open_reader(out) as reader:
            assert await reader.items.last_id() >= before
        assert not list(out.parent.glob(".copy.db.partial-*"))
        assert stat.S_IMODE(out.stat().st_mode) == 0o600  # every chat is in it: private like the database

    async def test_an_existing_out_is_refused_and_left_alone(self, tmp_path: Path) -> None:
        db, out = tmp_path / "host.db", tmp_path / "copy.db"
        async with open_store(db) as store:
            await store.items.insert(item("one", NOW))
        out.write_bytes(b"keep me")
        result = cli("backup", "--db", str(db), str(out))
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert "already exists" in line
        assert out.read_bytes() == b"keep me"

    def test_a_missing_database_is_an_operator_error(self, tmp_path: Path) -> None:
        result = cli("backup", "--db", str(tmp_path / "none.db"), str(tmp_path / "copy.db"))
        assert result.returncode == 1
        assert len(result.stderr.splitlines()) == 1
        assert not (tmp_path / "copy.db").exists()


class TestFollow:
    async def test_a_committed_item_is_shown_at_a_poll_and_another_channels_is_not(self, tmp_path: Path) -> None:
        """A new item of the followed channel is printed, the other channel's is not. Within 1 s is the poll's
        rule (FOLLOW_POLL_S), not this test's clock: a busy machine can hold the reader longer than that."""
        assert FOLLOW_POLL_S <= 1.0
        db = tmp_path / "host.db"
        async with open_store(db) as store:
            await store.items.insert_many([item("old", NOW), item("other channel", NOW, channel="disc:g1:b")])
            async with await anyio.open_process(
                    [PYTHON, "-m", "mcplhost", "messages", "--db", str(db), "--follow", "--json",
                     "--channel", "disc:g1:a"], env=cli_env(), stdin=subprocess.DEVNULL) as process:
                assert process.stdout is not None
                lines = _lines(process.stdout)
                try:
                    with anyio.fail_after(30):
                        assert json.loads(await anext(lines))["content"][-1]["text"] == "old"
                    # Not printed: another channel. Printed: the new item in the followed channel.
                    await store.items.insert(item("elsewhere", NOW, channel="disc:g1:b"))
                    await store.items.insert(item("new", NOW))
                    committed = time.monotonic()
                    with anyio.fail_after(5):
                        shown = json.loads(await anext(lines))
                    latency = time.monotonic() - committed
                    assert shown["content"][-1]["text"] == "new"
                    print(f"--follow showed the item {latency * 1000:.0f} ms after its commit")
                    process.send_signal(signal.SIGINT)
                    with anyio.fail_after(10):
                        assert await process.wait() == 0
                finally:
                    if process.returncode is None:
                        process.kill()

    async def test_a_closed_stdout_ends_it_with_exit_0(self, tmp_path: Path) -> None:
        db = tmp_path / "host.db"
        async with open_store(db) as store:
            await store.items.insert(item("one", NOW))
        process = subprocess.Popen([PYTHON, "-m", "mcplhost", "messages", "--db", str(db), "--follow"],
                                   env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
        assert process.stdout is not None and process.stderr is not None
        try:
            assert "one" in process.stdout.readline().decode()
            process.stdout.close()  # the reader goes away while nothing new arrives
            assert process.wait(timeout=20) == 0
            with process.stderr:
                assert process.stderr.read() == b""
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


async def _lines(stream):
    buffered = b""
    async for chunk in stream:
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line
