from hypothesis import given
from hypothesis import strategies as st

from mcplhost.rpc.framing import LineBuffer, Oversized


def feed_all(buffer: LineBuffer, chunks: list[bytes]) -> list:
    out = []
    for chunk in chunks:
        out += buffer.feed(chunk)
    return out + buffer.close()


class TestLineBuffer:
    def test_splits_lines_and_keeps_the_partial(self) -> None:
        """A chunk gives its complete lines; the rest waits for its newline."""
        buffer = LineBuffer()
        assert buffer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
        assert buffer.feed(b":2}\n") == [b'{"b":2}']

    def test_strips_carriage_return_and_skips_blank_lines(self) -> None:
        """The lenient reading: CRLF works and blank lines vanish."""
        assert LineBuffer().feed(b"x\r\n\r\n   \n\ny\n") == [b"x", b"y"]

    def test_a_final_line_without_newline_counts_at_close(self) -> None:
        """End of input flushes the last line."""
        buffer = LineBuffer()
        assert buffer.feed(b"tail") == []
        assert buffer.close() == [b"tail"]

    def test_a_line_over_the_cap_is_reported_and_dropped(self) -> None:
        """An oversized line becomes one Oversized report, and the next line still arrives."""
        buffer = LineBuffer(max_line_bytes=10)
        assert buffer.feed(b"0123456789A\nok\n") == [Oversized(11, 10), b"ok"]

    def test_an_oversized_line_in_many_chunks_is_never_held(self) -> None:
        """Bytes past the cap are discarded as they come, then reported once."""
        buffer = LineBuffer(max_line_bytes=10)
        assert buffer.feed(b"x" * 8) == []
        assert buffer.feed(b"x" * 8) == []
        assert buffer.held_bytes == 0
        assert buffer.feed(b"x" * 100) == []
        assert buffer.feed(b"xx\nnext\n") == [Oversized(118, 10), b"next"]

    def test_exactly_the_cap_passes(self) -> None:
        """The cap is inclusive."""
        assert LineBuffer(max_line_bytes=4).feed(b"abcd\n") == [b"abcd"]

    def test_five_mebibyte_line_passes_by_default(self) -> None:
        """The default cap leaves room for base64 media."""
        line = b'{"x":"' + b"a" * (5 * 1024 * 1024) + b'"}'
        buffer = LineBuffer()
        out = []
        for start in range(0, len(line), 65536):
            out += buffer.feed(line[start : start + 65536])
        out += buffer.feed(b"\n")
        assert out == [line]

    @given(
        lines=st.lists(st.binary().map(lambda b: b.replace(b"\n", b"")), max_size=20),
        cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    )
    def test_any_chunking_gives_the_same_lines(self, lines: list[bytes], cuts: list[int]) -> None:
        """However the bytes are cut into chunks, the same cleaned lines come out."""
        data = b"".join(line + b"\n" for line in lines)
        points = sorted({min(c, len(data)) for c in cuts})
        chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
        expected = [
            line[:-1] if line.endswith(b"\r") else line
            for line in lines
            if line.strip(b" \t\r\n\f\v")
        ]
        assert feed_all(LineBuffer(), chunks) == expected
