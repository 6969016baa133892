"""The Queues page's chart, drawn here as an inline SVG: stacked bars of the attempts that
succeeded and failed in each interval. No script, no stylesheet of its own (the colours are the
dashboard's CSS classes, the Content-Security-Policy allows no inline style), and a title and a
description for screen readers; the page puts the same numbers in a table beside it."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from .._store.status.present import Bucket

WIDTH, HEIGHT = 720, 180
LEFT, BOTTOM, TOP = 40, 22, 8


def _nice(top: int) -> int:
    """The axis' top: 1, 2 or 5 times a power of ten, at least ``top``."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= top:
                return m * step
        step *= 10


def chart(buckets: Sequence[Bucket], *, title: str) -> Markup:
    """Stacked bars (succeeded below, failed above), one per bucket, oldest left."""
    total_ok = sum(b.succeeded for b in buckets)
    total_bad = sum(b.failed for b in buckets)
    peak = _nice(max([b.succeeded + b.failed for b in buckets] + [1]))
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(buckets), 1)
    bar_w = max(slot * 0.8, 1.0)
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%"'
        f' preserveAspectRatio="xMidYMid meet" aria-labelledby="chart-title chart-desc"'
        f' xmlns="http://www.w3.org/2000/svg">',
        f'<title id="chart-title">{escape(title)}</title>',
        f'<desc id="chart-desc">Attempts in {len(buckets)} intervals: {total_ok} succeeded,'
        f" {total_bad} failed; the table below lists each interval.</desc>",
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 4}"'
        f' y2="{TOP + plot_h}"/>',
        f'<text class="tick" x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{peak}</text>',
        f'<text class="tick" x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>',
    ]
    for i, b in enumerate(buckets):
        x = LEFT + i * slot + (slot - bar_w) / 2
        ok_h = plot_h * b.succeeded / peak
        bad_h = plot_h * b.failed / peak
        label = f"{b.start:%H:%M} to {b.end:%H:%M} UTC: {b.succeeded} succeeded, {b.failed} failed"
        parts.append(f"<g><title>{escape(label)}</title>")
        if b.succeeded:
            y = TOP + plot_h - ok_h
            parts.append(
                f'<rect class="ok" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}"'
                f' height="{ok_h:.1f}"/>'
            )
        if b.failed:
            y = TOP + plot_h - ok_h - bad_h
            parts.append(
                f'<rect class="bad" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}"'
                f' height="{bad_h:.1f}"/>'
            )
        parts.append("</g>")
        if i % max(len(buckets) // 6, 1) == 0:
            parts.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 6}">{b.start:%H:%M}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
