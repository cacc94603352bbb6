"""The overview's charts as geometry: bars in a fixed SVG coordinate space, drawn by the template (pure).

A chart is a row of bars, one per bucket (a minute, a day), scaled to the
largest value, with a label under its first, middle and last bucket and the
largest value on the axis. The template turns each `Bar` into a `<rect>`
with a `<title>` (the value, for a pointer or a screen reader): markup
only, no script and no style attribute, so the console's
Content-Security-Policy holds. The SVG's viewBox scales it to any width.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

#: The coordinate space every chart is drawn in (the viewBox); CSS scales it to the page's width.
WIDTH = 600.0
HEIGHT = 150.0
#: Room below the bars for the bucket labels, and left of them for the axis value.
LABEL_ROOM = 22.0
AXIS_ROOM = 56.0
#: Gap between bars, as a share of a bucket's width.
GAP_SHARE = 0.2


class Bar(msgspec.Struct, frozen=True):
    x: float
    y: float
    width: float
    height: float
    title: str  # "12:03: 5 items"


class Label(msgspec.Struct, frozen=True):
    x: float
    text: str
    anchor: str  # SVG text-anchor: the first label starts at its bar, the last ends at its bar, the middle one centres


class Chart(msgspec.Struct, frozen=True):
    title: str  # what is counted, e.g. "discord: items per minute"
    width: float
    height: float
    plot_left: float
    plot_bottom: float  # the y of the baseline
    bars: list[Bar]
    labels: list[Label]  # under the bars
    top: int  # the largest value (the axis label at the top)
    total: int


def bar_chart(title: str, buckets: Sequence[tuple[str, int]], unit: str) -> Chart:
    """A chart of `buckets` (label, value), oldest first; `unit` names what a value counts ("items")."""
    plot_width = WIDTH - AXIS_ROOM
    plot_height = HEIGHT - LABEL_ROOM
    top = max((value for _, value in buckets), default=0)
    step = plot_width / max(len(buckets), 1)
    bars = []
    for index, (label, value) in enumerate(buckets):
        height = plot_height * value / top if top else 0.0
        bars.append(Bar(x=round(AXIS_ROOM + index * step + step * GAP_SHARE / 2, 2),
                        y=round(plot_height - height, 2), width=round(step * (1 - GAP_SHARE), 2),
                        height=round(height, 2), title=f"{label}: {value} {unit}"))
    marks = sorted({0, len(buckets) // 2, len(buckets) - 1}) if buckets else []
    labels = [Label(x=round(AXIS_ROOM + (i + (0 if i == 0 else 1 if i == len(buckets) - 1 else 0.5)) * step, 2),
                    text=buckets[i][0], anchor="start" if i == 0 else "end" if i == len(buckets) - 1 else "middle")
              for i in marks]
    return Chart(title=title, width=WIDTH, height=HEIGHT, plot_left=AXIS_ROOM, plot_bottom=plot_height, bars=bars,
                 labels=labels, top=top, total=sum(value for _, value in buckets))
