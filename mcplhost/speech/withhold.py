"""Withholding speech that holds a secret value (docs/agents.md#secrets): pure rules over routed segments.

    segments, names = withhold_secrets(segments, secrets)   # routed segments holding one become drafts
    notice += secret_notice(names)                         # names the variables, never their values

A withheld draft's text is redacted here already, so the value is in no row
the turn holds (the store redacts every row it writes anyway:
mcplhost/store/db.py `RedactingWriter`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mcplhost.secrets import Secrets
from mcplhost.speech.routing import Segment

#: The reason of a draft, a refused `channel_publish` and a refused connector tool call holding a secret.
SECRET = "secret"


def withhold_secrets(segments: Sequence[Segment], secrets: Secrets) -> tuple[list[Segment], list[str]]:
    """`segments` with each routed one that holds a secret made a draft (reason `secret`, `target` where it was
    going); and the variables found, in order, once each."""
    if not secrets:
        return list(segments), []
    kept: list[Segment] = []
    names: list[str] = []
    for segment in segments:
        name = secrets.find(segment.text) if segment.destination is not None else None
        if name is None:
            kept.append(segment)
            continue
        kept.append(Segment(text=secrets.redact(segment.text), destination=None, reason=SECRET,
                            target=segment.destination))
        if name not in names:
            names.append(name)
    return kept, names


def secret_notice(names: Sequence[str]) -> str:
    """The notice's line about drafts withheld for a secret ("" for none): the variables, never the values."""
    if not names:
        return ""
    return (f"\nWithheld: it holds the value of the secret {', '.join(names)}; secrets are never sent, stored or"
            " logged. Rewrite it without the value.")


def publish_refusal(name: str) -> dict[str, str]:
    """`channel_publish`'s answer when its arguments hold a secret: refused, naming the variable."""
    return {"status": "refused", "reason": SECRET, "detail": f"the arguments hold the value of {name}; not sent"}
