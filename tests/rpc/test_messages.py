import json

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.rpc.messages import (
    ErrorResponse,
    Invalid,
    Notification,
    Request,
    Response,
    decode_line,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
)


class TestClassify:
    def test_request(self) -> None:
        """method and id make a request."""
        message = decode_line(b'{"jsonrpc":"2.0","id":7,"method":"ping"}')
        assert isinstance(message, Request) and message.id == 7 and message.method == "ping"

    def test_notification(self) -> None:
        """No id makes a notification."""
        assert isinstance(decode_line(b'{"jsonrpc":"2.0","method":"n"}'), Notification)

    def test_string_and_number_ids_keep_their_type(self) -> None:
        """"1" stays a string and 1 stays a number."""
        assert decode_line(b'{"jsonrpc":"2.0","id":"1","method":"m"}').id == "1"
        assert decode_line(b'{"jsonrpc":"2.0","id":1,"method":"m"}').id == 1

    def test_bool_id_is_refused_with_a_reply_to_null(self) -> None:
        """true would alias 1, so it is invalid, and the answer goes to id null."""
        message = decode_line(b'{"jsonrpc":"2.0","id":true,"method":"m"}')
        assert message == Invalid(message.reason, None, owes_reply=True)

    def test_null_id_request_is_invalid(self) -> None:
        """MCP forbids null ids on requests."""
        assert decode_line(b'{"jsonrpc":"2.0","id":null,"method":"m"}').owes_reply

    def test_wrong_version_is_invalid_request_with_its_id(self) -> None:
        """A request without jsonrpc 2.0 is answered -32600 at its own id."""
        message = decode_line(b'{"id":5,"method":"m"}')
        assert isinstance(message, Invalid) and message.reply_id == 5 and message.owes_reply

    def test_non_json_and_non_object(self) -> None:
        """Garbage and arrays are invalid and owe no reply."""
        for line in (b"hello", b"[1,2]", b"3", b'"s"'):
            message = decode_line(line)
            assert isinstance(message, Invalid) and not message.owes_reply

    def test_response_and_error_response(self) -> None:
        """result or error, never both."""
        assert isinstance(decode_line(b'{"jsonrpc":"2.0","id":1,"result":{}}'), Response)
        error = decode_line(b'{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}')
        assert isinstance(error, ErrorResponse) and error.error.code == -1
        assert isinstance(decode_line(b'{"jsonrpc":"2.0","id":1,"result":1,"error":{}}'), Invalid)

    def test_malformed_error_object_is_still_an_error_response(self) -> None:
        """A peer's broken error object still settles the request, as an error."""
        message = decode_line(b'{"jsonrpc":"2.0","id":1,"error":"boom"}')
        assert isinstance(message, ErrorResponse) and message.error.code == -32603


class TestEncode:
    @given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text()), st.text(), st.dictionaries(st.text(), st.text()))
    def test_every_encoded_message_is_one_json_line(self, id, method, params) -> None:
        """Whatever goes out is exactly one line of valid JSON-RPC."""
        for data in (
            encode_request(id, method, params),
            encode_notification(method, params),
            encode_result(id, params),
            encode_error(id, -1, method, params),
        ):
            assert data.endswith(b"\n") and data.count(b"\n") == 1
            assert json.loads(data)["jsonrpc"] == "2.0"


_MISSING = object()
_member_values = st.one_of(
    st.just(_MISSING), st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["2.0", "1.0", "", "ping"]), st.text(max_size=5), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


class TestTypedFastPath:
    @given(st.fixed_dictionaries({key: _member_values for key in ("jsonrpc", "id", "method", "params", "result",
                                                                  "error", "extra")}))
    def test_every_line_reads_as_classify_reads_its_envelope(self, members: dict) -> None:
        """The typed decode of the usual request or notification answers exactly as `classify` of the envelope
        does, for any mix of members, types and values (a bool or float id, a missing or wrong jsonrpc ...)."""
        from mcplhost.rpc.messages import _envelope_decoder, classify

        line = json.dumps({key: value for key, value in members.items() if value is not _MISSING}).encode()
        assert decode_line(line) == classify(_envelope_decoder.decode(line))
