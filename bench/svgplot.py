"""A log-log scatter chart as plain SVG text: panels side by side, one colour per series.

No plotting library: the figure is a few hundred lines of SVG that a browser,
GitHub and the docs all show, and that diffs as text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 360, 280, 58, 14, 34, 46


@dataclass
class Panel:
    title: str
    x_label: str
    y_label: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # name -> points
    lines: dict[str, bool] = field(default_factory=dict)  # name -> join its points (sorted by x)

    def add(self, name: str, x: float, y: float, *, line: bool = True) -> None:
        self.series.setdefault(name, []).append((x, y))
        self.lines[name] = line


def _decades(low: float, high: float) -> tuple[float, float]:
    return math.floor(math.log10(low)), max(math.ceil(math.log10(high)), math.floor(math.log10(low)) + 1)


def _tick(value: float) -> str:
    return f"{value:g}" if 1e-3 <= value < 1e6 else f"1e{round(math.log10(value))}"


def _panel(panel: Panel, left: float, colour_of: dict[str, str]) -> list[str]:
    points = [p for pts in panel.series.values() for p in pts if p[0] > 0 and p[1] > 0]
    x0, x1 = _decades(min(p[0] for p in points), max(p[0] for p in points))
    y0, y1 = _decades(min(p[1] for p in points), max(p[1] for p in points))
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def sx(x: float) -> float:
        return left + PAD_L + (math.log10(x) - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return PAD_T + ph - (math.log10(y) - y0) / (y1 - y0) * ph

    out = [f'<text x="{left + W / 2:.0f}" y="18" text-anchor="middle" font-weight="bold">{escape(panel.title)}</text>',
           f'<rect x="{left + PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for d in range(x0, x1 + 1):
        x = sx(10.0 ** d)
        out += [f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{PAD_T + ph}" stroke="#eee"/>',
                f'<text x="{x:.1f}" y="{PAD_T + ph + 14}" text-anchor="middle">{_tick(10.0 ** d)}</text>']
    for d in range(y0, y1 + 1):
        y = sy(10.0 ** d)
        out += [f'<line x1="{left + PAD_L}" y1="{y:.1f}" x2="{left + PAD_L + pw}" y2="{y:.1f}" stroke="#eee"/>',
                f'<text x="{left + PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end">{_tick(10.0 ** d)}</text>']
    out += [f'<text x="{left + PAD_L + pw / 2:.0f}" y="{H - 12}" text-anchor="middle">{escape(panel.x_label)}</text>',
            f'<text transform="translate({left + 14},{PAD_T + ph / 2:.0f}) rotate(-90)" text-anchor="middle">'
            f'{escape(panel.y_label)}</text>']
    for name, pts in panel.series.items():
        colour = colour_of[name]
        pts = sorted(p for p in pts if p[0] > 0 and p[1] > 0)
        if panel.lines[name] and len(pts) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts]
    return out


def render(panels: list[Panel], caption: str) -> str:
    names = list(dict.fromkeys(n for p in panels for n in p.series))
    colour_of = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(names)}
    width, height = W * len(panels), H + 22 + 16 * ((len(names) + 2) // 3)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, panel in enumerate(panels):
        out += _panel(panel, i * W, colour_of)
    for i, name in enumerate(names):
        x, y = 20 + (i % 3) * (width // 3), H + 8 + 16 * (i // 3)
        out += [f'<circle cx="{x}" cy="{y - 4}" r="4" fill="{colour_of[name]}"/>',
                f'<text x="{x + 8}" y="{y}">{escape(name)}</text>']
    out.append(f'<text x="{width / 2:.0f}" y="{height - 6}" text-anchor="middle" fill="#555">{escape(caption)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
