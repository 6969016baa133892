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
from scheduler._model.handlers import Registry

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
from scheduler._model.handlers import Registry

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
        "from scheduler._model.handlers import Registry\n"
        "from scheduler._worker.worker import Worker\n"
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


TICKER = """
import json, sys
from trace_recorder import trace
from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker

registry = Registry()


@registry.handler("t.fails", retry_safe=True, max_attempts=1)
def fails(job):
    raise PermanentError("always")


app = Scheduler(sys.argv[1], registry=registry)
app.migrate()
app.sync([TaskSpec("nightly", "*/5 * * * *", "t.fails", {}, "UTC")])
found = {}
app.trigger("nightly")  # due now
found["first"] = app.tick().dispatched
found["idle"] = app.tick().dispatched  # nothing due: no span
with app.store.read() as conn:
    from sqlalchemy import text
    job_id, first_tp = conn.execute(text("SELECT id, traceparent FROM scheduler_jobs")).one()
found["job_id"], found["first_tp"] = job_id, first_tp
found["ran"] = Worker(app, concurrency=1).run(once=True).handled  # aborted: rerun next
app.trigger("nightly")
found["rerun"] = app.tick().rerun
found["rerun_tp"] = app.get_job(job_id).traceparent
found["ran_again"] = Worker(app, concurrency=1).run(once=True).handled
print(json.dumps(found))
"""


def test_a_tick_that_queues_jobs_is_traced_and_their_runs_are_its_children(
    db_url_sp: str, tmp_path: Path
) -> None:
    """A tick that dispatches or reruns makes one PRODUCER span (an idle tick makes none);
    each job it queues carries that span's traceparent, a rerun in place the new tick's, and
    each run's span is a child of the tick that queued it."""
    (tmp_path / "trace_recorder.py").write_text(RECORDER)
    (tmp_path / "ticker.py").write_text(TICKER)
    found = json.loads(run(tmp_path, ["ticker.py", db_url_sp], "tick.json"))
    assert found["first"] == ["nightly"] and found["idle"] == []
    assert found["rerun"] == ["nightly"] and found["ran"] == found["ran_again"] == 1
    recorded = spans(tmp_path, "tick.json")
    ticks = [s for s in recorded if s["name"] == "tick"]
    assert len(ticks) == 2, [s["name"] for s in recorded]  # not the idle one
    first, second = ticks
    for span, dispatched, rerun in ((first, 1, 0), (second, 0, 1)):
        assert span["kind"] == "PRODUCER" and span["parent"] is None
        assert span["attributes"]["scheduler.dispatched"] == dispatched
        assert span["attributes"]["scheduler.rerun"] == rerun
    for traceparent, span in ((found["first_tp"], first), (found["rerun_tp"], second)):
        _version, trace_id, span_id, _flags = traceparent.split("-")
        assert (trace_id, span_id) == (span["trace_id"], span["span_id"])
    runs = [s for s in recorded if s["kind"] == "CONSUMER"]
    assert [r["parent"] for r in runs] == [first["span_id"], second["span_id"]]
    assert all(r["attributes"]["messaging.message.id"] == str(found["job_id"]) for r in runs)
