"""Start-up of the `scheduler` command: `--help`, `status`, `tick`, `jobs` on SQLite.

    benchmarks/.venv/bin/python benchmarks/cli_startup.py [--reps 10] [--python OTHER_PYTHON]

Each repetition runs every case once, in turn, as a fresh process (what a shell, cron(8) or a
health check pays), and times it from spawn to exit. The database is a migrated SQLite file
with 10 tasks and 200 finished jobs in a scratch folder, so the figures are the command's own
start-up and its few statements. ``python -c pass`` (the interpreter alone) and ``import
sqlalchemy`` are measured beside them, as the floor a command that reads the database cannot go
under. ``--python`` measures another interpreter's `scheduler` too (another checkout's venv:
an A/B in one run). Prints the median and the 90th percentile of the wall time per case, and
the median CPU time (user + system: steadier on a busy machine), in milliseconds. The
package's bytecode is compiled first, as an installed copy has it.
Targets: `--help` at most 150 ms, `status` at most 300 ms (medians).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import _bench
from _bench import fmt, median, progress

TASKS = "".join(
    f'\n[[tasks]]\nname = "task-{i}"\ncron = "*/5 * * * *"\nhandler = "bench.noop"\n'
    for i in range(10)
)
# What the `scheduler` console script runs (`main` in a checkout from before `console`).
CLI = "import scheduler.cli as c; getattr(c, 'console', c.main)()"
CASES = {
    "python -c pass": ["-c", "pass"],
    "import sqlalchemy": ["-c", "import sqlalchemy"],
    "scheduler --help": ["-c", CLI, "--help"],
    "scheduler status": ["-c", CLI, "status"],
    "scheduler tick": ["-c", CLI, "tick"],
    "scheduler jobs": ["-c", CLI, "jobs"],
}


def prepare(python: str, folder: Path) -> Path:
    """A migrated SQLite file with TASKS synced and 200 finished jobs; its config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "cli.db"
    db.unlink(missing_ok=True)
    config = folder / "app.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{db}"\n{TASKS}')
    fill = (
        "from scheduler import Scheduler\n"
        f"app = Scheduler.from_toml({str(config)!r})\n"
        "app.migrate(); app.sync()\n"
        "for n in range(200): app.enqueue('bench.noop', {'n': n})\n"
        "@app.handler('bench.noop')\ndef noop(job): pass\n"
        "app.work(); app.close()\n"
    )
    subprocess.run([python, "-c", fill], cwd=folder, check=True)
    # The package's bytecode, as `pip install` writes it: from a checkout (an editable
    # install) under PYTHONDONTWRITEBYTECODE=1 every run would compile the modules again,
    # 130 ms more for `status` here, which no installed copy pays.
    compile_package = (
        "import compileall, os, scheduler\n"
        "compileall.compile_dir(os.path.dirname(scheduler.__file__), quiet=1)\n"
    )
    subprocess.run([python, "-c", compile_package], cwd=folder, check=True)
    return config


def timed(python: str, args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds from spawn to exit, and the CPU seconds (user + system) the process used:
    the CPU figure moves less when other work shares the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [python, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{args}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=10)
    p.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PATH",
        help="another interpreter whose `scheduler` to measure as well (repeatable)",
    )
    args = p.parse_args()
    pythons = [sys.executable, *args.python]
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    configs = {}
    for n, python in enumerate(pythons):
        progress(f"preparing {python}")
        configs[python] = prepare(python, scratch / f"cli-startup-{n}")
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for rep in range(args.reps + 1):  # the first round warms the page cache: not counted
        for python in pythons:
            config = configs[python]
            env = {**os.environ, "SCHEDULER_CONFIG": str(config)}
            for case, argv in CASES.items():
                elapsed = timed(python, argv, config.parent, env)
                if rep:
                    times.setdefault((python, case), []).append(elapsed)
        progress(f"round {rep}/{args.reps}")
    rows = []
    for python in pythons:
        for case in CASES:
            found = sorted(wall for wall, _ in times[(python, case)])
            cpu = [used for _, used in times[(python, case)]]
            p90 = found[min(len(found) - 1, int(len(found) * 0.9))]
            who = python if len(pythons) > 1 else ""
            ms = [fmt(median(found) * 1000), fmt(p90 * 1000), fmt(median(cpu) * 1000)]
            rows.append([who, case, *ms])
    headers = ["python", "case", "median ms", "p90 ms", "CPU ms (median)"]
    if len(pythons) == 1:
        headers, rows = headers[1:], [r[1:] for r in rows]
    _bench.print_table(
        f"CLI start-up, {args.reps} runs each, a fresh process per run (SQLite, 10 tasks)",
        headers,
        rows,
    )
    print(
        f"{_bench.machine()}; checkout {_bench.source_version()}; load average"
        f" {load_before} before, {_bench.load()} after"
    )


if __name__ == "__main__":
    main()
