"""Template helpers: times in a zone and in UTC, pills, run strips, the Jinja environment.

The helpers that build HTML in Python (many per page) escape every value with ``escape``;
the templates are autoescaped.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import jinja2
from markupsafe import Markup, escape

from .._model.time import in_zone, iso

HERE = Path(__file__).resolve().parent
OUTCOME_TONES = {
    "succeeded": "ok",
    "failed": "warn",
    "aborted": "bad",
    "abandoned": "bad",
    "lost": "off",
    "snoozed": "off",
    "queued": "run",
    "claimed": "run",
}


def _local(value: datetime | None, zone: str | None) -> str:
    if value is None:
        return "—"
    local = in_zone(value, ZoneInfo(zone or "UTC"))
    # isoformat is a C call; strftime costs five times as much, and a page has hundreds.
    return f"{local.isoformat(' ', 'seconds')[:19]} {local.tzname()}"


def _utc(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).isoformat(" ", "seconds")[:19] + "Z"


def _ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return ""
    seconds = (value - now).total_seconds()
    future, seconds = seconds > 0, abs(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size or unit == "s":
            text = f"{int(seconds // size)} {unit}"
            break
    return f"in {text}" if future else f"{text} ago"


def _when(value: datetime | None, zone: str | None, now: datetime) -> Markup:
    """A time in the task's zone, in UTC below it (unless the zone is UTC), and how long ago.

    Built with ``escape`` and an f-string: ``Markup.format`` costs ten times as much, and a
    Jobs page has a hundred of these.
    """
    if value is None:
        return Markup('<span class="muted">—</span>')
    utc = f'<span class="utc">{_utc(value)}</span>' if zone and zone != "UTC" else ""
    return Markup(
        f'<span class="when"><time datetime="{escape(iso(value))}">'
        f"{escape(_local(value, zone))}</time>{utc}"
        f'<span class="ago">{escape(_ago(value, now))}</span></span>'
    )


def _pill(text: str | None, tone: str) -> Markup:
    return Markup(f'<span class="pill {escape(tone)}">{escape(text or "")}</span>')


def _strip(base: str, cells: list[dict[str, Any]]) -> Markup:
    """A task's last runs, oldest left, one coloured link per run (600 per Tasks page: built
    here, in one pass, rather than by the template)."""
    if not cells:
        return Markup('<span class="muted">—</span>')
    parts = []
    for r in reversed(cells):
        outcome = escape(r["outcome"])
        code = f" ({escape(r['error_code'])})" if r["error_code"] else ""
        title = (
            f"{outcome}{code} · job {r['job_id']} attempt {r['attempt']} · {_utc(r['finished_at'])}"
        )
        parts.append(
            f'<a class="cell {OUTCOME_TONES.get(r["outcome"], "off")}" href="{escape(base)}/jobs/'
            f'{int(r["job_id"])}" title="{title}" data-outcome="{outcome}"></a>'
        )
    return Markup(f'<span class="strip" aria-label="last runs">{"".join(parts)}</span>')


_TICKED = re.compile(r"`([^`]+)`")


def _ticks(text: str | None) -> Markup:
    """A sentence of ours (a state, a warning) for HTML: escaped, and each `command` in
    backticks, which the terminal shows as is, set as code."""
    escaped = str(escape(text or ""))
    return Markup(_TICKED.sub(r"<code>\1</code>", escaped))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every {{ value }} is HTML-escaped, in text and attributes alike
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        local=_local,
        utc=_utc,
        iso=iso,
        q=lambda s: quote(str(s), safe=""),
        tone=lambda outcome: OUTCOME_TONES.get(outcome or "", "off"),
        ticks=_ticks,
    )
    return env
