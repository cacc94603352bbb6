"""The request-head decision of mcplhost/metrics/http.py, as a pure function over any bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.metrics.http import METRICS_PATH, REASONS, Answer, parse_head, response

TARGET = st.from_regex(rb"\A/[\x21-\x7e]{0,40}\Z")


class TestParseHead:
    @given(st.binary(max_size=300))
    def test_any_bytes_get_a_known_status(self, head: bytes) -> None:
        """No input raises; every answer is one the server can send."""
        assert parse_head(head).status in REASONS

    @given(st.sampled_from([b"GET", b"HEAD"]), st.from_regex(rb"\A(\?[\x21-\x7e]{0,20})?\Z"),
           st.sampled_from([b"0", b"1"]), st.binary(max_size=100))
    def test_get_or_head_of_metrics_is_served(self, method: bytes, query: bytes, minor: bytes, rest: bytes) -> None:
        """GET (with the body) or HEAD (without) of /metrics, any query, any headers after the line."""
        head = method + b" " + METRICS_PATH.encode() + query + b" HTTP/1." + minor + b"\r\n" + rest
        assert parse_head(head) == Answer(200, body=method == b"GET")

    @given(TARGET)
    def test_another_path_is_not_found(self, target: bytes) -> None:
        """Any other path (whatever follows it) is 404, whatever the method."""
        if target.split(b"?", 1)[0] != METRICS_PATH.encode():
            assert parse_head(b"GET " + target + b" HTTP/1.1").status == 404

    def test_another_method_is_not_allowed(self) -> None:
        """POST /metrics is 405, and the answer says what is allowed."""
        assert parse_head(b"POST /metrics HTTP/1.1") == Answer(405)
        assert b"Allow: GET, HEAD\r\n" in response(405)

    def test_a_line_that_is_not_http_1_is_bad(self) -> None:
        """HTTP/2 prior knowledge, an absolute target or a missing version are 400."""
        for head in (b"PRI * HTTP/2.0", b"GET http://x/metrics HTTP/1.1", b"GET /metrics", b"GET  /metrics HTTP/1.1"):
            assert parse_head(head) == Answer(400)
