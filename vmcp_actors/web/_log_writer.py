"""The worker's log lines, written by one thread in batches.

Request threads only queue a line (its message formatted, so nothing it refers to can
change before it is written); one writer thread hands the queued lines to the real
handlers. A handler's lock held across a write would otherwise convoy every request thread
behind the GIL under load, and waking a writer for every line (logging's QueueListener)
costs a thread switch per request: here the writer wakes for the first line of a batch,
lets the batch gather for BATCH_WINDOW, and writes it all.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence

# How long the writer lets lines gather once the first one came: how late a line may be
# written, at most (stop() writes what is queued at once).
BATCH_WINDOW = 0.05

_STOP = object()


class BatchedLogWriter:
    """``handler`` queues records; the writer thread passes them to ``handlers``."""

    def __init__(self, handlers: Sequence[logging.Handler], batch_window: float = BATCH_WINDOW):
        self._handlers = tuple(handlers)
        self._batch_window = batch_window
        self._lines: queue.SimpleQueue[logging.LogRecord | object] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vmcp-log-writer", daemon=True)
        self.handler = _Enqueue(self._lines)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued, then stop; later lines are written by their own thread."""
        self.handler.direct = self._handlers
        self._stopping.set()
        self._lines.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._lines.get()  # idle: blocked here, costing nothing
            if first is not _STOP:
                self._stopping.wait(self._batch_window)  # the rest of the batch gathers meanwhile
            batch = [first]
            try:
                while True:
                    batch.append(self._lines.get_nowait())
            except queue.Empty:
                pass
            for record in batch:
                if record is not _STOP:
                    _write(record, self._handlers)  # type: ignore[arg-type]
            if _STOP in batch:
                return


def _write(record: logging.LogRecord, handlers: Sequence[logging.Handler]) -> None:
    for handler in handlers:
        if record.levelno >= handler.level:
            handler.handle(record)


class _Enqueue(logging.Handler):
    def __init__(self, lines: queue.SimpleQueue) -> None:
        super().__init__()
        self._lines = lines
        self.direct: tuple[logging.Handler, ...] = ()  # once the writer stopped

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.msg = record.getMessage()
            record.args = None
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
                record.exc_info = None
        except Exception:  # noqa: BLE001 - logging's own rule: a bad line must not fail the caller
            self.handleError(record)
            return
        if self.direct:
            _write(record, self.direct)
        else:
            self._lines.put(record)
