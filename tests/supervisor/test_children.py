"""mcplhost/supervisor/children.py: the runtime file of connector groups and what the next start stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.supervisor.children import (
    CHILDREN_FILE_MAX_BYTES,
    ChildRecord,
    ProcessInfo,
    children_path,
    leftovers,
    parse_stat,
    read_process,
    recorded_groups,
    stop_leftovers,
)

from ..harness import alive, wait_for

UID = 1000


def proc(pid: int, pgid: int, start: int, *, sid: int | None = None, uid: int = UID) -> ProcessInfo:
    return ProcessInfo(pid=pid, pgid=pgid, sid=pgid if sid is None else sid, start=start, uid=uid)


class TestLeftovers:
    def test_the_leader_and_its_group_are_ours_while_the_start_time_matches(self) -> None:
        """A live leader with the recorded start time: it and every member of its session and group."""
        processes = [proc(100, 100, 50), proc(101, 100, 60), proc(200, 200, 10), proc(102, 100, 70, uid=0)]
        assert leftovers(processes, 100, 50, UID) == [100, 101]

    def test_a_reused_pid_is_left_alone(self) -> None:
        """The leader's pid now has another start time: another program's group, nothing is ours."""
        assert leftovers([proc(100, 100, 999), proc(101, 100, 1000)], 100, 50, UID) == []

    def test_members_outlive_a_dead_leader(self) -> None:
        """The leader killed (the parent-death signal), its children still in the group: those are stopped."""
        assert leftovers([proc(101, 100, 60), proc(102, 100, 61, sid=7)], 100, 50, UID) == [101]

    @given(st.lists(st.builds(proc, st.integers(2, 50), st.integers(2, 50), st.integers(0, 100),
                              sid=st.integers(2, 50), uid=st.sampled_from([0, UID])), max_size=20),
           st.integers(2, 50), st.integers(0, 100))
    def test_nothing_outside_the_rule_is_ever_named(self, processes: list[ProcessInfo], pgid: int, start: int) -> None:
        """Every pid named is in the group and session, this user's, and no older than the recorded leader."""
        found = leftovers(processes, pgid, start, UID)
        by_pid = {p.pid: p for p in processes}
        leader = next((p for p in processes if p.pid == pgid), None)
        assert not found or leader is None or leader.start == start
        for pid in found:
            member = next(p for p in processes if p.pid == pid)
            assert (member.pgid, member.sid, member.uid) == (pgid, pgid, UID) and member.start >= start
        assert set(found) <= set(by_pid)


class TestFiles:
    def test_a_stat_line_with_a_strange_name_parses(self) -> None:
        """The command name may hold spaces and parentheses; fields are read after the last one."""
        fields = ["S", "1", "42", "42"] + ["0"] * 15 + ["12345"] + ["0"] * 10
        info = parse_stat(43, "43 (evil) (name) " + " ".join(fields), UID)
        assert info == ProcessInfo(pid=43, pgid=42, sid=42, start=12345, uid=UID)
        assert parse_stat(43, "garbage", UID) is None

    def test_the_file_is_beside_the_lock_and_junk_lines_are_skipped(self, tmp_path) -> None:
        """`x.db.lock` → `x.db.children`; lines that are not two numbers (or name pid 0 or 1) are ignored."""
        assert children_path(tmp_path / "x.db.lock") == tmp_path / "x.db.children"
        path = tmp_path / "x.db.children"
        path.write_text("100 50\nnonsense\n1 5\n-3 4\n200 60 7\n300 70\n", encoding="ascii")
        assert recorded_groups(path) == [(100, 50), (300, 70)]
        path.write_bytes(b"100 50\n" * (CHILDREN_FILE_MAX_BYTES // 7 + 1))
        assert recorded_groups(path) == []

    def test_a_record_follows_its_children(self, tmp_path) -> None:
        """add writes `pid start` (mode 0600), remove takes it out again."""
        record = ChildRecord(tmp_path / "x.db.children")
        record.add(os.getpid())
        own = read_process(os.getpid())
        assert own is not None
        assert recorded_groups(record.path) == [(os.getpid(), own.start)]
        assert record.path.stat().st_mode & 0o777 == 0o600
        record.remove(os.getpid())
        assert recorded_groups(record.path) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
class TestStopLeftovers:
    @contextmanager
    def group(self) -> Iterator[tuple[int, int]]:
        """A session leader with a child of its own in its group: (leader, member); both killed afterwards."""
        leader = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; exec sleep 300"], stdout=subprocess.PIPE,
                                  start_new_session=True)
        try:
            assert leader.stdout is not None
            yield leader.pid, int(leader.stdout.readline())
        finally:
            with suppress(ProcessLookupError):
                os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()
            assert leader.stdout is not None
            leader.stdout.close()

    async def test_a_recorded_group_is_stopped_whole(self, tmp_path) -> None:
        """Both the leader and the process it started are SIGKILLed; their pids are returned."""
        with self.group() as (leader, member):
            record = ChildRecord(tmp_path / "x.db.children")
            record.add(leader)
            assert sorted(stop_leftovers(record.path)) == sorted([leader, member])
            await wait_for(lambda: not alive(leader) and not alive(member), timeout=10)

    async def test_a_group_with_another_start_time_is_not_touched(self, tmp_path) -> None:
        """A record whose start time does not match the live leader (a reused pid) stops nothing."""
        with self.group() as (leader, member):
            path = tmp_path / "x.db.children"
            path.write_text(f"{leader} 1\n", encoding="ascii")
            assert stop_leftovers(path) == [] and alive(leader) and alive(member)
