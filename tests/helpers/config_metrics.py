"""The ``scheduler_*`` series names that the deployable ``config/`` folder queries: its
Prometheus rules and its Grafana dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "config"
METRIC_NAME = re.compile(r"\b(scheduler_[a-z0-9_]+)")


def exprs_in_rules() -> list[str]:
    text = (CONFIG / "prometheus" / "alerts.yml").read_text()
    # The rules file is plain YAML; every expression is an `expr:` key (folded with >- when
    # long): read the block of lines indented below it.
    found: list[str] = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("expr:"):
            continue
        indent = len(line) - len(line.lstrip())
        expr = [stripped.removeprefix("expr:").strip().removeprefix(">-").strip()]
        for following in lines[index + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            expr.append(following.strip())
        found.append(" ".join(part for part in expr if part))
    return found


def exprs_in_dashboard() -> list[str]:
    dashboard = json.loads((CONFIG / "grafana" / "scheduler.json").read_text())
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def config_metric_names() -> set[str]:
    """Every scheduler_* series name the rules and the dashboard query."""
    return {
        name
        for expr in exprs_in_rules() + exprs_in_dashboard()
        for name in METRIC_NAME.findall(expr)
    }
