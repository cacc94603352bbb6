"""The exports over stored rows of every kind print exactly the committed bytes (tests/cli/rows_fixture.py).

`messages`, `turns`, `outbox` and `explain --json`, and the status object's agents, are public shapes
(README.md#commands): a change to how rows are typed, built or read must not move one byte of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from mcplhost.store import open_store

from .rows_fixture import CONFIG, FIXTURES, ROWS_SQL, exports, load_rows, status_agents, write_rows
from .support import cli


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mcplhost.toml"
    path.write_text(CONFIG.replace('"python"', json.dumps(sys.executable)), encoding="utf-8")
    return path


def expected() -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in FIXTURES.iterdir()
            if path.suffix in (".jsonl", ".json")}


def check_exports(db: Path, config: Path) -> None:
    wanted = expected()
    found = exports(db, config, cli)
    found["status-agents.json"] = anyio.run(status_agents, db)
    assert sorted(found) == sorted(wanted)
    for name, output in found.items():
        assert output == wanted[name], name


class TestExportBytes:
    def test_the_committed_rows_export_as_committed(self, tmp_path: Path, config: Path) -> None:
        db = tmp_path / "rows.db"

        async def migrated() -> None:
            async with open_store(db):
                pass

        anyio.run(migrated)
        load_rows(db, ROWS_SQL.read_text(encoding="utf-8"))
        check_exports(db, config)

    def test_rows_written_now_export_as_committed(self, tmp_path: Path, config: Path) -> None:
        db = tmp_path / "rows.db"
        anyio.run(write_rows, db)
        check_exports(db, config)
