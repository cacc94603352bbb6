"""The console's templates rendered straight from their view objects (mcplhost/console/app.py, views.py, charts.py).

The overview takes the status object as `status --json` prints it, so what
another part of the host adds to it (`hosts`, a `standby` state and its
`owner`) shows up; every printed value is redacted of the host's secrets.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from mcplhost.cli.serve import console_lines
from mcplhost.console.access import Gate
from mcplhost.console.app import Pages
from mcplhost.console.charts import HEIGHT, WIDTH, bar_chart
from mcplhost.console.feed import Feed
from mcplhost.console.views import Overview, blocks_of
from mcplhost.secrets import Secrets
from mcplhost.store import StoredItem

SECRET = "hunter2-is-not-a-token-xyz"


def status(**extra: Any) -> dict[str, Any]:
    return {"host": {"pid": 1, "version": "0.1.0", "startedAt": 1, "schemaVersion": 8, "db": "/x.db", "dbBytes": 9},
            "connectors": [{"name": "discord", "state": "standby", "pid": None, "restarts": 0,
                            "lastError": f"refused: {SECRET}", "lastInboundAt": None, "lastPublishAt": None,
                            "channels": 0, "grant": [], "quiet": False, "owner": "eu-2"}],
            "agents": [{"name": "scout", "state": "idle", "pendingWakes": 0}], **extra}


def render(name: str, **context: Any) -> str:
    pages = Pages(None, Feed(console_lines()), Gate(None), Secrets({"X_TOKEN": SECRET}),  # type: ignore[arg-type]
                  actions=frozenset())
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})
    return bytes(pages.render(request, name, title="t", **context).body).decode()


def overview(**extra: Any) -> Overview:
    return Overview(status=status(**extra), tokens_24h={"scout": 5}, item_charts=[], turn_charts=[], token_charts=[])


class TestOverview:
    def test_hosts_render_when_the_status_has_them(self) -> None:
        """Each host sharing the store is a card with its fields; without `hosts` there is no such section."""
        hosts = [{"name": "eu-1", "pid": 10, "version": "0.2.0", "startedAt": 1, "heartbeatAgeMs": 120,
                  "connectors": ["slack"], "agents": ["scout"]},
                 {"name": "eu-2", "pid": 11, "version": "0.2.0", "startedAt": 1, "heartbeatAgeMs": 80,
                  "connectors": ["discord"], "agents": []}]
        page = render("overview.html", view=overview(hosts=hosts), restarted=None)
        assert 'id="hosts"' in page and 'data-host="eu-1"' in page and 'data-host="eu-2"' in page
        assert "120 ms" in page and 'id="hosts"' not in render("overview.html", view=overview(), restarted=None)

    def test_a_field_the_status_gains_shows_and_secrets_do_not(self) -> None:
        """`standby` is the state word; `owner` is a field of the card; the last error's secret is redacted."""
        page = render("overview.html", view=overview(), restarted=None)
        assert '<p class="state state-standby" data-field="state">standby</p>' in page
        assert '<dt>owner</dt><dd data-field="owner">eu-2</dd>' in page
        assert SECRET not in page and "[redacted:X_TOKEN]" in page


class TestItemBlocks:
    def test_the_header_blocks_then_the_body_each_as_text(self) -> None:
        """Header blocks are those equal to metadata.sourceHeader at the start (as readers drop them); a
        non-text block is its JSON."""
        header = "[source: disc / disc:g1:room · #room]"
        item = StoredItem(id=1, agent=None, participant="A", role="user", created_at=1,
                          content=[{"type": "text", "text": header}, {"type": "image", "data": "<svg onload=x>"},
                                   {"type": "text", "text": header}],
                          metadata={"sourceHeader": header})
        blocks = blocks_of(item)
        assert [b.part for b in blocks] == ["header", "body", "body"]
        assert blocks[1].text == '{"type":"image","data":"<svg onload=x>"}' and blocks[2].text == header


class TestCharts:
    @given(st.lists(st.tuples(st.text(max_size=5), st.integers(0, 10**9)), max_size=80))
    def test_bars_stay_in_the_plot_and_scale_with_their_values(self, buckets: list[tuple[str, int]]) -> None:
        """Every bar is inside the drawing, the tallest reaches the top, and a bar's height is its share."""
        chart = bar_chart("t", buckets, "items")
        assert len(chart.bars) == len(buckets) and chart.total == sum(v for _, v in buckets)
        for bar, (_, value) in zip(chart.bars, buckets):
            assert 0 <= bar.x and bar.x + bar.width <= WIDTH + 0.01 and 0 <= bar.y <= chart.plot_bottom
            assert bar.height <= chart.plot_bottom + 0.01 and bar.y + bar.height <= HEIGHT
            if chart.top:
                assert abs(bar.height - chart.plot_bottom * value / chart.top) < 0.01
        assert len(chart.labels) == min(len(buckets), 3)
