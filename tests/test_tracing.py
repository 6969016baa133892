"""OpenTelemetry (SPEC §12): a span per job run, child of the span that enqueued it, across two
processes (an enqueuing script and a real ``scheduler worker``), each recording its spans with
the SDK's in-memory exporter; and nothing at all when OpenTelemetry is not configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler import Scheduler
from scheduler._handlers import Registry

# Shared by both processes: an in-memory exporter whose spans are written to $SPANS_OUT at exit.
RECORDER = """
import atexit, json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def _dump():
    spans = [
        {
            "name": s.name,
            "trace_id": format(s.context.trace_id, "032x"),
            "span_id": format(s.context.span_id, "016x"),
            "parent": format(s.parent.span_id, "016x") if s.parent else None,
            "kind": s.kind.name,
            "status": s.status.status_code.name,
            "attributes": dict(s.attributes),
        }
        for s in exporter.get_finished_spans()
    ]
    with open(os.environ["SPANS_OUT"], "w") as out:
        json.dump(spans, out)


atexit.register(_dump)
"""

JOBS = """
from trace_recorder import trace
from scheduler import PermanentError, default_registry

tracer = trace.get_tracer("trace_jobs")


@default_registry.handler("t.traced", retry_safe=True)
def traced(job):
    with tracer.start_as_current_span("inside the handler"):
        pass


@default_registry.handler("t.broken", retry_safe=True)
def broken(job):
    raise PermanentError("bad_input")
"""

ENQUEUER = """
import json, sys
from trace_recorder import trace
from scheduler import Scheduler
from scheduler._handlers import Registry

tracer = trace.get_tracer("web")
app = Scheduler(sys.argv[1], registry=Registry())
with tracer.start_as_current_span("POST /reports"):
    ids = [app.enqueue("t.traced", {"report": "quarterly-eu-7731"}), app.enqueue("t.broken", {})]
print(json.dumps(ids))
"""


def run(directory: Path, args: list[str], spans: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDULER_", "OTEL_"))}
    env["SPANS_OUT"] = str(directory / spans)
    env["PYTHONPATH"] = str(directory)
    done = subprocess.run(
        [sys.executable, *args], cwd=directory, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def spans(directory: Path, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads((directory / name).read_text())
    return found


def test_the_run_span_is_a_child_of_the_enqueue_across_processes(
    db_url_sp: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "trace_recorder.py").write_text(RECORDER)
    (tmp_path / "trace_jobs.py").write_text(JOBS)
    (tmp_path / "enqueue.py").write_text(ENQUEUER)
    config = tmp_path / "app.toml"
    config.write_text(f'[database]\nurl = "{db_url_sp}"\n[worker]\nimports = ["trace_jobs"]\n')
    app = Scheduler(db_url_sp, registry=Registry())  # this process: OpenTelemetry not configured
    request.addfinalizer(app.close)
    untraced = app.enqueue("t.traced", {})

    traced_id, broken_id = json.loads(run(tmp_path, ["enqueue.py", db_url_sp], "web.json"))
    run(tmp_path, ["-m", "scheduler.cli", "--config", str(config), "worker", "--once"], "w.json")

    web = {s["name"]: s for s in spans(tmp_path, "web.json")}
    request = web["POST /reports"]
    enqueues = [s for s in spans(tmp_path, "web.json") if s["name"].startswith("enqueue ")]
    assert [s["name"] for s in enqueues] == ["enqueue t.traced", "enqueue t.broken"]
    for span, job_id in zip(enqueues, (traced_id, broken_id), strict=True):
        assert span["kind"] == "PRODUCER" and span["parent"] == request["span_id"]
        assert span["trace_id"] == request["trace_id"]
        assert span["attributes"]["messaging.message.id"] == str(job_id)
        assert span["attributes"]["messaging.destination.name"] == "default"
        # The job carries exactly the enqueue span's traceparent.
        stored = app.get_job(job_id)
        assert stored is not None
        assert stored.traceparent is not None
        version, trace_id, span_id, flags = stored.traceparent.split("-")
        assert (version, trace_id, span_id) == ("00", span["trace_id"], span["span_id"])
        assert int(flags, 16) & 1  # sampled

    worker = spans(tmp_path, "w.json")
    runs = {
        int(s["attributes"]["messaging.message.id"]): s for s in worker if s["kind"] == "CONSUMER"
    }
    assert set(runs) == {untraced, traced_id, broken_id}
    ok, broken = runs[traced_id], runs[broken_id]
    assert ok["name"] == "run t.traced" and ok["parent"] == enqueues[0]["span_id"]
    assert ok["trace_id"] == request["trace_id"]
    assert ok["attributes"]["scheduler.outcome"] == "succeeded" and ok["status"] == "UNSET"
    assert ok["attributes"]["scheduler.attempt"] == 1
    inside = [s for s in worker if s["name"] == "inside the handler"]  # current while it runs
    assert sorted(s["parent"] for s in inside) == sorted([ok["span_id"], runs[untraced]["span_id"]])
    assert broken["parent"] == enqueues[1]["span_id"]
    assert broken["attributes"]["scheduler.outcome"] == "aborted" and broken["status"] == "ERROR"
    assert broken["attributes"]["error.type"] == "bad_input"
    # Enqueued without a configured OpenTelemetry: no traceparent, a run span of its own trace.
    assert app.get_job(untraced).traceparent is None  # type: ignore[union-attr]
    alone = runs[untraced]
    assert alone["parent"] is None and alone["trace_id"] != request["trace_id"]
    # Never the payload in a span.
    everything = json.dumps(worker) + json.dumps(list(web.values()))
    assert "quarterly-eu-7731" not in everything


def test_nothing_happens_when_opentelemetry_is_imported_but_not_configured(
    tmp_path: Path,
) -> None:
    """The API alone (no tracer provider set): no span, no traceparent, no error."""
    script = (
        "import opentelemetry.trace\n"
        "from scheduler import Scheduler\n"
        "from scheduler._handlers import Registry\n"
        "from scheduler._worker import Worker\n"
        f"app = Scheduler('sqlite:///{tmp_path / 's.db'}', registry=Registry())\n"
        "app.migrate()\n"
        "app.registry.handler('t.ok')(lambda job: None)\n"
        "job_id = app.enqueue('t.ok', {})\n"
        "assert app.get_job(job_id).traceparent is None\n"
        "assert Worker(app).run(once=True).handled == 1\n"
        "assert app.get_job(job_id).state == 'succeeded'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
