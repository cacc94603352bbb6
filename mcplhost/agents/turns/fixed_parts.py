"""The parts of a request the cut never touches, kept within `context_chars` (docs/agents.md#compilation, Budget).

    hooks = bounded_injections(injections, context_chars=3000, message_cap=750)   # together at most 3000 // 4
    tools, hooks, left_out = within_room(tools, hooks, room=3000 - rest_of_fixed)

Rows are cut to fit; the fixed parts (the system prompt, the offered tools,
the `context/beforeInference` hooks' injections, the host's own lines) are
not, so without a bound of their own they could fill the request alone and
push it past the limit with the one line that says what did not fit. Two
bounds keep the whole within `context_chars`:

- the hooks' injections together take at most 1/INJECTIONS_MAX_DIVISOR of
  it (`bounded_injections`): system ones first, then those before the
  waking items, then those after, each clipped head and tail to the room
  left, one with no room left out;
- when the fixed parts still leave less than the room for the line naming
  the waking items left out, injections go (the last first), then offered
  tools (the last first) until it is there (`within_room`).

What remains beyond any bound is the agent's own system prompt, the host's
rules and notices: the request stays within `context_chars` whenever those fit.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from mcplhost.agents.model import ToolSpec
from mcplhost.agents.tools.listing import tool_chars
from mcplhost.agents.turns.history import Part, shown_text

#: Hook injections together take at most this share of `context_chars` (1/4).
INJECTIONS_MAX_DIVISOR = 4
#: Room kept, when an injection is clipped, for the [host] line saying how much was cut.
CLIP_LINE_ROOM = 120


class HookTexts(msgspec.Struct, frozen=True):
    """The injections as shown to the model (neutralised, clipped), by where they go."""

    system: list[str] = []
    before_user: list[list[Part]] = []
    after_user: list[list[Part]] = []
    left_out: int = 0

    def chars(self) -> int:
        """What they count against `context_chars` (a message's parts joined by "\\n", as `draft_chars`)."""
        return sum(len(text) + 2 for text in self.system) + sum(map(_parts_chars, self.before_user + self.after_user))


def _parts_chars(parts: list[Part]) -> int:
    return sum(len(part) + 1 for part in parts if isinstance(part, str))


def bounded_injections(system: list[str], before_user: list[str], after_user: list[str], *, context_chars: int,
                       message_cap: int) -> HookTexts:
    """The non-empty injections shown, each within `message_cap`, together within context_chars // 4."""
    room = context_chars // INJECTIONS_MAX_DIVISOR
    left_out = 0

    def shown(texts: list[str], count: Callable[[list[Part]], int]) -> list[list[Part]]:
        nonlocal room, left_out
        kept: list[list[Part]] = []
        for text in texts:
            if not text:
                continue
            parts = shown_text([text], message_cap, "injection")
            if count(parts) > room:  # clipped again to the room left, with room for the line saying so
                cap = min(message_cap, room - CLIP_LINE_ROOM)
                parts = shown_text([text], cap, "injection") if cap > 0 else []
            chars = count(parts)
            if not parts or chars > room:
                left_out += 1
                continue
            kept.append(parts)
            room -= chars
        return kept

    system_texts = [str(parts[0]) for parts in shown(system, lambda parts: _parts_chars(parts) + 1)]
    before = shown(before_user, _parts_chars)
    after = shown(after_user, _parts_chars)
    return HookTexts(system=system_texts, before_user=before, after_user=after, left_out=left_out)


def within_room(tools: list[ToolSpec], hooks: HookTexts, *, room: int) -> tuple[list[ToolSpec], HookTexts, int]:
    """`tools` and `hooks` less what must go so they take at most `room` (injections first, the last first;
    then tools, the last first), and how many went."""
    tools = list(tools)
    system, before, after = list(hooks.system), list(hooks.before_user), list(hooks.after_user)
    used = sum(map(tool_chars, tools)) + hooks.chars()
    gone = 0
    while used > room:
        if after:
            used -= _parts_chars(after.pop())
        elif before:
            used -= _parts_chars(before.pop())
        elif system:
            used -= len(system.pop()) + 2
        elif tools:
            used -= tool_chars(tools.pop())
        else:
            break
        gone += 1
    if not gone:
        return tools, hooks, 0
    return tools, HookTexts(system=system, before_user=before, after_user=after, left_out=hooks.left_out), gone
