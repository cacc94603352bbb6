"""metrics/turns.py: `mcplhost_turns_total` is the turns ledger counted by outcome, across scrapes and restarts."""

from __future__ import annotations

from pathlib import Path

from mcplhost.metrics.turns import TurnTally
from mcplhost.store import open_store
from mcplhost.store.operations import BeginTurn, FinishTurn, RecordTurn

from ..store.test_writer import running


async def test_each_scrape_counts_the_whole_ledger_and_a_new_tally_agrees(tmp_path: Path) -> None:
    """A turn running at one scrape is counted once it ends; a fresh tally (a restarted host) reads the same."""
    async with open_store(tmp_path / "host.db") as store, running(store) as writer:
        tally = TurnTally()
        await writer.submit(RecordTurn("scout", (), 0, 1, "completed"))
        open_turn = await writer.write(BeginTurn("scout", (), 2))
        await writer.submit(RecordTurn("scout", (), 3, 4, "failed"))
        assert await tally.read(store.turns) == {("scout", "completed"): 1, ("scout", "failed"): 1}
        await writer.submit(FinishTurn(open_turn, 5, "aborted", None, None, None, reason="shutdown"))
        await writer.submit(RecordTurn("scout", (), 6, 7, "failed"))
        expected = {("scout", "completed"): 1, ("scout", "failed"): 2, ("scout", "aborted"): 1}
        assert await tally.read(store.turns) == expected
        assert await tally.read(store.turns) == expected
        assert await TurnTally().read(store.turns) == expected
