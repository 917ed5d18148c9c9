"""A small SVG writer for the HTML report: linear and log scales, axes with ticks, bars, lines, points
with error bars, reference lines, a sparkline, and a figure that only says why it has no data.

Standard library only (the xdist controller renders the report). The output is inline SVG for an
HTML5 page: the HTML parser puts `<svg>` in the SVG namespace, so no `xmlns` is written and the
report holds no URL of any kind. Every text is escaped (`esc`); styling is by class, from the page's
stylesheet. Hovering a bar or a point shows its `<title>`.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Figure", "Scale", "esc", "log_ticks", "message", "nice_ticks", "sparkline"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def esc(text: object) -> str:
    """Text for HTML or SVG: `& < > " '` escaped, control characters (which XML cannot hold) dropped."""
    return html.escape(_CONTROL.sub("", str(text)), quote=True)


def _n(x: float) -> str:
    """A coordinate: one decimal, no trailing zeros (the SVG's size grows with every digit)."""
    text = f"{x:.1f}"
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Scale:
    """Data [lo, hi] onto pixels [a, b] (b < a for a y axis: SVG's y grows downwards); values outside clamp."""

    lo: float
    hi: float
    a: float
    b: float
    log: bool = False

    def __post_init__(self) -> None:
        if self.log and not 0 < self.lo < self.hi:
            raise ValueError(f"a log scale needs 0 < lo < hi, got {self.lo}, {self.hi}")
        if not self.lo < self.hi:
            raise ValueError(f"a scale needs lo < hi, got {self.lo}, {self.hi}")

    def __call__(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo) if v > 0 else self.lo
            t = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            t = (v - self.lo) / (self.hi - self.lo)
        return self.a + min(1.0, max(0.0, t)) * (self.b - self.a)

    def ticks(self, n: int = 5) -> list[float]:
        return log_ticks(self.lo, self.hi, n) if self.log else nice_ticks(self.lo, self.hi, n)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` ticks at 1, 2 or 5 x 10^k steps within [lo, hi]."""
    raw = (hi - lo) / max(1, n)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(round(k * step, 12))
        k += 1
    return ticks


def log_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Powers of ten within [lo, hi], every k-th when there are more than `n` decades."""
    first, last = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    every = max(1, math.ceil((last - first + 1) / max(1, n)))
    return [10.0**e for e in range(first, last + 1) if (e - first) % every == 0]


def _tick_label(v: float, log: bool) -> str:
    if log:
        e = round(math.log10(v))
        return {0: "1", 1: "10", 2: "100", -1: "0.1", -2: "0.01"}.get(e, f"1e{e}")
    return f"{v:g}"


class Figure:
    """One plot: a plotting area inside margins, an x and a y scale, and the marks drawn so far."""

    def __init__(
        self,
        *,
        x: tuple[float, float],
        y: tuple[float, float],
        width: int = 640,
        height: int = 220,
        xlog: bool = False,
        ylog: bool = False,
        label: str = "",
        margin: tuple[int, int, int, int] = (56, 12, 14, 40),
    ) -> None:
        left, top, right, bottom = margin
        self.width, self.height, self.label = width, height, label
        self.left, self.top, self.right, self.bottom = left, top, width - right, height - bottom
        self.x = Scale(x[0], x[1], self.left, self.right, xlog)
        self.y = Scale(y[0], y[1], self.bottom, self.top, ylog)
        self._marks: list[str] = []
        self._labels = [0, 0]  # reference lines labelled so far (horizontal, vertical): where the next label goes

    # -- axes ----------------------------------------------------------------------------------

    def axes(
        self,
        *,
        xlabel: str = "",
        ylabel: str = "",
        xticks: Sequence[tuple[float, str]] | None = None,
        yticks: Sequence[tuple[float, str]] | None = None,
        xfmt: Callable[[float], str] | None = None,
        yfmt: Callable[[float], str] | None = None,
        grid: bool = True,
    ) -> Figure:
        """Both axes with their ticks (given, or chosen by the scale) and labels; a light grid along y."""
        out = ['<g class="axis">']
        if xticks is None:
            xticks = [(v, xfmt(v) if xfmt else _tick_label(v, self.x.log)) for v in self.x.ticks()]
        if yticks is None:
            yticks = [(v, yfmt(v) if yfmt else _tick_label(v, self.y.log)) for v in self.y.ticks()]
        for v, text in yticks:
            py = _n(self.y(v))
            if grid:
                out.append(f'<line class="grid" x1="{_n(self.left)}" x2="{_n(self.right)}" y1="{py}" y2="{py}"/>')
            out.append(f'<text x="{_n(self.left - 5)}" y="{py}" text-anchor="end" dy="0.32em">{esc(text)}</text>')
        for v, text in xticks:
            px = _n(self.x(v))
            out.append(f'<line x1="{px}" x2="{px}" y1="{_n(self.bottom)}" y2="{_n(self.bottom + 4)}"/>')
            out.append(f'<text x="{px}" y="{_n(self.bottom + 15)}" text-anchor="middle">{esc(text)}</text>')
        out.append(f'<line x1="{_n(self.left)}" x2="{_n(self.right)}" y1="{_n(self.bottom)}" y2="{_n(self.bottom)}"/>')
        out.append(f'<line x1="{_n(self.left)}" x2="{_n(self.left)}" y1="{_n(self.top)}" y2="{_n(self.bottom)}"/>')
        if xlabel:
            out.append(
                f'<text class="label" x="{_n((self.left + self.right) / 2)}" y="{_n(self.height - 4)}" '
                f'text-anchor="middle">{esc(xlabel)}</text>'
            )
        if ylabel:
            cy = _n((self.top + self.bottom) / 2)
            out.append(
                f'<text class="label" x="12" y="{cy}" text-anchor="middle" '
                f'transform="rotate(-90 12 {cy})">{esc(ylabel)}</text>'
            )
        out.append("</g>")
        self._marks.extend(out)
        return self

    # -- marks ---------------------------------------------------------------------------------

    def bars(
        self, bars: Sequence[tuple[float, float, float, str]], *, cls: str = "bar", base: float | None = None
    ) -> Figure:
        """(x0, x1, height, tooltip) rectangles from `base` (default: the y scale's bottom) up to height."""
        y0 = self.y(self.y.lo if base is None else base)
        for x0, x1, h, tip in bars:
            px0, px1, py = self.x(x0), self.x(x1), self.y(h)
            top, tall = min(py, y0), abs(y0 - py)
            self._marks.append(
                f'<rect class="{esc(cls)}" x="{_n(px0)}" y="{_n(top)}" '
                f'width="{_n(max(0.5, px1 - px0))}" height="{_n(tall)}">{_title(tip)}</rect>'
            )
        return self

    def line(self, points: Sequence[tuple[float, float | None]], *, cls: str = "line", tip: str = "") -> Figure:
        """A polyline through the points; a point whose y is None breaks the line there."""
        runs: list[list[str]] = [[]]
        for x, y in points:
            if y is None:
                runs.append([])
            else:
                runs[-1].append(f"{_n(self.x(x))},{_n(self.y(y))}")
        for run in runs:
            if len(run) == 1:
                px, py = run[0].split(",")
                self._marks.append(f'<circle class="{esc(cls)} dot" cx="{px}" cy="{py}" r="2">{_title(tip)}</circle>')
            elif run:
                self._marks.append(f'<polyline class="{esc(cls)}" points="{" ".join(run)}">{_title(tip)}</polyline>')
        return self

    def points(
        self,
        points: Sequence[tuple[float, float | None, float | None, float | None, str]],
        *,
        cls: str = "point",
        r: float = 3.0,
        unbounded: tuple[bool, bool] = (True, True),
    ) -> Figure:
        """(x, y, lower, upper, tooltip): a dot and its interval as an error bar. An end that is None is
        unbounded when `unbounded` says so (the bar runs to the plot's edge, drawn dashed) and absent otherwise."""
        for x, y, lo, hi, tip in points:
            px, centre = self.x(x), (self.y(y) if y is not None else None)
            ends: list[tuple[float, bool]] = []  # (pixel, unbounded) of the lower end, then the upper
            for end, edge, open_ in ((lo, self.y.lo, unbounded[0]), (hi, self.y.hi, unbounded[1])):
                if end is not None:
                    ends.append((self.y(end), False))
                elif open_:
                    ends.append((self.y(edge), True))
                elif centre is not None:
                    ends.append((centre, False))
            if len(ends) == 2 and ends[0][0] != ends[1][0]:
                dashed = " open" if ends[0][1] or ends[1][1] else ""
                self._marks.append(
                    f'<line class="err{dashed}" x1="{_n(px)}" x2="{_n(px)}" y1="{_n(ends[0][0])}" '
                    f'y2="{_n(ends[1][0])}"/>'
                )
                for end_px, is_open in ends:
                    if not is_open and end_px != centre:
                        self._marks.append(
                            f'<line class="err" x1="{_n(px - 3)}" x2="{_n(px + 3)}" '
                            f'y1="{_n(end_px)}" y2="{_n(end_px)}"/>'
                        )
            if centre is not None:
                self._marks.append(
                    f'<circle class="{esc(cls)}" cx="{_n(px)}" cy="{_n(centre)}" r="{_n(r)}">{_title(tip)}</circle>'
                )
        return self

    def hline(self, y: float, *, cls: str = "ref", label: str = "") -> Figure:
        """A line across the plot at data y; labels alternate between its right and left ends."""
        py = _n(self.y(y))
        self._marks.append(f'<line class="{esc(cls)}" x1="{_n(self.left)}" x2="{_n(self.right)}" y1="{py}" y2="{py}"/>')
        if label:
            right = self._labels[0] % 2 == 0
            self._labels[0] += 1
            x, anchor = (self.right - 2, "end") if right else (self.left + 4, "start")
            self._marks.append(
                f'<text class="{esc(cls)}-label" x="{_n(x)}" y="{py}" dy="-0.3em" '
                f'text-anchor="{anchor}">{esc(label)}</text>'
            )
        return self

    def vline(self, x: float, *, cls: str = "ref", label: str = "") -> Figure:
        """A line down the plot at data x; each label a row below the last, left of the line near the right edge."""
        px = self.x(x)
        self._marks.append(
            f'<line class="{esc(cls)}" x1="{_n(px)}" x2="{_n(px)}" y1="{_n(self.top)}" y2="{_n(self.bottom)}"/>'
        )
        if label:
            row = self._labels[1]
            self._labels[1] += 1
            near_edge = px > self.right - 7 * len(label) - 6
            self._marks.append(
                f'<text class="{esc(cls)}-label" x="{_n(px)}" y="{_n(self.top + 10 + 12 * row)}" '
                f'dx="{-3 if near_edge else 3}" text-anchor="{"end" if near_edge else "start"}">'
                f"{esc(label)}</text>"
            )
        return self

    def text(self, x: float, y: float, text: str, *, cls: str = "note", anchor: str = "start") -> Figure:
        """Text at pixel coordinates (not data): a legend or a note inside the figure."""
        self._marks.append(
            f'<text class="{esc(cls)}" x="{_n(x)}" y="{_n(y)}" text-anchor="{esc(anchor)}">{esc(text)}</text>'
        )
        return self

    def legend(self, entries: Sequence[tuple[str, str]]) -> Figure:
        """(class, text) swatches along the top right of the plotting area."""
        x = float(self.right)
        for cls, text in reversed(entries):
            x -= 10 + 6.5 * len(text)
            self._marks.append(f'<rect class="{esc(cls)} swatch" x="{_n(x)}" y="{_n(self.top)}" width="8" height="8"/>')
            self._marks.append(f'<text class="legend" x="{_n(x + 11)}" y="{_n(self.top + 8)}">{esc(text)}</text>')
            x -= 8
        return self

    def svg(self) -> str:
        return _svg(self.width, self.height, self.label, "".join(self._marks))


def _title(tip: str) -> str:
    return f"<title>{esc(tip)}</title>" if tip else ""


def _svg(width: int, height: int, label: str, body: str, cls: str = "plot") -> str:
    return (
        f'<svg class="{esc(cls)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{esc(label)}">{_title(label)}{body}</svg>'
    )


def message(text: str, *, label: str = "", width: int = 640, height: int = 60) -> str:
    """A figure with nothing to draw but why: "not recorded", "no history yet"."""
    body = (
        f'<rect class="empty" x="0.5" y="0.5" width="{width - 1}" height="{height - 1}"/>'
        f'<text class="note" x="{_n(width / 2)}" y="{_n(height / 2)}" text-anchor="middle" dy="0.32em">'
        f"{esc(text)}</text>"
    )
    return _svg(width, height, label or text, body, cls="plot empty")


def sparkline(
    values: Sequence[float | None],
    *,
    tips: Sequence[str] = (),
    classes: Sequence[str] = (),
    log: bool = False,
    width: int = 240,
    height: int = 40,
    label: str = "",
    reference: float | None = None,
) -> str:
    """A tiny line over runs (oldest first) with a dot per run (class per run, e.g. its verdict), the last
    one larger; `reference` (a limit) as a dashed line. None values are gaps. Log needs positive values."""
    known = [v for v in values if v is not None and (v > 0 or not log)]
    if not known:
        return message("no values to draw", label=label, width=width, height=height)
    lo, hi = (
        min(known + ([reference] if reference is not None and (reference > 0 or not log) else [])),
        max(known + ([reference] if reference is not None and (reference > 0 or not log) else [])),
    )
    if log:
        lo, hi = (lo / 2, hi * 2) if lo < hi else (lo / 10, hi * 10)
    else:
        pad = (hi - lo) * 0.1 or (abs(hi) * 0.1 or 1.0)
        lo, hi = lo - pad, hi + pad
    n = len(values)
    fig = Figure(
        x=(-0.5, max(0.5, n - 0.5)), y=(lo, hi), width=width, height=height, ylog=log, label=label, margin=(4, 4, 4, 4)
    )
    if reference is not None and (reference > 0 or not log):
        fig.hline(reference, cls="limit")
    fig.line([(i, v if v is None or v > 0 or not log else None) for i, v in enumerate(values)], cls="spark")
    for i, v in enumerate(values):
        if v is None or (log and v <= 0):
            continue
        cls = classes[i] if i < len(classes) else ""
        tip = tips[i] if i < len(tips) else ""
        fig.points(
            [(i, v, None, None, tip)], cls=f"spot {cls}".strip(), r=3.5 if i == n - 1 else 2.2, unbounded=(False, False)
        )
    return _svg(width, height, label, "".join(fig._marks), cls="plot spark")
