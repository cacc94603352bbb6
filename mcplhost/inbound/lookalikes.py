"""Reading a character as what it looks like (docs/provenance.md §4a): the one matcher every mark uses.

A reader takes `［ѕоurсе： x］` for a header as readily as `[source: x]`. So
where the host marks text (a `[source:` opening, a sender's `from:` line, a
`<mcpl_agent_message` tag), each character of the shape may be any
character that *reads as* it: one whose case folding, or the case folding of
its NFKC form, of its UTS #39 confusables skeleton, or of its NFKC form's
skeleton, is that character. NFKC is what makes `［` a `[` (the skeleton
alone makes it `(`); the plain case folding keeps the `S` and `ſ` of
docs/provenance.md §4; NFKC with case folding keeps `ｍ` an `m` (the
skeleton of `m` is `rn`). Each character is read on its own: `rn` is not
`m`.

The characters come from mcplhost/inbound/lookalikes_table.py, generated
from ICU's spoof checker by tests/inbound/confusables.py (its Unicode
version is UNICODE_VERSION); none is listed by hand. No character that
reads as printable ASCII is an ignorable, and no `[` or `<` look-alike
reads as anything else its pattern holds, so the patterns built from these
classes keep their linear-time arguments (tests/inbound/test_lookalikes.py
checks both).
"""

from __future__ import annotations

import re

from mcplhost.inbound.lookalikes_table import READS_AS, UNICODE_VERSION

__all__ = ["UNICODE_VERSION", "forms", "reads_as"]


def forms(char: str) -> str:
    """Every character that reads as `char` (printable ASCII, a letter in lower case), `char` itself among them."""
    return READS_AS[char]


def reads_as(*chars: str) -> str:
    """A character class (for `re` and `regex` alike) matching one character that reads as any of `chars`."""
    return "[" + "".join(re.escape(form) for char in chars for form in forms(char)) + "]"
