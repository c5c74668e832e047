"""The worker's batched log writer (vmcp_actors.web._log_writer): every line written, in
order, with its arguments as they were when it was logged."""

from __future__ import annotations

import io
import logging
import threading

from vmcp_actors.web._log_writer import BatchedLogWriter


def writer_to(stream: io.StringIO, level: int = logging.DEBUG) -> BatchedLogWriter:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.setLevel(level)
    return BatchedLogWriter([handler], batch_window=0.01)


def logger_for(writer: BatchedLogWriter, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers = [writer.handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_lines_from_many_threads_are_all_written_each_thread_in_order():
    stream = io.StringIO()
    writer = writer_to(stream)
    logger = logger_for(writer, "test-log-writer-threads")
    writer.start()

    def log(thread: int) -> None:
        for n in range(200):
            logger.info("thread=%d n=%d", thread, n)

    threads = [threading.Thread(target=log, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.stop()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 800
    for t in range(4):
        assert [line for line in lines if f"thread={t} " in line] == [f"INFO thread={t} n={n}" for n in range(200)]


def test_a_line_keeps_its_arguments_as_they_were_when_logged():
    stream = io.StringIO()
    writer = writer_to(stream)
    logger = logger_for(writer, "test-log-writer-args")
    writer.start()
    changing = ["before"]
    logger.info("value=%s", changing)
    changing[0] = "after"
    writer.stop()
    assert stream.getvalue() == "INFO value=['before']\n"


def test_an_exception_is_written_with_its_traceback_and_the_handler_level_holds():
    stream = io.StringIO()
    writer = writer_to(stream, level=logging.INFO)
    logger = logger_for(writer, "test-log-writer-exc")
    writer.start()
    logger.debug("not at the handler's level")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    writer.stop()
    text = stream.getvalue()
    assert text.startswith("ERROR failed\nTraceback")
    assert "ValueError: boom" in text and "handler's level" not in text


def test_lines_after_stop_are_written_by_their_own_thread():
    stream = io.StringIO()
    writer = writer_to(stream)
    logger = logger_for(writer, "test-log-writer-stop")
    writer.start()
    logger.info("queued")
    writer.stop()
    logger.info("late")
    assert stream.getvalue().splitlines() == ["INFO queued", "INFO late"]
