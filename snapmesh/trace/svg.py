"""A Layout -> SVG text (and PNG through cairosvg). Colours are constants so
the tests can look for them in the rendered picture."""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

from snapmesh.trace.layout import BOTTOM, Layout, Point
from snapmesh.trace.shiviz import describe

CHOSEN_CUT_COLOUR = "#e6007e"
OTHER_CUT_COLOUR = "#9467bd"
TRANSFER_COLOUR = "#8c8c8c"
MARKER_COLOUR = "#1f77b4"
IN_FLIGHT_COLOUR = "#ff7f0e"
RESTORE_COLOUR = "#2ca02c"
RESTART_COLOUR = "#d62728"
LANE_COLOUR = "#444444"

_STYLE = {
    "transfer": (TRANSFER_COLOUR, 0.9, "", "0.75", "head-transfer"),
    "marker": (MARKER_COLOUR, 1.3, ' stroke-dasharray="5 3"', "0.9", "head-marker"),
    "in_flight": (IN_FLIGHT_COLOUR, 2.6, "", "1", "head-in-flight"),
}


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _short(snapshot_id: str) -> str:
    return snapshot_id if len(snapshot_id) <= 10 else snapshot_id[:8] + "…"


def _tick_step(span: int) -> int:
    raw = max(1, span / 12)
    magnitude = 10 ** math.floor(math.log10(raw))
    return int(next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw))


CAPTION_LINE = 18  # px per caption line, under the plot


def render_svg(layout: Layout, *, title: str = "", caption: Sequence[str] = ()) -> str:
    """The picture; `caption`: lines printed under it (an app's describe of the chosen snapshot)."""
    w, h = layout.width, layout.height + (CAPTION_LINE * len(caption) + 8 if caption else 0)
    left, right = layout.plot_left, layout.plot_right
    first_lane = min(layout.lanes.values())
    last_lane = max(layout.lanes.values())
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(w)}" height="{_num(h)}" '
        f'viewBox="0 0 {_num(w)} {_num(h)}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
        "<defs>",
        f'<clipPath id="plot"><rect x="{_num(left - 8)}" y="0" width="{_num(right - left + 16)}" height="{_num(h)}"/></clipPath>',
    ]
    for colour, *_, head in _STYLE.values():
        # Heads in user units: a thick highlighted arrow keeps a normal-sized head.
        out.append(
            f'<marker id="{head}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
            f'markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
            f'<path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        )
    out += ["</defs>", f'<rect width="{_num(w)}" height="{_num(h)}" fill="white"/>']
    if title:
        out.append(f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>')
    chosen = f"; snapshot {escape(layout.chosen)} chosen" if layout.chosen else ""
    out.append(
        f'<text x="{left}" y="40" fill="#555">Lamport time {layout.start} to {layout.end}{chosen}</text>'
    )

    # Lanes and their labels.
    for node, y in layout.lanes.items():
        out.append(f'<line x1="{_num(left)}" y1="{_num(y)}" x2="{_num(right)}" y2="{_num(y)}" stroke="{LANE_COLOUR}"/>')
        out.append(f'<text x="{_num(left - 12)}" y="{_num(y + 4)}" text-anchor="end" font-weight="bold">{escape(node)}</text>')

    # Time axis.
    axis_y = last_lane + 30
    out.append(f'<line x1="{_num(left)}" y1="{_num(axis_y)}" x2="{_num(right)}" y2="{_num(axis_y)}" stroke="#999"/>')
    span = max(1, layout.end - layout.start)
    step_px = (right - left) / span
    tick = _tick_step(span)
    first_tick = -(-layout.start // tick) * tick
    for t in range(first_tick, layout.end + 1, tick):
        x = left + (t - layout.start) * step_px
        out.append(f'<line x1="{_num(x)}" y1="{_num(axis_y)}" x2="{_num(x)}" y2="{_num(axis_y + 4)}" stroke="#999"/>')
        out.append(f'<text x="{_num(x)}" y="{_num(axis_y + 16)}" text-anchor="middle" fill="#777" font-size="10">{t}</text>')

    out.append('<g clip-path="url(#plot)">')
    for arrow in layout.arrows:
        colour, width, dash, opacity, head = _STYLE[arrow.style]
        tip = f"{arrow.message.kind} {arrow.message.src}→{arrow.message.dst}"
        tip += f" {arrow.message.msg_id}" if arrow.message.kind == "transfer" else f" snapshot {arrow.message.snapshot_id}"
        tip += f" amount {arrow.message.amount}" if arrow.message.amount is not None else ""  # an app's message: none
        out.append(
            f'<line x1="{_num(arrow.start.x)}" y1="{_num(arrow.start.y)}" x2="{_num(arrow.end.x)}" y2="{_num(arrow.end.y)}" '
            f'stroke="{colour}" stroke-width="{width}" stroke-opacity="{opacity}"{dash} marker-end="url(#{head})">'
            f"<title>{escape(tip)}</title></line>"
        )
    for dot in layout.dots:
        out.append(_dot(dot.event.kind, dot.at, describe(dot.event)))
    for cut in layout.cuts:
        colour, width = (CHOSEN_CUT_COLOUR, 3.2) if cut.chosen else (OTHER_CUT_COLOUR, 1.6)
        dash = "" if cut.chosen else ' stroke-dasharray="7 4"'
        points = " ".join(f"{_num(p.x)},{_num(p.y)}" for p in cut.points)
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="{width}"{dash} '
            f'stroke-linejoin="round"><title>cut of snapshot {escape(cut.snapshot_id)}</title></polyline>'
        )
        head = cut.points[0]
        label = f'<text x="{_num(head.x)}" y="{_num(first_lane - 14)}" text-anchor="middle" fill="{colour}" font-size="11"'
        out.append(f'{label} font-weight="{"bold" if cut.chosen else "normal"}">{escape(_short(cut.snapshot_id))}</text>')
    out.append("</g>")
    out += _legend(layout, layout.height - BOTTOM + 62)
    for i, line in enumerate(caption):
        out.append(f'<text x="{left}" y="{_num(layout.height + 4 + CAPTION_LINE * i)}" fill="#333" '
                   f'class="caption">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _dot(kind: str, at: Point, tip: str) -> str:
    x, y = _num(at.x), _num(at.y)
    title = f"<title>{escape(tip)}</title>"
    if kind == "cut":
        return (f'<rect x="{_num(at.x - 4)}" y="{_num(at.y - 4)}" width="8" height="8" transform="rotate(45 {x} {y})" '
                f'fill="white" stroke="{LANE_COLOUR}" stroke-width="1.2">{title}</rect>')
    if kind == "restore":
        return (f'<rect x="{_num(at.x - 5)}" y="{_num(at.y - 5)}" width="10" height="10" fill="{RESTORE_COLOUR}">'
                f"{title}</rect>")
    if kind == "restart":
        return f'<circle cx="{x}" cy="{y}" r="5" fill="{RESTART_COLOUR}">{title}</circle>'
    colour = MARKER_COLOUR if kind.startswith("marker") else "#333333"
    return f'<circle cx="{x}" cy="{y}" r="2.2" fill="{colour}">{title}</circle>'


def _legend(layout: Layout, y: float) -> list[str]:
    items = [
        ("line", TRANSFER_COLOUR, "transfer"),
        ("dash", MARKER_COLOUR, "marker"),
        ("line", IN_FLIGHT_COLOUR, "in flight in the chosen snapshot"),
        ("line", CHOSEN_CUT_COLOUR, "chosen snapshot's cut"),
        ("dash", OTHER_CUT_COLOUR, "other cuts"),
        ("box", RESTORE_COLOUR, "restore"),
        ("dot", RESTART_COLOUR, "restart"),
    ]
    out, x = [], layout.plot_left
    for shape, colour, text in items:
        if shape in ("line", "dash"):
            dash = ' stroke-dasharray="5 3"' if shape == "dash" else ""
            out.append(f'<line x1="{_num(x)}" y1="{_num(y - 4)}" x2="{_num(x + 22)}" y2="{_num(y - 4)}" '
                       f'stroke="{colour}" stroke-width="2.5"{dash}/>')
        elif shape == "box":
            out.append(f'<rect x="{_num(x + 6)}" y="{_num(y - 9)}" width="10" height="10" fill="{colour}"/>')
        else:
            out.append(f'<circle cx="{_num(x + 11)}" cy="{_num(y - 4)}" r="5" fill="{colour}"/>')
        out.append(f'<text x="{_num(x + 28)}" y="{_num(y)}" fill="#333" font-size="11">{escape(text)}</text>')
        x += 40 + 6.2 * len(text)
    return out


PNG_EXTRA_HINT = "--format png needs the png extra: pip install 'snapmesh[png]' (cairosvg, which needs libcairo)"


def png_unavailable() -> str | None:
    """Why PNG cannot be rendered here (one line), or None when it can: cairosvg
    is the optional `png` extra, and it loads libcairo when imported."""
    try:
        import cairosvg  # noqa: F401
    except ImportError as exc:
        return f"{PNG_EXTRA_HINT}; {exc}"
    except OSError as exc:  # cairocffi found no libcairo (its message is one line per name it tried)
        first = (str(exc).splitlines() or [""])[0]
        return f"{PNG_EXTRA_HINT}; cannot load libcairo: {first}"
    return None


def render_png(svg: str, *, scale: float = 1.0) -> bytes:
    """The SVG rasterized by cairosvg (libcairo)."""
    import cairosvg

    return cairosvg.svg2png(bytestring=svg.encode("utf-8"), scale=scale)

