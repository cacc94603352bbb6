"""The status object's pure parts (mcplhost/control/status.py): --check, the table, STATUS=."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.agents.wakes.scheduler import SchedulerStats
from mcplhost.control.status import (
    STANDBY,
    AgentCounts,
    HostEntry,
    HostStatus,
    Standby,
    Status,
    build_status,
    check_problems,
    render_table,
    systemd_status,
)
from mcplhost.protocol.ports import State
from mcplhost.supervisor.handle import ConnectorStatistics

HOST = HostStatus(pid=1, version="0.2.0", started_at=0, schema_version=6, db="/d/m.db", db_bytes=4096)
NOW = 1_790_000_000_000


def connector(name: str, state: State, *, quiet: bool = False, error: str | None = None) -> ConnectorStatistics:
    return ConnectorStatistics(name=name, state=state, pid=None, restarts=0, last_error=error,
                               last_inbound_at=None, channels=0, grant=frozenset({"b", "a"}), quiet=quiet)


def status_of(*connectors: ConnectorStatistics) -> Status:
    return build_status(HOST, connectors, {"scout": SchedulerStats("idle", 0, False, 2)}, {})


class TestCheck:
    def test_ready_mcp_only_and_backoff_are_healthy(self):
        """No problem lines for the states a working connector passes through."""
        status = status_of(connector("a", State.READY), connector("b", State.MCP_ONLY), connector("c", State.BACKOFF))
        assert check_problems(status, {}) == []

    def test_stopped_is_a_problem_unless_its_policy_is_never(self):
        """Policy never meant it to stop; any other policy did not."""
        status = status_of(connector("a", State.STOPPED, error="the process exited with code 1"),
                           connector("b", State.STOPPED))
        assert check_problems(status, {"a": "on-failure", "b": "never"}) == [
            "a: stopped (no more starts in this run); last error: the process exited with code 1"]

    def test_a_problem_line_is_one_printable_line(self):
        """A last error with line breaks and escapes stays on its problem's line, made harmless and bounded."""
        status = status_of(connector("a", State.SLOW_LANE, error="x\n\x1b[31mred\n" + "y" * 1000))
        (line,) = check_problems(status, {})
        assert "\n" not in line and "\x1b" not in line and "x \ufffd[31mred" in line and len(line) < 300

    def test_slow_lane_and_quiet_each_give_a_line_beginning_with_the_name(self):
        """One line per problem; a quiet ready connector is one."""
        status = status_of(connector("loop", State.SLOW_LANE), connector("hush", State.READY, quiet=True))
        problems = check_problems(status, {})
        assert [p.split(":")[0] for p in problems] == ["loop", "hush"]
        assert problems[0].startswith("loop: slow_lane") and problems[1].startswith("hush: quiet")

    @given(st.lists(st.tuples(st.sampled_from(list(State)), st.booleans(),
                              st.sampled_from(["always", "on-failure", "never"])), max_size=8))
    def test_healthy_exactly_when_the_documented_rule_says(self, entries):
        """No problems iff every connector is ready, mcp_only, backoff or stopped under never, and none is quiet."""
        connectors = [connector(f"c{i}", state, quiet=quiet) for i, (state, quiet, _) in enumerate(entries)]
        policies = {f"c{i}": policy for i, (_, _, policy) in enumerate(entries)}
        healthy = all((state in (State.READY, State.MCP_ONLY, State.BACKOFF)
                       or (state is State.STOPPED and policy == "never")) and not quiet
                      for state, quiet, policy in entries)
        problems = check_problems(status_of(*connectors), policies)
        assert (problems == []) == healthy
        assert all(any(p.startswith(f"{c.name}: ") for c in connectors) for p in problems)


class TestAgentCheck:
    def test_an_agent_whose_newest_turn_failed_is_a_problem_line_beginning_with_its_name(self):
        """lastError set: one line naming the agent, its error (printable) and the failures of the hour."""
        agents = {"scout": SchedulerStats("idle", 0, False, 2), "quiet": SchedulerStats("idle", 0, False, 0)}
        counts = {"scout": AgentCounts(last_error="backend_error: missing_key\x1b[2J", failed_turns_last_hour=2)}
        status = build_status(HOST, [connector("a", State.READY)], agents, counts)
        assert check_problems(status, {}) == [
            "scout: its newest turn failed (backend_error: missing_key\ufffd[2J); 2 failed turns in the last hour"]
        (row,) = [line for line in render_table(status, now_ms=NOW) if line.startswith("scout")]
        assert row.split()[-4:] == ["2", "-", "backend_error:", "missing_key\ufffd[2J"]


class TestObject:
    def test_keys_in_the_documented_order_and_a_sorted_grant(self):
        """host, connectors, agents with their camelCase names; grant sorted."""
        encoded = msgspec.json.decode(msgspec.json.encode(status_of(connector("a", State.READY))))
        assert list(encoded) == ["host", "connectors", "agents", "hosts"]
        assert list(encoded["host"]) == ["pid", "version", "startedAt", "schemaVersion", "db", "dbBytes"]
        assert list(encoded["connectors"][0]) == ["name", "state", "pid", "restarts", "lastError", "lastInboundAt",
                                                  "lastPublishAt", "channels", "grant", "quiet"]
        assert encoded["connectors"][0]["grant"] == ["a", "b"]
        assert encoded["agents"] == [{"name": "scout", "state": "idle", "pendingWakes": 0, "queuedPeerMessages": 0,
                                      "drafts": 0, "outboxPending": 0, "turnsLastHour": 2, "held": False,
                                      "lastError": None, "failedTurnsLastHour": 0}]

    def test_a_standby_connector_has_no_pid_names_its_owner_and_is_healthy(self):
        """Another live host runs it (a shared store): state `standby`, `pid` null, `owner` last; --check is content,
        and a quiet verdict of this host's idle handle is not reported."""
        stats = msgspec.structs.replace(connector("a", State.STARTING, quiet=True), pid=4242)
        status = build_status(HOST, [stats, connector("b", State.READY)], {}, {},
                              standby={"a": Standby("eu-2")})
        encoded = msgspec.json.decode(msgspec.json.encode(status))["connectors"]
        assert (encoded[0]["state"], encoded[0]["pid"], encoded[0]["quiet"]) == ("standby", None, False)
        assert list(encoded[0])[-1] == "owner" and encoded[0]["owner"] == "eu-2"
        assert "owner" not in encoded[1]
        assert check_problems(status, {}) == []


class TestTable:
    def test_a_standby_connector_s_state_names_the_host_that_runs_it(self):
        """standby (eu-2); before the owner is known, standby (-)."""
        status = build_status(HOST, [connector("a", State.STARTING), connector("b", State.STARTING),
                                     connector("c", State.READY)], {}, {},
                              standby={"a": Standby("eu-2"), "b": Standby(None)})
        rows = {line.split()[0]: line for line in render_table(status, now_ms=NOW)
                if line[:2] in ("a ", "b ", "c ")}
        assert rows["a"].split()[1:4] == ["standby", "(eu-2)", "-"]  # then the pid column: none
        assert rows["b"].split()[1:3] == ["standby", "(-)"] and rows["c"].split()[1] == "ready"

    def test_one_row_per_connector_and_agent_and_an_error_kept_on_its_line(self):
        """A multi-line last error stays in its row, cut to the cell's width."""
        status = status_of(connector("disc", State.BACKOFF, error="line one\nline two " + "x" * 100))
        lines = render_table(status, now_ms=NOW)
        assert lines[0].startswith("mcplhost 0.2.0  pid 1") and "schema 6" in lines[0]
        (row,) = [line for line in lines if line.startswith("disc")]
        assert "backoff" in row and "line one line two" in row and row.endswith("…")
        assert any(line.startswith("scout") and "idle" in line for line in lines)

    def test_nothing_a_terminal_acts_on_reaches_it(self):
        """Escape sequences and bidi controls in an error text become U+FFFD; the JSON keeps them, escaped."""
        status = status_of(connector("disc", State.BACKOFF, error="bad \x1b[2J\x1b]0;owned\x07 \u202eevil"))
        (row,) = [line for line in render_table(status, now_ms=NOW) if line.startswith("disc")]
        assert "\x1b" not in row and "\x07" not in row and "\u202e" not in row
        assert "bad \ufffd[2J\ufffd]0;owned\ufffd \ufffdevil" in row

    def test_hosts_sharing_a_store_get_a_table_and_a_host_alone_none(self):
        """Several hosts: one row each with what it owns; a host alone on its store (SQLite) adds no table."""
        def entry(name: str, connectors: list[str], agents: list[str]) -> HostEntry:
            return HostEntry(name=name, pid=7, version="0.2.0", started_at=NOW - 60_000, heartbeat_age_ms=1500,
                             connectors=connectors, agents=agents)

        two = build_status(HOST, [], {}, {}, [entry("eu-1", ["disc"], ["scout"]), entry("eu-2", [], [])])
        lines = render_table(two, now_ms=NOW)
        (header,) = [line for line in lines if line.startswith("HOST")]
        assert header.split() == ["HOST", "PID", "VERSION", "UP", "SINCE", "HEARTBEAT", "CONNECTORS", "AGENTS"]
        assert [line.split() for line in lines if line.startswith("eu-")] == [
            ["eu-1", "7", "0.2.0", "1m", "ago", "1.5s", "disc", "scout"], ["eu-2", "7", "0.2.0", "1m", "ago", "1.5s",
                                                                           "-", "-"]]
        alone = build_status(HOST, [], {}, {}, [entry("eu-1", [], [])])
        assert not any(line.startswith("HOST") for line in render_table(alone, now_ms=NOW))

    def test_an_empty_host_says_so(self):
        """No connectors and no agents are named as such, not left as bare headers."""
        lines = render_table(build_status(HOST, [], {}, {}), now_ms=NOW)
        assert "no connectors configured" in lines and "no agents configured" in lines


class TestSystemdStatus:
    def test_counts_by_state_in_a_fixed_order(self):
        """Serving first, trouble last; states with none are left out."""
        states = [State.SLOW_LANE, State.READY, State.READY, State.BACKOFF]
        assert systemd_status(states) == "4 connectors: 2 ready, 1 backoff, 1 slow_lane"
        assert systemd_status([]) == "0 connectors"
        assert systemd_status([State.READY]) == "1 connector: 1 ready"

    def test_a_connector_on_standby_is_counted_apart_from_starting_ones(self):
        """Its handle idles in `starting` while another host runs it: the line says standby, after the serving."""
        assert systemd_status([State.STARTING, STANDBY, State.READY, STANDBY]) == (
            "4 connectors: 1 ready, 2 standby, 1 starting")
