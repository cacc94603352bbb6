from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule

from mcplhost.rpc.table import RequestTable, Settled


class RequestTableMachine(RuleBasedStateMachine):
    """The table agrees with a plain dict of outstanding ids and a set of abandoned ones."""

    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.table = RequestTable(late_memory=10_000)
        self.outstanding: dict[int, str] = {}
        self.abandoned: set[int] = set()

    @rule(target=ids, method=st.sampled_from(["a", "b"]))
    def send(self, method: str) -> int:
        request_id = self.table.open(method)
        assert request_id not in self.outstanding and request_id not in self.abandoned
        self.outstanding[request_id] = method
        return request_id

    @rule(request_id=ids)
    def answer(self, request_id: int) -> None:
        settled, method = self.table.settle(request_id)
        if request_id in self.outstanding:
            assert (settled, method) == (Settled.MATCHED, self.outstanding.pop(request_id))
        elif request_id in self.abandoned:
            assert settled is Settled.LATE
            self.abandoned.discard(request_id)
        else:
            assert settled is Settled.UNKNOWN

    @rule(request_id=st.one_of(st.integers(min_value=10_000), st.text(), st.none()))
    def answer_unknown(self, request_id) -> None:
        assert self.table.settle(request_id)[0] is Settled.UNKNOWN

    @rule(request_id=ids)
    def time_out(self, request_id: int) -> None:
        self.table.abandon(request_id)
        if self.outstanding.pop(request_id, None) is not None:
            self.abandoned.add(request_id)

    @rule()
    def close(self) -> None:
        closed = self.table.close()
        assert set(closed) == set(self.outstanding)
        self.abandoned |= set(self.outstanding)
        self.outstanding.clear()


TestRequestTable = RequestTableMachine.TestCase


class TestLateMemory:
    def test_late_ids_are_remembered_in_a_bounded_window(self) -> None:
        """Beyond the window an abandoned id reads as unknown, so memory stays bounded."""
        table = RequestTable(late_memory=2)
        ids = [table.open("m") for _ in range(3)]
        for request_id in ids:
            table.abandon(request_id)
        assert table.settle(ids[0])[0] is Settled.UNKNOWN
        assert table.settle(ids[2])[0] is Settled.LATE

    def test_a_string_id_never_matches_our_integer_ids(self) -> None:
        """Our ids are ints; "1" is another id."""
        table = RequestTable()
        table.open("m")
        assert table.settle("1")[0] is Settled.UNKNOWN
        assert table.settle(1)[0] is Settled.MATCHED
