"""`{{echo}}` through `mcplhost run`: the reply says back the item that woke the turn, not the newest one.

A DM wakes the agent; while its wake is debouncing, a plain message (which
wakes no one) arrives in the same room and is the newest item of the turn's
context. The reply must echo the DM.
"""

from __future__ import annotations

import signal
from pathlib import Path

from ..builders import incoming, message
from ..cli.support import daemon
from ..harness import wait_for
from .test_speech import REGISTER, ROOM, config_for, delivered, published_text, publishes

DANA = {"id": "u-dana", "name": "Dana"}


class TestWakingEcho:
    async def test_echo_is_the_waking_item_even_with_a_newer_item_in_context(self, tmp_path: Path) -> None:
        """DM, then a plain line inside the debounce: one turn, and its publish echoes the DM."""
        db = tmp_path / "host.db"
        steps = [REGISTER, incoming(message(ROOM, "m-1", "the private question", author=DANA, tags=["chat:dm"])),
                 incoming(message(ROOM, "m-2", "a newer line that wakes no one", author=DANA, tags=[])),
                 {"wait": "channels/publish"}]
        # 1 s of debounce: the second message is stored well before the turn compiles its context.
        async with daemon(config_for(tmp_path, steps, ["you said: {{echo}}"], debounce_ms=1000), tmp_path) as run:
            await wait_for(lambda: delivered(db), timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        (sent,) = publishes(tmp_path)
        assert published_text(sent) == "you said: the private question"
