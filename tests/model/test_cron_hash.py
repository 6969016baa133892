"""``_cron.hash_free``: an H expression drawn for one name, as croniter draws it.

Sync checks each distinct drawn form once and computes one ``next_run_at`` per form, so the
drawn form must expand exactly as ``croniter(expr, hash_id=name)`` does. It goes through
croniter's ``HashExpander`` (not public API): these tests pin that behaviour, so a croniter
upgrade that changes it fails here, not in production.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from croniter import CroniterError, croniter

from scheduler._model import cron as _cron

NAMES = [f"customer-{i:05d}" for i in range(150)] + ["a", "é-ü", "Report", "x y"]
HASHED = [
    "H * * * *",
    "H H * * *",
    "h h * * mon-fri",
    "H/15 H(2-5) * * H",
    "H(30-59)/10 H H(1-28) * *",
    "0 H H * * H",
    "H H H * *",
    "H H H 2 *",  # day-of-month drawn in 1-31: Feb 29-31 is refused for some names only
    "H(22-23)/5 * * * *",
    "H H * * * H",
]


def _slow_ok(expr: str, name: str) -> bool:
    """croniter's own verdict with the name as hash_id (what validate_cron checked before)."""
    try:
        croniter.expand(expr, hash_id=name.encode(), strict=True)
        croniter(expr, datetime.now(UTC), hash_id=name.encode()).get_next(datetime)
    except CroniterError:
        return False
    return True


@pytest.mark.parametrize("expr", HASHED)
def test_drawn_form_expands_as_croniter_with_the_name(expr: str) -> None:
    forms = set()
    for name in NAMES:
        free = _cron.hash_free(expr, name)
        assert "h" not in free.replace("thu", "").replace("sh", "")  # no H field left
        forms.add(free)
        try:
            expected = croniter.expand(expr, hash_id=name.encode())
        except CroniterError:
            with pytest.raises(CroniterError):
                croniter.expand(free)
            continue
        assert croniter.expand(free) == expected, (expr, name, free)
    assert len(forms) > 1  # the name matters


@pytest.mark.parametrize(
    "expr", [*HASHED, "H(5-2) * * * *", "H/0 * * * *", "H * * * * * *", "*/7 H(0-5),12 * * *"]
)
def test_validation_agrees_with_croniter_for_every_name(expr: str) -> None:
    verdicts = set()
    for name in NAMES:
        ok = _slow_ok(expr, name) and _cron._check_syntax(expr) is None
        verdicts.add(ok)
        if ok:
            assert _cron.validate_cron(expr, name) == _cron.hash_free(expr, name)
        else:
            with pytest.raises(ValueError, match="invalid cron expression"):
                _cron.validate_cron(expr, name)
    if expr == "H H H 2 *":
        assert verdicts == {True, False}  # valid for some names, refused for others


def test_unhashed_expressions_are_their_own_form() -> None:
    for expr in ("*/10 * * * *", "0 3 * * *", "@daily", "@hourly", "0 0 * * thu"):
        assert _cron.hash_free(expr, "any") is expr


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York"])
def test_names_with_one_drawn_form_have_one_schedule(zone: str) -> None:
    """What sync relies on to compute next_run_at once per form: across a DST change."""
    starts = [datetime(2030, 3, 30, 22, tzinfo=UTC) + timedelta(minutes=37 * i) for i in range(8)]
    starts += [datetime(2030, 10, 26, 23, tzinfo=UTC) + timedelta(minutes=41 * i) for i in range(8)]
    starts += [datetime(2030, 3, 10, 6, tzinfo=UTC), datetime(2030, 11, 3, 5, tzinfo=UTC)]
    for expr in ("H * * * *", "H H * * *", "H(22-23)/5 */2 * * *", "H H(1-3) * * *"):
        by_form: dict[str, list[datetime]] = {}
        shared = 0
        for name in NAMES[:80]:
            slots = [_cron.next_after(expr, zone, start, name) for start in starts]
            first = by_form.setdefault(_cron.hash_free(expr, name), slots)
            shared += first is not slots
            assert slots == first, (expr, zone, name)
        assert shared  # some names share a form, so the comparison ran
