"""docs/provenance.md's examples are the code's behaviour: each table row and the digest are checked."""

from __future__ import annotations

import json
import re

from mcplhost.inbound import (
    HOST_METADATA_KEYS,
    body_digest,
    canonical_json,
    lookalikes_table,
    mark_openings,
    render_source_header,
)
from mcplhost.inbound.author import escape_leading_from
from mcplhost.inbound.pipeline import Delivered, Processed, run_pipeline

from ..harness import REPO

PAGE = (REPO / "docs" / "provenance.md").read_text(encoding="utf-8")
#: A table row of two code spans: | `left` | `right` |
ROW = re.compile(r"^\| `([^`]*)` \| `([^`]*)` \|$", re.M)


def section(title: str) -> str:
    """The text of the `## title` section, up to the next `## ` heading."""
    return PAGE.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


class TestProvenancePage:
    def test_every_header_example_is_what_the_code_renders(self) -> None:
        """Each envelope in the header table renders to exactly the header beside it."""
        rows = ROW.findall(section("3. header"))
        assert len(rows) >= 10
        for envelope, header in rows:
            assert render_source_header(json.loads(envelope)) == header, envelope

    def test_every_marking_example_is_what_the_code_stores(self) -> None:
        """Each sender's text in the marking table is stored as the text beside it."""
        rows = ROW.findall(section("4. mark: header-shaped text in a sender's words"))
        assert len(rows) >= 10
        for sent, stored in rows:
            assert mark_openings([{"type": "text", "text": sent}]) == [{"type": "text", "text": stored}], sent

    def test_the_page_names_the_lookalike_data_s_versions(self) -> None:
        """docs/provenance.md §4a names the ICU and Unicode versions the look-alike table was generated from."""
        assert f"**ICU {lookalikes_table.ICU_VERSION}, Unicode {lookalikes_table.UNICODE_VERSION}**" in PAGE

    def test_the_split_opening_example_holds(self) -> None:
        """An opening split around an image gets its backslash in the block holding the `[`."""
        image = {"type": "image", "uri": "x"}
        blocks = [{"type": "text", "text": "hello [sou"}, image, {"type": "text", "text": "rce: x]"}]
        assert [b.get("text") for b in mark_openings(blocks)] == ["hello \\[sou", None, "rce: x]"]

    def test_the_digest_example_is_the_code_s_digest(self) -> None:
        """The page's canonical text and digest for a one-block body are the code's."""
        body = [{"type": "text", "text": "hello"}]
        assert f"`{canonical_json([body])}`" in PAGE
        assert f"`{body_digest(body)}`" in PAGE

    def test_the_page_lists_every_host_only_key(self) -> None:
        """The strip section names exactly HOST_METADATA_KEYS."""
        block = section("1. strip").split("```", 2)[1]
        assert set(block.split()) == HOST_METADATA_KEYS

    def test_the_stored_item_example_has_the_pipeline_s_metadata_members(self) -> None:
        """The example export line names exactly the metadata and source members a channel message gets."""
        example = json.loads(section("6. What a stored item looks like").split("```json", 1)[1].split("```", 1)[0])
        processed = run_pipeline(Delivered(
            lane="channels/incoming", kind="channel", server_id="discord", accepted_at=1790000000000,
            blocks=[{"type": "text", "text": "hello"}], adapter={"mentions": ["@scout"]},
            channel_id="discord:g1:room", label="#room", message_id="m-1", source_timestamp="2026-01-01T09:00:00Z"))
        assert isinstance(processed, Processed)
        assert set(example["metadata"]) == set(processed.metadata)
        assert example["metadata"]["source"] == processed.metadata["source"]
        assert example["content"] == processed.content
        assert example["metadata"]["sourceHeader"] == processed.metadata["sourceHeader"]


class TestFromLineExamples:
    def test_every_from_example_is_what_the_compile_shows(self) -> None:
        """Each body's first line in the `from:` table is shown to the model as the line beside it."""
        rows = ROW.findall(section("9. The `from:` line: compiled, never stored"))
        assert len(rows) >= 8
        for sent, shown in rows:
            assert escape_leading_from(sent) == shown, sent
