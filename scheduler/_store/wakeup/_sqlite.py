"""SQLite: the WAL index header of the database file, read by a worker's thread; this
process's own commits are told apart."""

from __future__ import annotations

import contextlib
import os
import select
import struct
import threading
import time

from sqlalchemy import Engine

from ._common import database_key, registry_lock
from ._process import Waiter
from ._sources import PipedSource

SQLITE_WATCH_SECONDS = 0.01  # how often a SQLite worker reads the WAL index header

SQLITE_BEFORE = "scheduler_wakeup_sqlite_before"
HEADER_BYTES = 48  # the first copy of the WAL index header (https://sqlite.org/walformat.html)
OWN_COMMIT_SECONDS = 0.1  # a commit of this process not done after this is not waited for
RECHECK_SECONDS = 0.002  # after a write to the -wal file: look at the header again this soon
RECHECK_WITHIN = 0.05  # ... until it moves, for at most this long (the frames come first)


class SqliteWatcher:
    """Reads the WAL index header of one SQLite file (its ``-shm``): it changes at every commit,
    of any process. This process's own write transactions record the header before and after
    their commit (:meth:`own`); a change made of those alone is not news."""

    def __init__(self, path: str) -> None:
        self.path = path + "-shm"
        self._fd: int | None = None
        self._inode: int | None = None
        self._own: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        self._flying = 0  # this process's commits between their two header reads
        self._flying_since = 0.0
        self.users = 0

    def header(self) -> bytes:
        """The header now (empty while there is no ``-shm`` file, no connection being open, or
        the index is not built yet)."""
        try:
            if self._fd is None:
                fd = os.open(self.path, os.O_RDONLY)
                self._fd, self._inode = fd, os.fstat(fd).st_ino
            data = os.pread(self._fd, HEADER_BYTES, 0)
            # isInit (byte 12): 0 until a connection has built the index (not a commit)
            return data if len(data) == HEADER_BYTES and data[12] else b""
        except OSError:
            self.reopen()
            return b""

    def reopen(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def stale(self) -> bool:
        """Whether the ``-shm`` file was replaced (every connection closed meanwhile)."""
        try:
            return os.stat(self.path).st_ino != self._inode
        except OSError:
            return True

    def committing(self) -> bytes:
        """One of this process's write transactions is about to commit: the header before it
        (it holds SQLite's write lock, so no other commit lands meanwhile)."""
        with self._lock:
            if not self._flying:
                self._flying_since = time.monotonic()
            self._flying += 1
        return self.header()

    def own(self, before: bytes, after: bytes | None) -> None:
        """That commit is done (``after``: the header now; None: it did not happen)."""
        with self._lock:
            self._flying = max(self._flying - 1, 0)
            if after is None or before == after:
                return
            if len(self._own) > 256:
                self._own.clear()
            self._own[before] = after

    def news(self, last: bytes, now: bytes) -> bool | None:
        """Whether going from header ``last`` to ``now`` took a commit of another process (from
        no ``-shm`` file at all: a first connection opened, not news); None while a commit of
        this process is under way (look again in a moment: it says what it changed)."""
        if last == now or not last:
            return False
        with self._lock:
            if self._flying and time.monotonic() - self._flying_since < OWN_COMMIT_SECONDS:
                return None
            seen = 0
            while last in self._own and seen < 256:
                last = self._own.pop(last)
                seen += 1
        return last != now


sqlite_watchers: dict[str, SqliteWatcher] = {}


def sqlite_watcher(engine: Engine) -> SqliteWatcher | None:
    key = database_key(engine)
    if not key.startswith("sqlite:"):
        return None  # in memory: one process only, woken directly
    with registry_lock:
        watcher = sqlite_watchers.get(key)
        if watcher is None:
            watcher = sqlite_watchers[key] = SqliteWatcher(key.removeprefix("sqlite:"))
        watcher.users += 1
    return watcher


class Inotify:
    """Linux's inotify on a folder, for the writes to one file in it (through ctypes); raises
    OSError (or AttributeError) where there is none: then the watcher reads every 10 ms."""

    MASK = 0x2 | 0x80 | 0x100  # IN_MODIFY, IN_MOVED_TO, IN_CREATE

    def __init__(self, path: str) -> None:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        folder = os.path.dirname(path) or "."
        if libc.inotify_add_watch(fd, os.fsencode(folder), self.MASK) < 0:
            error = ctypes.get_errno()
            os.close(fd)
            raise OSError(error, f"inotify_add_watch {folder}")
        self.fd = fd
        self.name = os.fsencode(os.path.basename(path))

    def drain(self) -> bool:
        """Read the events that arrived; whether one was about the file."""
        hit = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return hit
            offset = 0
            while offset + 16 <= len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\0")
                hit = hit or name == self.name
                offset += 16 + size

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class SqliteSource(PipedSource):
    """Wakes the worker when the WAL index header moves by another process's commit: looked at
    after each write to the ``-wal`` file (inotify: no wake-up of this thread while nothing is
    written), or every :data:`SQLITE_WATCH_SECONDS` where there is no inotify."""

    name = "the SQLite file watcher"

    def __init__(self, watcher: SqliteWatcher, waiter: Waiter) -> None:
        super().__init__(waiter)
        self.watcher = watcher
        self.how = "poll"  # or "inotify" (tests)

    def stop(self) -> None:
        super().stop()
        with registry_lock:
            self.watcher.users -= 1
            if self.watcher.users <= 0:
                key = "sqlite:" + self.watcher.path.removesuffix("-shm")
                sqlite_watchers.pop(key, None)
                self.watcher.reopen()

    def _serve(self) -> None:
        watcher = self.watcher
        try:
            events: Inotify | None = Inotify(watcher.path.removesuffix("-shm") + "-wal")
            self.how = "inotify"
        except (OSError, AttributeError):
            events = None
        try:
            self._watch(watcher, events)
        finally:
            if events is not None:
                events.close()

    def _watch(self, watcher: SqliteWatcher, events: Inotify | None) -> None:
        last = watcher.header()
        self._connected()
        checked = time.monotonic()
        recheck_until = 0.0  # after a write to the -wal file, until the header moves
        while not self._stop.is_set():
            now_ = time.monotonic()
            if events is None:
                timeout = SQLITE_WATCH_SECONDS
            elif now_ < recheck_until:
                timeout = RECHECK_SECONDS
            else:
                timeout = 1.0
            ready, _, _ = select.select(
                [self._pipe[0]] if events is None else [self._pipe[0], events.fd],
                [],
                [],
                timeout,
            )
            if self._pipe[0] in ready:
                return
            if events is not None and events.fd in ready and events.drain():
                recheck_until = time.monotonic() + RECHECK_WITHIN
            header = watcher.header()
            verdict = watcher.news(last, header)
            if verdict is None:  # a commit of ours under way: it will say what it changed
                recheck_until = max(recheck_until, time.monotonic() + RECHECK_SECONDS)
                continue
            if verdict:
                self.waiter.wake()
            if header != last:
                recheck_until = 0.0
            last = header
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                if watcher.stale():
                    watcher.reopen()
