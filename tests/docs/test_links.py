"""The README and docs/ link only to files a clone has: every relative link resolves inside the repository.

And nothing a user reads names a document a clone does not have: the
design notes the project was built from are not in the repository, so the
README, docs/, the example configs and connectors, the dev banner and the
bundled connectors' `--help` must point to the repository's docs/ instead.
"""

from __future__ import annotations

import ast
import re
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
NOT_IN_REPOSITORY = re.compile(
    r"\b(?:INTERFACES|AGENTS|COMPAT|HOST-DIGEST|ARCHITECTURE|STYLE|PROVENANCE|PEERS)\.md\b"
    r"|\bHOST-DIGEST\b|/work/shared|\.\./shared")
#: What a user reads besides the Markdown documents: the example configs and example connectors.
EXAMPLES = [*sorted((REPO / "deploy").glob("*.toml")), *sorted((REPO / "docs" / "examples").glob("*"))]
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


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
                "connectors.md", "mcpl-checklist.md"} <= names

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
    return [m.group(0) for m in NOT_IN_REPOSITORY.finditer(text)]


def connector_help(name: str) -> str:
    """What `mcplhost connector NAME --help` prints: the module's docstring."""
    source = (REPO / "mcplhost" / "connectors" / f"{name}.py").read_text(encoding="utf-8")
    return ast.get_docstring(ast.parse(source)) or ""


class TestNoDocumentOutsideTheRepository:
    @pytest.mark.parametrize("path", [*DOCUMENTS, *EXAMPLES], ids=lambda p: str(p.relative_to(REPO)))
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
                                      "per PEERS.md", "../shared/design"])
    def test_the_checker_finds_each_kind_of_reference(self, text: str) -> None:
        assert non_repository_references(text)

    @pytest.mark.parametrize("text", ["docs/architecture.md", "provenance.md", "README.md", "agents = []",
                                      "[[agents]]", "the STYLE of it", "compat"])
    def test_the_checker_leaves_the_repository_s_own_names_alone(self, text: str) -> None:
        assert non_repository_references(text) == []


#: In source text, also the design notes' decision tags and the project's issue numbers: a reader has neither.
NOT_IN_SOURCE = re.compile(rf"{NOT_IN_REPOSITORY.pattern}|\bAMB-[0-9]+\b|\b[Ii]ssue [0-9]+\b")
SOURCE = sorted(path for folder in ("mcplhost", "connectors", "migrations") if (REPO / folder).is_dir()
                for path in (REPO / folder).rglob("*") if path.suffix in {".py", ".sql"})


def source_references(text: str) -> list[str]:
    return [m.group(0) for m in NOT_IN_SOURCE.finditer(text)]


class TestNoDesignNoteInTheSource:
    def test_there_is_source_to_check(self) -> None:
        assert any(path.suffix == ".sql" for path in SOURCE) and any(path.suffix == ".py" for path in SOURCE)

    @pytest.mark.parametrize("path", SOURCE, ids=lambda p: str(p.relative_to(REPO)))
    def test_comments_cite_only_the_repository_or_the_spec(self, path: Path) -> None:
        """Code, connectors and migrations point to docs/ or the public MCPL spec, never to a design note."""
        assert source_references(path.read_text(encoding="utf-8")) == []

    @pytest.mark.parametrize("text", ["(AGENTS.md §6)", "HOST-DIGEST §3.2", "(AMB-19)", "issue 7 items 2",
                                      "Issue 10: inferenceRequest"])
    def test_the_source_checker_finds_each_kind_of_reference(self, text: str) -> None:
        assert source_references(text)

    @pytest.mark.parametrize("text", ["docs/agents.md#outbox", "SPEC §13.4", "docs/provenance.md §4",
                                      "issued", "AMBIENT-3"])
    def test_the_source_checker_leaves_repository_citations_alone(self, text: str) -> None:
        assert source_references(text) == []
