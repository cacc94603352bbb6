"""The control protocol's lines (mcplhost/control/wire.py): round trips, and junk is a WireError only."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.control.wire import (
    Answer,
    RestartRequest,
    StatusRequest,
    WireError,
    decode_answer,
    decode_request,
    encode,
)


class TestWire:
    @given(st.text(min_size=1, max_size=256))
    def test_a_restart_request_round_trips(self, name: str):
        """Any connector name comes back as sent, on one line."""
        line = encode(RestartRequest(name=name))
        assert line.count(b"\n") == 1 and line.endswith(b"\n")
        assert decode_request(line) == RestartRequest(name=name)

    def test_status_request_and_answer(self):
        """The status request is its command alone; an answer keeps the daemon's object bytes."""
        assert encode(StatusRequest()) == b'{"command":"status"}\n'
        answer = decode_answer(encode(Answer(ok=True, status=msgspec.Raw(b'{"host":{}}'), problems=["a: b"])))
        assert bytes(answer.status) == b'{"host":{}}' and answer.problems == ["a: b"]  # type: ignore[arg-type]

    @given(st.binary())
    def test_any_bytes_are_a_request_or_a_wire_error(self, data: bytes):
        """Junk never raises anything else."""
        try:
            decode_request(data)
        except WireError:
            pass

    @pytest.mark.parametrize("line", [b'{"command": "status", "extra": 1}', b'{"command": "restart-connector"}',
                                      b'{"command": "restart-connector", "name": ""}', b'{"name": "x"}'])
    def test_malformed_requests_are_refused(self, line: bytes):
        """Unknown fields, a missing or empty name, no command: each a WireError."""
        with pytest.raises(WireError):
            decode_request(line)
