"""What a query requires of a body (mcplhost/store/search_query.py): the runs, and that every match holds them."""

from __future__ import annotations

import unicodedata

import pytest
import regex
from hypothesis import assume, example, given
from hypothesis import strategies as st

from mcplhost.store.readers import SearchError, compile_query
from mcplhost.store.search_query import FULLCASE_PAIRS, Required, required, usable_pieces

#: Characters where case folding is not one-to-one or not ASCII-only, beside plain ones and the regex syntax.
TRICKY = "ßẞſİıKﬁﬀﬂẗʼʾ\u0307\u0308éÉωΩΣς字😀"
ALPHABET = "abcfilstkn ABCFILSTKN" + TRICKY + ".{}[]()*+?|^$\\-:\n\t"


class TestRuns:
    @pytest.mark.parametrize(("query", "as_regex", "ignore_case", "runs"), [
        ("deploy notes", False, False, ("deploy notes",)),
        ("ab", False, False, None),  # 1-2 characters: the scan
        (r"abc(def)+g", True, False, ("abc", "def")),  # a repeated part's own runs, apart; "g" is too short
        (r"deploy(ed)? to prod-\d+", True, False, ("deploy", " to prod-")),
        (r"foo|bar", True, False, None),  # an alternation requires neither side
        (r"x(foo|bar)baz", True, False, ("baz",)),
        (r"(?:hello)?world", True, False, ("world",)),
        (r"(?>atomic)ally", True, False, ("atomic", "ally")),
        (r"ab(?i:cde)fgh", True, False, ("fgh",)),  # a group with its own flags: nothing of it, nothing across it
        (r"(?i)Deploy", True, False, ("Deploy",)),
        (r"^start\b", True, False, ("start",)),
        (r"(?:hello){e<=1}", True, False, None),  # `regex` reads a fuzzy match where the standard parser reads "{"
        (r"hello\{x", True, False, None),
        (r"[[:alpha:]]xyz", True, False, None),  # a nested set: `regex` reads a POSIX class
        (r"(?x) a b c d", True, False, None),
        (r"\p{L}abc", True, False, None),  # only `regex` knows \p: the standard parser refuses it
        (r"first", False, True, None),  # "fi" and "st": one character may be either in the body
        (r"class", False, True, ("cla",)),
        (r"İstanbul", False, False, ("İstanbul",)),
        (r"İstanbul", False, True, ("anbul",)),
        (r"字字字", False, True, ("字字字",)),
        ("tab\there", False, False, ("tab", "here")),
    ])
    def test_runs(self, query: str, as_regex: bool, ignore_case: bool, runs: tuple[str, ...] | None) -> None:
        found = required(query, as_regex=as_regex, ignore_case=ignore_case)
        assert (found.runs if found is not None else None) == runs

    def test_an_inline_ignore_case_flag_makes_the_runs_case_insensitive(self) -> None:
        assert required("(?i)deploy", as_regex=True, ignore_case=False) == Required(("deploy",), True)

    def test_every_full_case_folding_to_several_characters_is_cut_out_of_a_case_insensitive_run(self) -> None:
        """Wherever a body may hold one character for several of the query's, no run keeps any of them."""
        for code in range(0x10000):  # every character that folds to several is in the BMP
            ch = chr(code)
            folded = ch.casefold()
            if len(folded) < 2 or unicodedata.category(ch) == "Cs":
                continue
            if folded.isascii():
                assert folded[:2].lower() in FULLCASE_PAIRS, (ch, folded)
            text = "ABC" + folded + "DEF"
            for piece in usable_pieces(text, True):
                assert piece in "ABC" or piece in "DEF", (ch, folded, piece)  # nothing of the folding is kept


def texts() -> st.SearchStrategy[str]:
    return st.text(alphabet=ALPHABET, max_size=40)


def regexes() -> st.SearchStrategy[str]:
    """Expressions of the syntax both parsers share, and some only `regex` knows."""
    atoms = st.one_of(
        st.sampled_from(ALPHABET).map(regex.escape),
        st.text(alphabet="abcfilst ABC" + TRICKY, min_size=1, max_size=6).map(regex.escape),
        st.sampled_from([".", r"\d", r"\w", r"\s", "[a-f]", "[^x]", r"\b", "^", "$", "[[:alpha:]]", r"\p{L}",
                         "(?i)", r"\{", "[{]", r"\N{LATIN SMALL LETTER SHARP S}"]),
    )

    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(children, min_size=2, max_size=4).map("".join),
            st.tuples(children, children).map("|".join),
            children.map("(?:{})".format), children.map("({})".format), children.map("(?i:{})".format),
            children.map("(?>{})".format), children.map("(?={})".format), children.map("(?!{})".format),
            st.tuples(children, st.sampled_from(["?", "*", "+", "{2}", "{0,2}", "{1,3}", "+?", "++", "{e<=1}",
                                                 "{i<=1,d<=1}"])).map(lambda t: f"(?:{t[0]}){t[1]}"),
        )

    return st.recursive(atoms, extend, max_leaves=10)


def holds(run: str, text: str, ignore_case: bool) -> bool:
    """Whether `text` holds `run` as the index looks it up: exactly, or with each character matched
    case-insensitively by one character (no full case folding)."""
    if not ignore_case:
        return run in text
    return regex.search(regex.escape(run), text, regex.IGNORECASE) is not None


class TestEveryMatchHoldsTheRuns:
    @given(texts(), st.data(), st.booleans())
    @example("Straße", None, True)
    def test_a_literal(self, text: str, data: st.DataObject | None, ignore_case: bool) -> None:
        """A literal query cut from the text (its case flipped at random) holds its runs wherever it matches."""
        if data is None:
            query, ignore_case = "STRASSE", True
        else:
            start = data.draw(st.integers(0, len(text)))
            query = text[start : data.draw(st.integers(start, len(text)))]
            if ignore_case and data.draw(st.booleans()):
                query = query.swapcase()
        self.check(query, text, as_regex=False, ignore_case=ignore_case)

    @given(regexes(), texts(), st.booleans())
    def test_an_expression(self, pattern: str, text: str, ignore_case: bool) -> None:
        self.check(pattern, text, as_regex=True, ignore_case=ignore_case)

    @given(texts(), st.data(), st.booleans())
    def test_an_expression_built_around_the_text(self, text: str, data: st.DataObject, ignore_case: bool) -> None:
        """Literal pieces of the text joined by other syntax, so the expression often matches."""
        start = data.draw(st.integers(0, len(text)))
        middle = data.draw(st.integers(start, len(text)))
        end = data.draw(st.integers(middle, len(text)))
        glue = data.draw(st.sampled_from(["", ".*", ".?", "(?:x)?", r"\s*", "(?:a|b)?", "{e<=1}", "(?i)", "+"]))
        pattern = regex.escape(text[start:middle]) + glue + regex.escape(text[middle:end])
        self.check(pattern, text, as_regex=True, ignore_case=ignore_case)

    @staticmethod
    def check(query: str, text: str, *, as_regex: bool, ignore_case: bool) -> None:
        try:
            pattern = compile_query(query, as_regex=as_regex, ignore_case=ignore_case)
        except SearchError:
            assume(False)
        needs = required(query, as_regex=as_regex, ignore_case=ignore_case)
        if needs is None or pattern.search(text, timeout=1) is None:
            return
        for run in needs.runs:
            assert len(run) >= 3
            assert holds(run, text, needs.ignore_case), (query, text, run)
        # in their order and apart (store/pg_search.py asks for them so: LIKE '%run%run%')
        in_order = ".*?".join(regex.escape(run) for run in needs.runs)
        flags = regex.DOTALL | (regex.IGNORECASE | regex.FULLCASE if needs.ignore_case else 0)
        assert regex.search(in_order, text, flags), (query, text, needs.runs)
