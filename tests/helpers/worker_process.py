"""``scheduler worker`` as a real subprocess, its output in a file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from helpers.cli import COMMAND


class WorkerProcess:
    """``scheduler worker`` as a subprocess, its stderr in a file."""

    def __init__(self, cwd: Path, config: Path, *args: str) -> None:
        self.log = cwd / f"worker-{time.monotonic_ns()}.log"
        env = {  # a pgbouncer case's pooler settings are kept
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SCHEDULER_")
            or k in ("SCHEDULER_DATABASE_POOLER", "SCHEDULER_DATABASE_LISTEN_URL")
        }
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [*COMMAND, "--config", str(config), "worker", *args],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
