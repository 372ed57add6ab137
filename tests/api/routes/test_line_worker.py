"""inferd.api.routes.line_worker: uploads' lines checked in a low-priority worker process."""
from __future__ import annotations

import os
import signal

import pytest

from inferd.api.errors import ApiError
from inferd.api.routes.batch_input import InputError
from inferd.api.routes.line_worker import LineWorker, RemoteChecker
from tests.api.batch_harness import chat_line, jsonl


@pytest.fixture
async def worker():
    w = LineWorker()
    yield w
    await w.close()


async def test_the_worker_returns_each_model_once_with_the_line_that_first_named_it(worker):
    checker = RemoteChecker(worker, 1 << 20)
    content = jsonl(chat_line("a"), chat_line("b", model="other"), chat_line("c"))
    cut = len(content) // 2                 # a line split across two pieces
    firsts = await checker.feed(content[:cut]) + await checker.feed(content[cut:]) + await checker.finish()
    assert [(line.model, line.idx) for line in firsts] == [("sim", 0), ("other", 1)]


async def test_a_bad_line_is_the_same_input_error_the_daemon_would_raise(worker):
    checker = RemoteChecker(worker, 1 << 20)
    with pytest.raises(InputError) as err:
        await checker.feed(jsonl(chat_line("a")) + b"{not json\n")
    assert err.value.line == 2 and "line 2" in err.value.message


async def test_the_worker_runs_below_the_daemons_cpu_priority(worker):
    await RemoteChecker(worker, None).feed(jsonl(chat_line("a")))
    (pid,) = worker.pids()
    idle = os.sched_getscheduler(pid) == getattr(os, "SCHED_IDLE", -1)
    assert idle or os.getpriority(os.PRIO_PROCESS, pid) == 19


async def test_a_crashed_worker_is_a_503_and_the_next_upload_gets_a_new_one(worker):
    first = RemoteChecker(worker, None)
    await first.feed(jsonl(chat_line("a")))
    (pid,) = worker.pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ApiError) as err:
        await first.feed(jsonl(chat_line("b")))
    assert err.value.status == 503 and err.value.code == "upload_checker_unavailable"
    again = RemoteChecker(worker, None)
    assert [line.model for line in await again.feed(jsonl(chat_line("c")))] == ["sim"]
    assert worker.pids() != [pid]
