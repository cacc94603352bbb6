"""Tests for mcplhost/protocol/digest.py (SPEC §17.2 and its conformance vectors).

The vendored vector file is the acceptance test; its inputs are read from the
file and never retyped.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mcplhost.protocol.digest import (
    ManifestDigestError,
    ecmascript_number,
    manifest_canonical_json,
    manifest_digest,
    normalize_string_set,
    utf8_sort_key,
)

VECTOR_FILE = json.loads(
    (Path(__file__).parent / "data" / "manifest-digest-vectors.json").read_text(encoding="utf-8")
)
VECTORS = {vector["name"]: vector for vector in VECTOR_FILE["vectors"]}
POSITIVE = [name for name, vector in VECTORS.items() if "digest" in vector]
NEGATIVE = [name for name, vector in VECTORS.items() if "expectError" in vector]
SAME = [(name, v["sameDigestAs"]) for name, v in VECTORS.items() if "sameDigestAs" in v]
DIFFERENT = [(name, v["differentDigestFrom"]) for name, v in VECTORS.items() if "differentDigestFrom" in v]
SORT_VECTORS = {vector["name"]: vector for vector in VECTOR_FILE["sortVectors"]}

REVISION_SHAPE = re.compile(r"sha256:[A-Za-z0-9_-]{43}")


class TestVectorFile:
    def test_expected_size(self) -> None:
        """The vendored file holds 25 vectors (20 positive, 5 negative) and 4 sort vectors."""
        assert (len(VECTORS), len(POSITIVE), len(NEGATIVE), len(SORT_VECTORS)) == (25, 20, 5, 4)

    @pytest.mark.parametrize("name", POSITIVE)
    def test_positive(self, name: str) -> None:
        """Canonical text, then SHA-256 hex, then the revision match the vector, in that order."""
        vector = VECTORS[name]
        canonical = manifest_canonical_json(vector["input"])
        assert canonical == vector["canonicalJson"]
        assert hashlib.sha256(canonical.encode("utf-8")).hexdigest() == vector["sha256Hex"]
        assert manifest_digest(vector["input"]) == vector["digest"]

    @pytest.mark.parametrize("name", NEGATIVE)
    def test_negative(self, name: str) -> None:
        """The digest is refused with the vector's error code."""
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest(VECTORS[name]["input"])
        assert caught.value.code == VECTORS[name]["expectError"]

    @pytest.mark.parametrize(("name", "other"), SAME)
    def test_same_digest_as(self, name: str, other: str) -> None:
        """Vectors declared equivalent digest identically."""
        assert manifest_digest(VECTORS[name]["input"]) == manifest_digest(VECTORS[other]["input"])

    @pytest.mark.parametrize(("name", "other"), DIFFERENT)
    def test_different_digest_from(self, name: str, other: str) -> None:
        """Vectors declared distinct digest differently."""
        assert manifest_digest(VECTORS[name]["input"]) != manifest_digest(VECTORS[other]["input"])

    @pytest.mark.parametrize("name", SORT_VECTORS)
    def test_sort_vector(self, name: str) -> None:
        """The set comparator alone deduplicates and orders by UTF-8 bytes."""
        vector = SORT_VECTORS[name]
        assert normalize_string_set(vector["input"]) == vector["sorted"]


class TestQuickChecks:
    def test_rfc_worked_example(self) -> None:
        """The RFC-003 worked example gives its published revision."""
        manifest = {
            "version": "0.5",
            "pushEvents": True,
            "contextHooks": {"beforeInference": True},
            "inferenceLifecycle": True,
            "channels": {"register": True, "publish": True, "incoming": True},
            "featureSets": {
                "demo.messaging": {
                    "description": "Demo",
                    "uses": ["channels.publish", "channels.incoming", "pushEvents", "tools"],
                }
            },
        }
        assert manifest_digest(manifest) == "sha256:_YZTS0h1tqTAMZI6eElCszSQE2WNx3xhAhmgUvNI9H4"

    def test_empty_object(self) -> None:
        """`{}` digests (the function is total over objects)."""
        assert manifest_digest({}) == "sha256:RBNvo1WzZ4oRRq0W9-hknpT7T8If536DEMBg9hyq_4o"

    def test_version_only(self) -> None:
        """`{"version":"0.5"}` gives its published revision."""
        assert manifest_digest({"version": "0.5"}) == "sha256:bzEkFjhXH4ynFLptjb7MFQkzMSEXiRkRuGnA1GVxF8g"


class TestRefusals:
    @pytest.mark.parametrize("value", [[], "x", None, 1, True])
    def test_not_an_object(self, value: Any) -> None:
        """A non-object manifest is refused with `manifest_not_object`."""
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest(value)
        assert caught.value.code == "manifest_not_object"

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
    def test_non_finite_number(self, value: Any) -> None:
        """NaN, infinities and integers beyond the double range are refused."""
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest({"x": {"n": value}})
        assert caught.value.code == "non_finite_number"

    @pytest.mark.parametrize(
        "manifest",
        [{"x": (1, 2)}, {"x": {1: True}}, {"version": "a\ud800b"}, {"x": {1, 2}}],
    )
    def test_not_json(self, manifest: dict[str, Any]) -> None:
        """Values JSON cannot carry are refused with `not_json`."""
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest(manifest)
        assert caught.value.code == "not_json"

    def test_too_deep(self) -> None:
        """Absurd nesting is refused instead of exhausting the recursion limit."""
        manifest: dict[str, Any] = {"version": "0.5"}
        node = manifest
        for _ in range(5000):
            node["x"] = {}
            node = node["x"]
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest(manifest)
        assert caught.value.code == "too_deep"

    def test_is_a_value_error(self) -> None:
        """Callers may catch a refusal as ValueError."""
        with pytest.raises(ValueError):
            manifest_digest([])


def _feature_set(**members: Any) -> dict[str, Any]:
    return {"version": "0.5", "featureSets": {"f": {"description": "d", "uses": ["tools"], **members}}}


class TestIdentifierPositions:
    def test_facet_is_checked(self) -> None:
        """`tags.<t>.facet` is an identifier, as in the reference generator."""
        manifest = _feature_set(tagOntology={"tags": {"demo:x": {"facet": "bad facet"}}})
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest(manifest)
        assert caught.value.code == "identifier_charset"

    def test_suggested_treatment_matchers_are_not_checked(self) -> None:
        """Rule matchers are free strings to the digest, as in the reference generator."""
        rules = [{"tagsAny": ["not an identifier"], "behavior": "mute"}]
        assert REVISION_SHAPE.fullmatch(manifest_digest(_feature_set(tagOntology={"suggestedTreatment": rules})))

    def test_keyed_values_checked_but_kept_in_order(self) -> None:
        """`keyed.*.values` elements are identifiers, and the list keeps its order."""
        with pytest.raises(ManifestDigestError):
            manifest_digest(_feature_set(tagOntology={"keyed": {"k": {"values": ["a b"]}}}))
        canonical = manifest_canonical_json(_feature_set(tagOntology={"keyed": {"k": {"values": ["z", "a"]}}}))
        assert '"values":["z","a"]' in canonical

    def test_capability_names_inside_arrays_are_checked(self) -> None:
        """Member names of objects nested in arrays under a capability are identifiers too."""
        with pytest.raises(ManifestDigestError) as caught:
            manifest_digest({"vendorExt": [{"bad name": 1}]})
        assert caught.value.code == "identifier_charset"

    def test_descriptions_and_version_are_free_text(self) -> None:
        """`description`, `desc` and `version` may hold any text."""
        manifest = _feature_set(tagOntology={"tags": {"demo:x": {"desc": "any text ✓"}}})
        manifest["version"] = "zero point five ✓"
        manifest["featureSets"]["f"]["description"] = "free / text"
        assert REVISION_SHAPE.fullmatch(manifest_digest(manifest))


class TestEcmascriptNumber:
    @pytest.mark.parametrize(
        ("value", "text"),
        [
            (1.0, "1"),
            (-0.0, "0"),
            (0, "0"),
            (-17, "-17"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (-1e21, "-1e+21"),
            (1e-6, "0.000001"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (2**53, "9007199254740992"),
            (2**53 + 1, "9007199254740992"),
            (10**21, "1e+21"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
        ],
    )
    def test_table(self, value: float, text: str) -> None:
        """Known values format as ECMAScript's Number::toString does."""
        assert ecmascript_number(value) == text

    @given(st.floats(allow_nan=False, allow_infinity=False))
    @example(1e-7)
    @example(1e21)
    @example(-0.0)
    def test_round_trips_in_ecmascript_grammar(self, value: float) -> None:
        """The text parses back to the same double and has ECMAScript's shape."""
        text = ecmascript_number(value)
        assert float(text) == value
        assert re.fullmatch(r"-?(0|[1-9]\d*)(\.\d*[1-9])?(e[+-][1-9]\d*)?", text)

    @given(st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1))
    def test_safe_integers_are_exact(self, value: int) -> None:
        """Integers below 2**53 print as themselves."""
        assert ecmascript_number(value) == str(value)


class TestComparator:
    def test_utf8_not_utf16(self) -> None:
        """U+FFFD sorts before U+10000 (UTF-16 would put the surrogate pair first)."""
        assert sorted(["\U00010000", "\ufffd"], key=utf8_sort_key) == ["\ufffd", "\U00010000"]


# --- properties -------------------------------------------------------------------

IDENTIFIER_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:*-"
identifiers = st.text(alphabet=IDENTIFIER_CHARS, min_size=1)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(alphabet=st.characters(exclude_categories=("Cs",))),
    ),
    # Small trees find the same bugs; big ones only make the suite crawl.
    lambda children: st.lists(children, max_size=4) | st.dictionaries(identifiers, children, max_size=4),
    max_leaves=20,
)
manifests = st.dictionaries(identifiers, json_values, max_size=5).map(
    lambda m: {**m, "featureSets": {"f": {"description": "d", "uses": ["tools", "pushEvents"]}}}
)


def _reversed_members(value: Any) -> Any:
    """The same JSON value with every object's members in reverse insertion order."""
    if isinstance(value, dict):
        return {k: _reversed_members(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_members(item) for item in value]
    return value


class TestProperties:
    @given(manifests)
    def test_member_order_never_matters(self, manifest: dict[str, Any]) -> None:
        """Reordering members at every depth leaves the digest unchanged."""
        assert manifest_digest(_reversed_members(manifest)) == manifest_digest(manifest)

    @given(manifests, json_values)
    def test_root_revision_is_ignored(self, manifest: dict[str, Any], revision: Any) -> None:
        """Whatever the root `revision` holds, the digest is that of the manifest without it."""
        without = {k: v for k, v in manifest.items() if k != "revision"}
        assert manifest_digest({**manifest, "revision": revision}) == manifest_digest(without)

    @given(manifests, st.permutations(["tools", "pushEvents", "modelInfo", "tools"]))
    def test_uses_is_a_set(self, manifest: dict[str, Any], uses: list[str]) -> None:
        """The order and duplicates of `uses` never change the digest."""
        a = {**manifest, "featureSets": {"f": {"description": "d", "uses": uses}}}
        b = {**manifest, "featureSets": {"f": {"description": "d", "uses": ["modelInfo", "pushEvents", "tools"]}}}
        assert manifest_digest(a) == manifest_digest(b)

    @given(manifests)
    def test_shape(self, manifest: dict[str, Any]) -> None:
        """Every digest is `sha256:` plus 43 base64url characters."""
        assert REVISION_SHAPE.fullmatch(manifest_digest(manifest))

    @given(manifests)
    def test_canonical_text_is_json_of_the_same_value(self, manifest: dict[str, Any]) -> None:
        """The canonical text parses back to the manifest without its root revision."""
        # Compare numbers as doubles: JCS prints 5.3774992013244050e16 as an integer.
        parsed = json.loads(manifest_canonical_json(manifest), parse_int=float)
        stripped = {k: v for k, v in manifest.items() if k != "revision"}
        expected = json.loads(json.dumps(stripped), parse_int=float)
        expected["featureSets"]["f"]["uses"] = sorted(set(expected["featureSets"]["f"]["uses"]))
        assert parsed == expected
