"""The broker (Redis): tokens pushed after the commit, one per ready job, popped by idle
workers."""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

from ..._model.backoff import Backoff
from ._common import RECONNECT_MAX, RECONNECT_MIN, Wake, first_line, log, parse_payload
from ._process import Waiter
from ._sources import Source

TOKEN_CAP = 256  # most wake-up tokens kept per queue on the broker
BROKER_WAIT_SECONDS = 1.0  # one BLPOP waits at most this long (then looks at its stop flag)
BROKER_TIMEOUT_SECONDS = 1.0  # connecting to the broker, and a publish, give up after this
STATUS_PING_SECONDS = 0.5  # `status` asks the broker for a PING, waiting at most this long


def redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError(
            "[broker] url is set but the redis package is not installed:"
            " pip install 'rerun-scheduler[redis]'"
        ) from None
    return redis


def token_key(prefix: str, queue: str) -> str:
    return f"{prefix}:wake:{queue}"


def show_url(url: str) -> str:
    """The broker's URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


FLUSH_SECONDS = 2.0  # how long closing (or the interpreter's exit) waits for the last push
_publishers: weakref.WeakSet[Publisher] = weakref.WeakSet()


@atexit.register
def _flush_publishers() -> None:
    for publisher in list(_publishers):
        publisher.close()


class Publisher:
    """Pushes the committed announcements to the broker from a thread of its own, so an
    enqueue never waits for Redis: whatever piled up meanwhile goes in one round trip (a burst
    of enqueues is a few pushes), one token per job up to :data:`TOKEN_CAP` per queue. While the
    broker is down, announcements are dropped (the workers poll) and retried after a back-off."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self._pending = Wake()
        self._cond = threading.Condition()
        self._closed = False
        self._client: Any = None
        self._down_until = 0.0
        self._backoff = Backoff(RECONNECT_MIN, RECONNECT_MAX)
        self._thread = threading.Thread(
            target=self._publish_pending, name="scheduler-publish", daemon=True
        )
        self._thread.start()
        _publishers.add(self)

    def submit(self, wake: Wake) -> None:
        with self._cond:
            self._pending.merge(wake)
            self._cond.notify()

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        """Stop, after publishing what is pending (waiting up to ``timeout`` for it): a
        process that enqueues and exits (a script, a management command) still wakes the
        workers."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _publish_pending(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return  # closed, and nothing left
                wake, self._pending = self._pending, Wake()
                closing = self._closed
            if time.monotonic() < self._down_until:
                if closing:
                    return
                continue  # the broker is down: the workers poll
            try:
                self._send(wake)
                self._backoff.reset()
            except Exception as exc:
                self._client = None
                self._down_until = time.monotonic() + self._backoff.next()
                log.warning(
                    "wake-ups: cannot publish to the broker %s (%s); workers look for new jobs"
                    " once a second",
                    show_url(self.url),
                    first_line(exc),
                    extra={"action": "wakeups_publish_failed"},
                )

    def _send(self, wake: Wake) -> None:
        if self._client is None:
            self._client = redis_module().Redis.from_url(
                self.url,
                socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
                socket_timeout=BROKER_TIMEOUT_SECONDS,
            )
        pipe = self._client.pipeline(transaction=False)
        for queue, count in wake.now.items():
            key = token_key(self.prefix, queue)
            pipe.rpush(key, *(["0"] * min(count, TOKEN_CAP)))
            pipe.ltrim(key, -TOKEN_CAP, -1)
        for queue, at in wake.later.items():
            key = token_key(self.prefix, queue)
            pipe.rpush(key, f"{at:.3f}")
            pipe.ltrim(key, -TOKEN_CAP, -1)
        pipe.execute()


class BrokerSource(Source):
    name = "the broker"

    def __init__(self, url: str, prefix: str, waiter: Waiter) -> None:
        super().__init__(waiter)
        self.url, self.prefix = url, prefix
        self.keys = {token_key(prefix, queue): queue for queue in sorted(waiter.queues)}

    def _interrupt(self) -> None:
        client = self._client
        if client is not None:  # a BLPOP in flight ends with an error, then the thread stops
            with contextlib.suppress(Exception):
                client.connection_pool.disconnect()

    def _serve(self) -> None:
        redis = redis_module()
        self._client = client = redis.Redis.from_url(
            self.url,
            socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
            socket_timeout=BROKER_WAIT_SECONDS + BROKER_TIMEOUT_SECONDS,
        )
        client.ping()
        self._connected()
        keys = list(self.keys)
        while not self._stop.is_set():
            if not self.waiter.has_free():  # a busy worker leaves the tokens to idle ones
                self.waiter.freed.clear()
                if not self.waiter.has_free():
                    self.waiter.freed.wait(0.05)
                continue
            popped = client.blpop(keys, timeout=BROKER_WAIT_SECONDS)
            if popped is None:
                continue
            key, value = (part.decode() for part in popped)
            if not self.waiter.has_free():  # became busy meanwhile: hand the token on
                client.lpush(key, value)
                continue
            found = parse_payload(f"{value} {self.keys.get(key, '*')}")
            if found is not None:
                self.waiter.notice(*found)


def broker_problem(url: str) -> str | None:
    """Why the broker at ``url`` cannot carry wake-ups now (one line), or None."""
    try:
        redis = redis_module()
    except ImportError as exc:
        return str(exc)
    client = redis.Redis.from_url(
        url, socket_connect_timeout=STATUS_PING_SECONDS, socket_timeout=STATUS_PING_SECONDS
    )
    try:
        client.ping()
    except Exception as exc:
        return f"broker {show_url(url)} is unreachable ({first_line(exc)})"
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return None
