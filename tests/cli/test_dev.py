"""`mcplhost dev` as a subprocess: the bundled stubs deliver into a real database, then it stops by itself."""

from __future__ import annotations

import json

from .support import cli


class TestDev:
    def test_dev_stores_items_from_the_bundled_stubs_and_exits_0(self, tmp_path) -> None:
        """dev --seconds 3 --db X runs the stubs, shows what arrives, stores it in X and exits 0."""
        db = tmp_path / "dev.db"
        result = cli("dev", "--seconds", "3", "--db", str(db), cwd=tmp_path, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        export = cli("messages", "--db", str(db), "--json")
        items = [json.loads(line) for line in export.stdout.splitlines()]
        assert items, result.stderr[-2000:]
        assert {item["metadata"]["serverId"] for item in items} <= {"stub", "heartbeat", "console"}
        first = items[0]
        assert first["metadata"]["serverId"] == "stub" and first["participant"] == "Alice"
        assert first["content"][-1]["text"] == "Good morning, everyone."
        assert "Good morning, everyone." in result.stdout  # the live view
        assert f"messages --db {db}" in result.stderr.splitlines()[-1]
