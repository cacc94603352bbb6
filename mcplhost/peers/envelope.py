"""The two framings of a peer message, and the neutralising of lookalike tags (docs/peers.md#the-envelope-and-lookalikes).

Pure. A message to an ancestor or a sibling is an *envelope*: three lines,
OPEN_TAG, one line of JSON, CLOSE_TAG. The JSON is written so that no
sender text can end, reopen or forge the envelope and `json.loads` still
gives every field back exactly: each `</` is written `<\\/`, each `<` that
begins a lookalike tag `\\u003c` (its own escape for the look-alike forms of
`<`), and the characters `str.splitlines` breaks on that JSON leaves raw
(U+0085, U+2028, U+2029) and lone surrogates (which UTF-8 cannot store) as
`\\uXXXX`. So the JSON line holds no line break: no line of an envelope can
begin with a `[source:` header.

A message to a descendant is trusted *guidance*: "Guidance from <sender>:"
and the text, its `[source:` openings marked (docs/provenance.md §4).

`neutralise` gives every lookalike tag in untrusted text one visible escape,
a backslash before its `<`, the way the mark stage treats `[source:`; the
compiler applies it wherever untrusted text reaches a model
(docs/agents.md#compilation), so only host-made envelopes read as envelopes.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Literal, get_args

import msgspec

from mcplhost.inbound import mark_openings
from mcplhost.inbound.lookalikes import forms, reads_as
from mcplhost.inbound.patterns import derived_ignorable_class

__all__ = [
    "CLOSE_TAG",
    "EnvelopePayload",
    "LESS_THAN_BYTES",
    "LESS_THAN_FORMS",
    "lookalike_re",
    "OPEN_TAG",
    "RELATIONSHIPS",
    "Relationship",
    "envelope",
    "guidance",
    "neutralise",
    "parse_envelope",
]

TAG_NAME = "mcpl_agent_message"
OPEN_TAG = f"<{TAG_NAME}>"
CLOSE_TAG = f"</{TAG_NAME}>"

#: The envelope's `relationship`: the sender's relation to the recipient (a descendant writing to an ancestor,
#: or any other member of the tree). Guidance, to a descendant, has no envelope.
Relationship = Literal["sibling", "descendant"]
RELATIONSHIPS: tuple[str, ...] = get_args(Relationship)

#: The payload's keys, in the order the envelope writes them.
PAYLOAD_KEYS = ("from", "fromTitle", "relationship", "message")


class EnvelopePayload(msgspec.Struct, frozen=True, rename={"sender": "from", "title": "fromTitle"}):
    """What one envelope says (PAYLOAD_KEYS, in their order, as its JSON line names them)."""

    sender: str
    title: str | None
    relationship: Relationship
    message: str

# ---------------------------------------------------------------------------
# Lookalikes (docs/peers.md#the-envelope-and-lookalikes).
# ---------------------------------------------------------------------------

#: Every character that reads as `<` (docs/provenance.md §4a): `<`, its fullwidth and small forms, `‹`, `ᐸ` …
LESS_THAN_FORMS = forms("<")
#: The same, each as UTF-8 (as in JSON bytes): bytes holding none of them hold no lookalike.
LESS_THAN_BYTES = tuple(form.encode() for form in LESS_THAN_FORMS)

# A lookalike is the `<` of `<` then optionally `/`, then the letters of the tag's name, with any run of
# ignorables (as in a `[source:` opening, docs/provenance.md §4) between any two of them; each of those
# characters may be any that reads as it (docs/provenance.md §4a: case folding, and the look-alikes of the confusables data).
# Nothing needs to follow the name. The `<` is matched, the rest only looked at.
#
# Linear time: nothing that reads as `<` is an ignorable or reads as `/` or a letter
# (tests/inbound/test_lookalikes.py), so the lookahead started at one `<` never reads past the next `<`; and
# no two `*` runs stand side by side (with the `/` absent too), so no run is split two ways: each attempt
# backtracks over each character at most once.
#
# On the stdlib `re` engine, like the opening pattern (mcplhost/inbound/patterns.py `fast_opening_re`), with
# the same ignorable class derived from the `regex` tables: `regex` took about three times as long on a
# megabyte of `<`.


def _lookalike(ignorable: str) -> str:
    letters = reads_as(TAG_NAME[0]) + "".join(f"{ignorable}*{reads_as(letter)}" for letter in TAG_NAME[1:])
    return rf"{reads_as('<')}(?={ignorable}*(?:{reads_as('/')}{ignorable}*)?{letters})"


@functools.cache
def lookalike_re() -> re.Pattern[str]:
    """The `<` of every lookalike tag, the real tags included (compiled on first use)."""
    return re.compile(_lookalike(derived_ignorable_class()))


@functools.cache
def _unescaped_lookalike_re() -> re.Pattern[str]:
    """The same, without a backslash directly before it: `neutralise` leaves an escaped lookalike as it is."""
    return re.compile(rf"(?<!\\){_lookalike(derived_ignorable_class())}")


# re.sub template for "the matched `<`, with a backslash before it".
_ESCAPED_TEMPLATE = r"\\\g<0>"

# What `json.dumps(ensure_ascii=False)` leaves raw and must not be: line breaks beyond the ones it escapes,
# and lone surrogates.
_RAW_IN_JSON_RE = re.compile("[\x85\u2028\u2029\ud800-\udfff]")


def neutralise(text: str) -> str:
    """`text` with one backslash before the `<` of every lookalike tag that has none directly before it.

    Idempotent (unlike the mark stage, whose output is stored): a text may
    pass through more than one rendering on its way to a model, and an
    escape already there is all a reader needs. Text without any form of
    `<` is returned as it is, the same object.
    """
    if all(form not in text for form in LESS_THAN_FORMS):
        return text
    return _unescaped_lookalike_re().sub(_ESCAPED_TEMPLATE, text)


# ---------------------------------------------------------------------------
# The envelope.
# ---------------------------------------------------------------------------


def _json_escape(match: re.Match[str]) -> str:
    """The matched character as JSON `\\uXXXX` escapes: one per UTF-16 code unit (two past U+FFFF, as `𝈶` is)."""
    units = match.group().encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{int.from_bytes(units[at:at + 2], 'big'):04x}" for at in range(0, len(units), 2))


def envelope(sender: str, title: str | None, relationship: Relationship, message: str) -> str:
    """The envelope of `message` from `sender` (titled `title`, or null): OPEN_TAG, one JSON line, CLOSE_TAG."""
    if relationship not in RELATIONSHIPS:
        raise ValueError(f"not an envelope relationship: {relationship!r}")
    payload = {"from": sender, "fromTitle": title, "relationship": relationship, "message": message}
    line = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    line = _RAW_IN_JSON_RE.sub(_json_escape, line)
    # A `<` stands only inside a JSON string, where `\/` and `\uXXXX` are escapes like any other.
    line = line.replace("</", "<\\/")
    line = lookalike_re().sub(_json_escape, line)
    return f"{OPEN_TAG}\n{line}\n{CLOSE_TAG}"


def parse_envelope(text: str) -> EnvelopePayload | None:
    """The payload of `text`, or None unless it is exactly one envelope, written byte for byte as `envelope`
    writes it."""
    head, tail = f"{OPEN_TAG}\n", f"\n{CLOSE_TAG}"
    if not (text.startswith(head) and text.endswith(tail)) or len(text) < len(head) + len(tail):
        return None
    line = text[len(head):-len(tail)]
    if "\n" in line or not line.startswith('{"from":'):
        return None
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: arrays nested past the parser's depth
        return None
    if not isinstance(payload, dict) or tuple(payload) != PAYLOAD_KEYS:
        return None
    sender, title, relationship, message = (payload[key] for key in PAYLOAD_KEYS)
    if not (isinstance(sender, str) and (title is None or isinstance(title, str))
            and relationship in RELATIONSHIPS and isinstance(message, str)):
        return None
    if envelope(sender, title, relationship, message) != text:
        return None
    return EnvelopePayload(sender, title, relationship, message)


# ---------------------------------------------------------------------------
# Guidance.
# ---------------------------------------------------------------------------


def guidance(sender: str, message: str) -> str:
    """What a descendant reads from `sender`: "Guidance from <sender>:" then `message`, its openings marked.

    Not neutralised here: the compiler neutralises it, like all text it
    shows a model (docs/agents.md#compilation).
    """
    (marked,) = mark_openings([{"type": "text", "text": message}])
    return f"Guidance from {sender}:\n{marked['text']}"
