"""`mcplhost dev`: the bundled stub connectors on the embedded defaults, with a live view."""

from __future__ import annotations

import sys
from pathlib import Path

from .config import Config, ConnectorConfig, StoreConfig
from .store import NewItem


def dev_config(db: Path) -> Config:
    python = sys.executable
    return Config(
        store=StoreConfig(path=str(db)),
        connectors=[
            ConnectorConfig(
                name="stub",
                command=[python, "-m", "mcplhost.connectors.stub"],
                env={"STUB_MESSAGES": "0", "STUB_INTERVAL_S": "1.5"},
                grant=["channels.register", "channels.incoming", "pushEvents"],
            ),
            ConnectorConfig(
                name="heartbeat",
                command=[python, "-m", "mcplhost.connectors.heartbeatish"],
                env={"HEARTBEAT_INTERVAL_S": "4", "HEARTBEAT_QUIRKS": "banner,host_command"},
                grant=["pushEvents", "tools"],
            ),
        ],
    )


def print_item(items: list[NewItem]) -> None:
    for item in items:
        texts = [b.get("text", f"<{b.get('type')}>") for b in item.content]
        who = item.participant or "-"
        print(f"  {who:>14} | " + " ".join(texts), flush=True)
