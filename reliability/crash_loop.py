"""Crash loop: ``kill -9`` a worker mid-job, over and over, while another one survives.

A surviving ``scheduler worker`` runs throughout. Each round starts a fresh victim worker, waits
until one of its handlers is running, waits a random moment more (0-0.8 s: the handler may be
mid-sleep, just done, or recording) and kills it with SIGKILL. Meanwhile the script keeps a few
jobs queued: half retry-safe (``rel.safe``), half not (``rel.unsafe``, whose ``abandoned()``
hook writes a marker). Handlers write ``start``/``done`` markers to files, which survive the
kill. After the last round the queue is drained and every job is accounted for.

Short leases make takeovers quick: the configuration file refuses leases under 5 s, so the
workers run with ``lease_seconds = 5`` (``--lease``).

    python reliability/crash_loop.py [--rounds 100] [--url URL] [--lease 5]
"""

from __future__ import annotations

import collections
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs

TERMINAL = ("succeeded", "aborted")


class Queue:
    """The script's own view of the queue: enqueue, top up, sample stuck leases."""

    def __init__(self, url: str, rng: random.Random, stuck_after: float) -> None:
        self.app = Scheduler(url, registry=Registry())
        self.rng = rng
        self.kinds: dict[int, str] = {}
        self.stuck: set[int] = set()
        self.stuck_after = stuck_after
        self.max_expired_age = 0.0
        self._n = 0

    def enqueue(self) -> None:
        self._n += 1
        handler = self.rng.choice(["rel.safe", "rel.unsafe"])
        payload = {"n": self._n, "sleep": round(self.rng.uniform(0.3, 1.5), 3)}
        job_id = self.app.enqueue(handler, payload, max_attempts=10 if handler == "rel.safe" else 3)
        self.kinds[job_id] = handler

    def top_up(self, depth: int) -> None:
        with self.app.store.read() as conn:
            queued = conn.execute(
                select(func.count()).select_from(jobs).where(jobs.c.state == "queued")
            ).scalar_one()
        for _ in range(depth - int(queued)):
            self.enqueue()

    def sample(self) -> None:
        """Note claimed jobs whose lease expired long ago: nobody took them over."""
        now = datetime.now(UTC)
        with self.app.store.read() as conn:
            expired = list(
                conn.execute(
                    select(jobs.c.id, jobs.c.lease_expires_at).where(
                        jobs.c.state == "claimed", jobs.c.lease_expires_at < now
                    )
                )
            )
        for job_id, expires in expired:
            age = (now - expires).total_seconds()
            self.max_expired_age = max(self.max_expired_age, age)
            if age > self.stuck_after:
                self.stuck.add(job_id)

    def active(self) -> int:
        with self.app.store.read() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(jobs).where(jobs.c.state.not_in(TERMINAL))
                ).scalar_one()
            )

    def close(self) -> None:
        self.app.close()


def markers(out: Path) -> list[dict[str, Any]]:
    return list(c.read_jsonl(out / "markers"))


def running_in(out: Path, pid: int) -> bool:
    """Has process ``pid`` a handler that started and has not finished?"""
    path = out / "markers" / f"{pid}.jsonl"
    if not path.exists():
        return False
    started: set[tuple[int, int]] = set()
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        m = json.loads(line)
        key = (m["job"], m["attempt"])
        if m["m"] == "start":
            started.add(key)
        elif m["m"] == "done":
            started.discard(key)
    return bool(started)


def run(
    url: str,
    *,
    rounds: int = 100,
    lease: float = 5.0,
    depth: int = 4,
    seed: int | None = None,
    prepare: bool = True,
    out: Path | None = None,
    verbose: bool = True,
) -> tuple[list[c.Figure], list[str]]:
    c.check_loopback(url)
    if prepare:
        c.prepare_database(url)
    out = out or c.workdir("crash")
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    config = c.write_config(
        out / "crash.toml",
        url,
        scheduler={"tick_interval": 0.2, "backoff_base_seconds": 0.5, "backoff_max_seconds": 2},
        worker={"concurrency": 2, "lease_seconds": lease, "shutdown_grace_seconds": 10},
    )
    queue = Queue(url, rng, stuck_after=lease)
    survivor = c.Worker(config, url, out, "survivor")
    victims: list[c.Worker] = []
    kills_mid_handler = 0
    rounds_without_job = 0
    started = time.monotonic()
    try:
        for i in range(rounds):
            victim = c.Worker(config, url, out, f"victim-{i:03d}")
            victims.append(victim)
            deadline = time.monotonic() + 60
            last_sample = 0.0
            while time.monotonic() < deadline and not running_in(out, victim.pid):
                queue.top_up(depth)
                if time.monotonic() - last_sample > 0.5:
                    queue.sample()
                    last_sample = time.monotonic()
                time.sleep(0.02)
            if not running_in(out, victim.pid):
                rounds_without_job += 1
            time.sleep(rng.uniform(0, 0.8))
            victim.kill9()
            kills_mid_handler += running_in(out, victim.pid)
            if verbose and (i + 1) % 10 == 0:
                print(
                    f"  {i + 1} kills, {len(queue.kinds)} jobs, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
        # Drain: no more jobs; every lease left by a victim expires and is taken over.
        drain_deadline = time.monotonic() + 3 * lease + 60
        while time.monotonic() < drain_deadline and queue.active():
            queue.sample()
            time.sleep(0.25)
        left_active = queue.active()
    finally:
        for v in victims:
            if v.alive():
                v.kill9()
        code = c.stop_all([survivor], grace=30)["survivor"]
    try:
        return analyse(
            queue,
            out,
            survivor,
            victims,
            code,
            left_active,
            seed,
            kills_mid_handler,
            rounds_without_job,
        )
    finally:
        queue.close()


def analyse(
    queue: Queue,
    out: Path,
    survivor: c.Worker,
    victims: list[c.Worker],
    survivor_code: int,
    left_active: int,
    seed: int,
    kills_mid_handler: int,
    rounds_without_job: int,
) -> tuple[list[c.Figure], list[str]]:
    with queue.app.store.read() as conn:
        db = {j.id: j for j in conn.execute(select(jobs))}
    now = datetime.now(UTC)
    starts: dict[int, int] = collections.Counter()
    dones: dict[int, int] = collections.Counter()
    abandoned: dict[int, int] = collections.Counter()
    for m in markers(out):
        {"start": starts, "done": dones, "abandoned": abandoned}[m["m"]][m["job"]] += 1

    unsafe = [j for j, k in queue.kinds.items() if k == "rel.unsafe"]
    safe = [j for j, k in queue.kinds.items() if k == "rel.safe"]
    lost = [j for j in queue.kinds if j not in db or db[j].state not in TERMINAL]
    stuck_end = [
        j
        for j in db.values()
        if j.state == "claimed"
        and j.lease_expires_at is not None
        and j.lease_expires_at < now - timedelta(seconds=queue.stuck_after)
    ]
    unsafe_abandoned = [j for j in unsafe if db[j].last_error_code == "abandoned"]
    missing_hook = [j for j in unsafe_abandoned if abandoned[j] == 0]
    # An unsafe job whose handler was cut short must end abandoned, never succeeded.
    cut_not_abandoned = [
        j
        for j in unsafe
        if starts[j] > dones[j] and db[j].state in TERMINAL and db[j].last_error_code != "abandoned"
    ]
    logs = [survivor.output()] + [v.output() for v in victims]
    figures = [
        c.Figure("kills (kill -9)", len(victims)),
        c.Figure("kills while a handler ran", kills_mid_handler),
        c.Figure("jobs enqueued", len(queue.kinds)),
        c.Figure("jobs succeeded", sum(1 for j in db.values() if j.state == "succeeded")),
        c.Figure("jobs aborted: abandoned", len(unsafe_abandoned)),
        c.Figure("retry-safe jobs run again", sum(1 for j in safe if starts[j] > 1)),
        c.Figure(
            "abandoned after the handler finished", sum(1 for j in unsafe_abandoned if dones[j] > 0)
        ),
        c.Figure("abandoned() called twice", sum(1 for j in unsafe if abandoned[j] > 1)),
        c.Figure("longest expired lease seen (s)", round(queue.max_expired_age, 2)),
        c.Figure("jobs lost", len(lost), True),
        c.Figure(
            "stuck claimed after lease expiry", len(queue.stuck | {j.id for j in stuck_end}), True
        ),
        c.Figure("non-retry-safe jobs run twice", sum(1 for j in unsafe if starts[j] > 1), True),
        c.Figure("abandoned() calls missing", len(missing_hook) + len(cut_not_abandoned), True),
        c.Figure(
            "retry-safe jobs not succeeded",
            sum(1 for j in safe if j in db and db[j].state != "succeeded"),
            True,
        ),
        c.Figure(
            "succeeded without a finished handler",
            sum(1 for j in db.values() if j.state == "succeeded" and dones[j.id] == 0),
            True,
        ),
        c.Figure("survivor exited non-zero", int(survivor_code != 0), True),
        c.Figure("tracebacks in worker logs", c.tracebacks(logs), True),
    ]
    notes = [f"seed {seed}; lease {queue.stuck_after:g}s"]
    if rounds_without_job:
        notes.append(f"{rounds_without_job} round(s) killed a victim that never started a job")
    if left_active:
        notes.append(f"{left_active} job(s) still active after the drain")
    return figures, notes


def main() -> int:
    p = c.parser(__doc__, seconds=None, url=None)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--lease", type=float, default=5.0, help="lease seconds (at least 5)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    if args.url:
        c.check_loopback(args.url)  # before anything is created
    out = c.workdir("crash")
    url = args.url or f"sqlite:///{out / 'crash.db'}"
    result = run(url, rounds=args.rounds, lease=args.lease, seed=args.seed, out=out)
    backend = make_url(url).get_backend_name()
    return c.finish(f"crash_loop ({backend})", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
