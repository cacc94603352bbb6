"""The README and docs/ link only to files a clone has: every relative link resolves inside the repository.

And nothing a user or a contributor reads names a document a clone does
not have: the design notes the project was built from, their decision tags
and the project's issue numbers are not in the repository, so the README,
docs/, the example configs and connectors, the dev banner, the bundled
connectors' `--help`, and every comment and docstring of the source, the
migrations and the tests point to the repository's docs/ (or the public
MCPL spec) instead. Every `docs/X.md#part`, `docs/X.md §N` and
`docs/mcpl-checklist.md item N` cited anywhere names something that page
really has.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from mcplhost.dev import bundled_connectors, dev_config, introduction

from ..harness import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Inline Markdown links and images: [text](target) or ![alt](target "title").
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: Targets that are not files of this repository.
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#)", re.I)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
#: Documents that are not in the repository (the design notes): named anywhere a user reads, they are a dead end.
#: By file name, by a name that is only a design note's (`PROVENANCE's rule`), or by a name and a section
#: (`STYLE §15`); the repository's own lowercase names (`docs/agents.md`, `[[agents]]`) are left alone.
NOT_IN_REPOSITORY = re.compile(
    r"\b(?:INTERFACES|AGENTS|COMPAT|HOST-DIGEST|ARCHITECTURE|STYLE|PROVENANCE|PEERS)\.md\b"
    r"|\bHOST-DIGEST\b|\b(?:INTERFACES|PROVENANCE|PEERS)\b"
    r"|\b(?:AGENTS|ARCHITECTURE|STYLE|COMPAT)(?=\s*§|'s\b)"
    r"|/work/shared|\.\./shared")
#: The design notes' decision tags and the project's issue numbers ("issue 13", "Issue 7 item 2"): a reader
#: has neither, so a comment says what the behaviour is instead.
NOT_A_CITATION = re.compile(r"\bAMB-[0-9]+\b|\b[Ii]ssues? #?[0-9]+\b")
#: What a user reads besides the Markdown documents: the example configs and example connectors.
EXAMPLES = [*sorted((REPO / "deploy").glob("*")), *sorted((REPO / "docs" / "examples").glob("*"))]
#: Everything else in the repository a reader opens that may cite a page: configs, deploy files, pyproject, CI.
OTHER_TEXT = [path for path in (REPO / "pyproject.toml", REPO / ".ci" / "run") if path.is_file()] + EXAMPLES
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


@functools.cache  # read once a run: hundreds of files cite the same few pages
def anchors(document: Path) -> set[str]:
    """The fragment ids GitHub gives the headings of a Markdown file (lowercase, punctuation dropped)."""
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(document: Path) -> list[str]:
    """The relative link targets of a Markdown file, code blocks left out."""
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    return [target for target in LINK.findall(text) if not EXTERNAL.match(target)]


class TestLinks:
    def test_there_are_documents_to_check(self) -> None:
        """README.md and the docs/ pages this suite reads are all present."""
        names = {d.name for d in DOCUMENTS}
        assert {"README.md", "architecture.md", "provenance.md", "mcpl-compat.md", "operations.md",
                "connectors.md", "mcpl-checklist.md", "agents.md", "grants.md"} <= names

    def test_every_relative_link_points_to_a_file_in_the_repository(self) -> None:
        """No link leaves the clone (../shared) or names a file that does not exist."""
        broken = []
        for document in DOCUMENTS:
            for target in relative_links(document):
                path = (document.parent / target.split("#", 1)[0]).resolve()
                if not path.is_relative_to(REPO) or not path.exists():
                    broken.append(f"{document.relative_to(REPO)}: {target}")
        assert broken == []

    def test_every_fragment_names_a_heading_of_its_target(self) -> None:
        """A link to `page.md#part` (or `#part`) names a heading that page really has."""
        broken = []
        for document in DOCUMENTS:
            text = FENCE.sub("", document.read_text(encoding="utf-8"))
            for target in LINK.findall(text):
                path, _, fragment = target.partition("#")
                if not fragment or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):
                    continue
                page = (document.parent / path).resolve() if path else document
                if page.suffix == ".md" and page.exists() and fragment not in anchors(page):
                    broken.append(f"{document.relative_to(REPO)}: {target}")
        assert broken == []

    def test_no_document_mentions_the_shared_design_folder(self) -> None:
        """Not even as plain text: a newcomer's clone has no ../shared to read."""
        assert [d.name for d in DOCUMENTS if "../shared" in d.read_text(encoding="utf-8")] == []

    def test_the_link_pattern_finds_links(self, tmp_path) -> None:
        """The checker itself sees inline links, images and titled links, and skips URLs, anchors and code."""
        sample = tmp_path / "sample.md"
        sample.write_text(
            "See [a](docs/a.md), ![x](img/x.png) and [b](b.md#part \"title\").\n"
            "Not these: [web](https://example.org/), [here](#top), [mail](mailto:a@b.c).\n"
            "```\n[code](not/a/link.md)\n```\n",
            encoding="utf-8",
        )
        assert relative_links(sample) == ["docs/a.md", "img/x.png", "b.md#part"]


def non_repository_references(text: str) -> list[str]:
    """Every design-note name, decision tag and issue number in `text`."""
    return [m.group(0) for pattern in (NOT_IN_REPOSITORY, NOT_A_CITATION) for m in pattern.finditer(text)]


def connector_help(name: str) -> str:
    """What `mcplhost connector NAME --help` prints: the module's docstring."""
    source = (REPO / "mcplhost" / "connectors" / f"{name}.py").read_text(encoding="utf-8")
    return ast.get_docstring(ast.parse(source)) or ""


class TestNoDocumentOutsideTheRepository:
    @pytest.mark.parametrize("path", [*DOCUMENTS, *OTHER_TEXT], ids=lambda p: str(p.relative_to(REPO)))
    def test_documents_and_examples_cite_only_the_repository(self, path: Path) -> None:
        """README, docs/, the example configs and connectors never name a design note a clone lacks."""
        assert non_repository_references(path.read_text(encoding="utf-8")) == []

    def test_the_dev_banner_cites_only_the_repository(self, tmp_path) -> None:
        """What `mcplhost dev` prints before it starts points to README/docs, never to a design note."""
        lines = introduction(dev_config(tmp_path / "dev.db", console_socket=tmp_path / "s"), tmp_path / "dev.db",
                             verbose=False)
        assert non_repository_references("\n".join(lines)) == []
        assert any("docs/" in line for line in lines)

    @pytest.mark.parametrize("name", bundled_connectors())
    def test_each_bundled_connector_s_help_cites_only_the_repository(self, name: str) -> None:
        assert non_repository_references(connector_help(name)) == []

    @pytest.mark.parametrize("text", ["see INTERFACES.md", "(COMPAT.md)", "AGENTS.md §9", "HOST-DIGEST §3",
                                      "per PEERS.md", "../shared/design", "(PROVENANCE §2)", "STYLE §15",
                                      "under PROVENANCE's rule", "AGENTS's table", "(AMB-19)", "issue 7 items 2",
                                      "Issue 10: inferenceRequest", "(issue 7 #5)", "see issues 3"])
    def test_the_checker_finds_each_kind_of_reference(self, text: str) -> None:
        assert non_repository_references(text)

    @pytest.mark.parametrize("text", ["docs/architecture.md", "provenance.md", "README.md", "agents = []",
                                      "[[agents]]", "the STYLE of it", "compat", "AGENTS = 10",
                                      "INTERFACES_EXAMPLE", "docs/agents.md#outbox", "SPEC §13.4", "issued",
                                      "AMBIENT-3", "the issue is"])
    def test_the_checker_leaves_the_repository_s_own_names_alone(self, text: str) -> None:
        assert non_repository_references(text) == []


#: Source, migrations and tests: every comment and docstring in them is read by a contributor with only a clone.
SOURCE = sorted(path for folder in ("mcplhost", "connectors", "migrations", "tests") if (REPO / folder).is_dir()
                for path in (REPO / folder).rglob("*") if path.suffix in {".py", ".sql"})
#: Files that must name what the checkers look for, as data, and why. Nothing else is exempt.
NAMES_DESIGN_NOTES_AS_DATA = {
    "tests/docs/test_links.py": "the checkers' own examples of what they find",
}


def failing(paths: list[Path], problems: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """Each of `paths` whose text has problems, by its path in the repository, with them."""
    found = {str(path.relative_to(REPO)): problems(path.read_text(encoding="utf-8")) for path in paths}
    return {path: listed for path, listed in found.items() if listed}


def checked_source() -> list[Path]:
    return [path for path in SOURCE if str(path.relative_to(REPO)) not in NAMES_DESIGN_NOTES_AS_DATA]


def source_references(text: str) -> list[str]:
    return non_repository_references(text)


class TestNoDesignNoteInTheSource:
    def test_there_is_source_to_check(self) -> None:
        kinds = {path.suffix for path in SOURCE}
        assert kinds == {".py", ".sql"} and any(path.parts[len(REPO.parts)] == "tests" for path in SOURCE)

    def test_comments_cite_only_the_repository_or_the_spec(self) -> None:
        """Code, connectors, migrations and tests point to docs/ or the public MCPL spec, never to a design note.

        One test for all ~500 files, each that fails named with what it cites: a test apiece cost more in
        pytest's own bookkeeping than the check itself."""
        assert failing(checked_source(), source_references) == {}

    def test_only_the_listed_files_are_exempt_and_each_still_exists(self) -> None:
        assert all((REPO / name).is_file() for name in NAMES_DESIGN_NOTES_AS_DATA)


# --- sections: `§` in code names its document ---------------------------------------------------

#: What a `§` may follow: the public spec (SPEC, "MCPL spec"), an RFC, or a page of the repository.
QUALIFIER = r"(?:\bSPEC\b|\bspec\b|\bRFC[- ]?\d+|(?<![\w/.-])(?P<page>[\w/.-]+\.md)\b)"
SECTION = r"§\s?[A-Z]?\d+(?:\.\d+)*(?:\s?[–-]\s?\d+(?:\.\d+)*)?"
#: A qualifier and the run of sections that follow it: "SPEC §5.3 and §6.7", "docs/provenance.md §4 (the rule
#: text), §7 and §8", "SPEC Appendix A, §6.6"; one `(…)` remark may sit between two sections.
CHAIN = re.compile(QUALIFIER + r"(?:\s*(?:,|;|and\b|or\b|Appendix\s+[A-Z](?:\.\d+)*|\([^()\n§]*\)|" + SECTION + "))*")
SECTION_NUMBER = re.compile(r"§\s?(\d+)")


def chains(text: str) -> list[re.Match[str]]:
    return list(CHAIN.finditer(text))


def bare_sections(text: str) -> list[str]:
    """Each `§N` that follows no document: "(§6)" could be any page's section six."""
    if "§" not in text:
        return []  # the chains' search is most of this check's time, and with no `§` none can be bare
    covered = {i for chain in chains(text) for i in range(chain.start(), chain.end())}
    return [text[i:i + 8].split("\n")[0] for i, c in enumerate(text) if c == "§" and i not in covered]


class TestSectionsNameTheirDocument:
    def test_every_section_sign_follows_the_document_it_is_in(self) -> None:
        assert failing(checked_source(), bare_sections) == {}

    @pytest.mark.parametrize("text", ["(§6)", "the §16 closure", "(§3.5: budget)", "§4 item 16", "see §14, §15",
                                      "(STYLE §15)"])
    def test_the_checker_finds_a_bare_section(self, text: str) -> None:
        assert bare_sections(text)

    @pytest.mark.parametrize("text", ["SPEC §13.4", "(SPEC §5.3 and §6.7)", "SPEC Appendix A, §6.6, §14.6",
                                      "docs/provenance.md §4 (the rule text), §7 (the body) and §8",
                                      "RFC 8785 §3.2.2.3", "RFC-002 §9.7", "the MCPL spec §10",
                                      "docs/connectors.md §6 and §7", "SPEC §9 steps 4-6"])
    def test_the_checker_leaves_a_named_section_alone(self, text: str) -> None:
        assert bare_sections(text) == []


# --- every citation names a part its page has ---------------------------------------------------

#: `docs/agents.md#wakes`, `README.md#performance` (in code; Markdown links are checked above).
FRAGMENT = re.compile(r"(?<![\w/.-])((?:docs/)?[\w-]+\.md)#([\w-]+)")
#: `docs/mcpl-checklist.md item 13`, `items 27-29`.
CHECKLIST_ITEM = re.compile(r"mcpl-checklist\.md items? (\d+)(?:\s?[–-]\s?(\d+))?")
#: `docs/operations.md, "Logs"`: a heading by its words, which no checker can follow; cite `docs/X.md#anchor`.
QUOTED_HEADING = re.compile(r"(?<![\w/.-])(?:[\w/.-]+\.md|README),?\s+(?:§\s?)?\"[A-Z]")
NUMBERED_HEADING = re.compile(r"^#{1,6} (\d+)\. ", re.M)
CITING = [*checked_source(), *DOCUMENTS, *OTHER_TEXT]


def page_of(name: str) -> Path:
    """The repository page a citation names: `docs/x.md`, `README.md`, or a bare `x.md` of docs/."""
    path = REPO / name
    return path if path.exists() or "/" in name else REPO / "docs" / name


@functools.cache
def numbered_sections(page: Path) -> set[str]:
    return set(NUMBERED_HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))))


@functools.cache
def checklist_count() -> int:
    section = (REPO / "docs" / "mcpl-checklist.md").read_text(encoding="utf-8").split("\n## Items\n", 1)[1]
    return len(re.findall(r"^\d+\. ", section.split("\n## ", 1)[0], flags=re.M))


def broken_citations(text: str) -> list[str]:
    """Each `page#part`, `page §N`, checklist item or quoted heading in `text` that names nothing real."""
    broken = [m.group(0) for m in QUOTED_HEADING.finditer(text)]
    for m in FRAGMENT.finditer(text):
        page = page_of(m.group(1))
        if not page.is_file() or m.group(2) not in anchors(page):
            broken.append(m.group(0))
    for chain in chains(text) if "§" in text else ():
        if chain.group("page") is None or "§" not in chain.group(0):
            continue
        page = page_of(chain.group("page"))
        known = numbered_sections(page) if page.is_file() else set()
        broken.extend(f"{chain.group('page')} §{n}" for n in SECTION_NUMBER.findall(chain.group(0)) if n not in known)
    count = checklist_count()
    for m in CHECKLIST_ITEM.finditer(text):
        if not all(1 <= int(n) <= count for n in m.groups() if n is not None):
            broken.append(m.group(0))
    return broken


class TestCitationsNameWhatTheirPageHas:
    def test_every_cited_anchor_section_and_item_exists(self) -> None:
        """A comment's `docs/agents.md#wakes` is a heading of docs/agents.md, its `§4` a numbered one, and so on."""
        assert failing(CITING, broken_citations) == {}

    @pytest.mark.parametrize("text", ["docs/agents.md#no-such-part", "docs/nothing.md#wakes",
                                      "docs/provenance.md §42", "docs/mcpl-checklist.md item 99",
                                      "docs/mcpl-checklist.md items 40-43", 'docs/operations.md, "Logs"',
                                      'README "Start here"', "docs/agents.md §3"])
    def test_the_checker_finds_a_citation_of_nothing(self, text: str) -> None:
        assert broken_citations(text)

    @pytest.mark.parametrize("text", ["docs/agents.md#wakes", "docs/agents.md#hooks-and-lifecycle",
                                      "README.md#performance", "provenance.md#3-header", "docs/provenance.md §4",
                                      "docs/connectors.md §6 and §7", "docs/mcpl-checklist.md items 27-29",
                                      "SPEC §17", "docs/grants.md"])
    def test_the_checker_accepts_a_citation_of_something(self, text: str) -> None:
        assert broken_citations(text) == []
