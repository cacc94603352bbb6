"""mcplhost/envfile.py: the env file grammar (a property test) and the refusals of files others may touch."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.envfile import (
    ENV_FILE_MAX_BYTES,
    EnvFileError,
    format_env_file,
    parse_env_file,
    read_env_file,
)

names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,20}\Z")
#: Any text an environment can carry on one line: no newline, no NUL.
values = st.text(st.characters(blacklist_characters="\n\0", blacklist_categories=("Cs",)), max_size=40)


class TestGrammar:
    @given(st.dictionaries(names, values, max_size=8))
    def test_what_is_formatted_parses_back(self, variables: dict[str, str]) -> None:
        """Every name → one-line value mapping survives format then parse (quotes, spaces, # and $ included)."""
        assert parse_env_file(format_env_file(variables)) == variables

    @given(st.text(max_size=200))
    def test_any_text_parses_or_is_refused_with_a_line_number(self, text: str) -> None:
        """No text makes the parser raise anything but EnvFileError, and a refusal names its line."""
        try:
            parse_env_file(text)
        except EnvFileError as exc:
            assert str(exc).startswith("line ")

    def test_comments_blanks_quotes_and_no_expansion(self) -> None:
        """Comments and blank lines skipped; outer quotes dropped; $, backslashes and inner # kept as written."""
        text = ('# a comment\n\n   # indented comment\nA=plain\n B = spaced \nC="  kept  "\n'
                "D='single $HOME'\nE=$HOME\\n\nF=pass#word\nG=\nH=\"unbalanced\n")
        assert parse_env_file(text) == {"A": "plain", "B": "spaced", "C": "  kept  ", "D": "single $HOME",
                                        "E": "$HOME\\n", "F": "pass#word", "G": "", "H": '"unbalanced'}

    @pytest.mark.parametrize(("text", "says"), [
        ("A=1\njust words\n", "line 2: not NAME=VALUE"),
        ("export A=1\n", "line 1: the name before '=' is not a variable name"),
        ("1A=x\n", "line 1: the name"),
        ("A=1\nB=2\nA=3\n", "line 3: A is already set on line 1"),
    ])
    def test_a_bad_line_is_named_by_its_number_never_its_text(self, text: str, says: str) -> None:
        """The error names the line and the rule, not the line's text (it may hold a secret)."""
        with pytest.raises(EnvFileError, match=says) as caught:
            parse_env_file(text.replace("words", "s3cret words"))
        assert "s3cret" not in str(caught.value)


class TestReading:
    def write(self, tmp_path, data: bytes, mode: int = 0o600) -> os.PathLike[str]:
        path = tmp_path / "x.env"
        path.write_bytes(data)
        path.chmod(mode)
        return path

    @pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
    def test_a_file_only_its_owner_may_touch_is_read(self, tmp_path, mode: int) -> None:
        """Mode 0600, 0400 or 0700: read, CRLF line ends accepted."""
        assert read_env_file(self.write(tmp_path, b"TOKEN=abc\r\nB=2\r\n", mode)) == {"TOKEN": "abc", "B": "2"}

    @pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o620, 0o602, 0o644])
    def test_a_file_the_group_or_others_may_read_or_write_is_refused(self, tmp_path, mode: int) -> None:
        """Any group/other read or write bit refuses the file, naming its mode."""
        with pytest.raises(EnvFileError, match=f"mode {mode:04o}"):
            read_env_file(self.write(tmp_path, b"TOKEN=abc\n", mode))

    def test_missing_fifo_huge_and_binary_files_are_refused(self, tmp_path) -> None:
        """No file, a FIFO (never blocks), a file past the bound and one not UTF-8: each an EnvFileError."""
        with pytest.raises(EnvFileError, match="cannot open"):
            read_env_file(tmp_path / "absent.env")
        fifo = tmp_path / "fifo.env"
        os.mkfifo(fifo, 0o600)
        with pytest.raises(EnvFileError, match="not a regular file"):
            read_env_file(fifo)
        with pytest.raises(EnvFileError, match="larger than"):
            read_env_file(self.write(tmp_path, b"A=" + b"x" * ENV_FILE_MAX_BYTES))
        with pytest.raises(EnvFileError, match="not UTF-8"):
            read_env_file(self.write(tmp_path, b"A=\xff\n"))
