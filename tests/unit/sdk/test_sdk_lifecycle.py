"""init/shutdown as a training script sees them: run info hand-over, no server, no run info,
refusal, crash and clean exit (the latter in real subprocesses, so atexit and excepthook run)."""

from __future__ import annotations

import subprocess
import textwrap
import time

import pytest
import torch

from traceml_core.rankfacts import FACT_KINDS
from traceml_core.wire.sink import SinkServer

from sdk_helpers import PYTHON, free_port, run_info_env, subprocess_env


def run_script(body: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", textwrap.dedent(body)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_init_without_a_reachable_aggregator_warns_once_and_keeps_count(sdk, traceml_log):
    port = free_port()                           # nothing listens there
    t0 = time.perf_counter()
    active = sdk.init(aggregator=f"127.0.0.1:{port}", token="t", run_name="r", connect_wait=0.5)
    waited = time.perf_counter() - t0
    assert active and 0.45 <= waited < 1.5, f"init waited {waited:.2f}s for a 0.5s window"
    for _ in range(500):
        with sdk.trace_step():
            pass
    t0 = time.perf_counter()
    sdk.shutdown()
    assert time.perf_counter() - t0 < 2.5
    st = sdk.stats()
    assert st["steps"] == 500 and st["sent"] == 0 and st["lost"] == 500
    warnings = [r.getMessage() for r in traceml_log.records if r.levelname == "WARNING"]
    assert sum("no answer from the aggregator" in w for w in warnings) == 1
    lost = [w for w in warnings if "could not deliver 500 of 500" in w]
    assert len(lost) == 1 and "the summary marks this rank's telemetry incomplete" in lost[0], lost


def test_without_run_info_tracing_is_off_and_says_so_once(sdk, traceml_log, monkeypatch):
    monkeypatch.delenv("TRACEML_RUN_INFO", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert sdk.init() is False
    assert sdk.init() is False                    # a second call changes nothing
    ctx = sdk.trace_step(torch.nn.Linear(2, 2))
    with ctx:
        pass
    assert type(ctx).__name__ == "NullContext"
    st = sdk.stats()
    assert st["enabled"] is False and st["steps"] == 0 and "TRACEML_RUN_INFO" in st["reason_off"]
    warnings = [r.getMessage() for r in traceml_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "traceml run" in warnings[0]


def test_without_run_info_only_rank_zero_speaks(sdk, traceml_log, monkeypatch):
    monkeypatch.delenv("TRACEML_RUN_INFO", raising=False)
    monkeypatch.setenv("RANK", "1")
    with sdk.trace_step():                        # implicit init on first use
        pass
    assert sdk.stats()["initialized"] and not sdk.stats()["enabled"]
    assert not [r for r in traceml_log.records if r.levelname == "WARNING"]


def test_a_malformed_torchrun_variable_is_named_and_tracing_stays_off(sdk, sink, traceml_log, monkeypatch):
    # RANK is read like every other variable (sdk/session.TorchrunVars): a bad value is one line that
    # names it, the value and the fix; training goes on without telemetry (never posing as rank 0)
    monkeypatch.setenv("RANK", "one")
    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run") is False
    with sdk.trace_step():
        pass
    warnings = [r.getMessage() for r in traceml_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "RANK='one' is not a whole number" in warnings[0] and "torchrun sets RANK" in warnings[0]
    assert "Traceback" not in warnings[0] and sdk.stats()["steps"] == 0


def test_given_arguments_shadow_the_torchrun_variables(sdk, sink, monkeypatch):
    monkeypatch.setenv("RANK", "-1")
    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run",
                    rank=3, local_rank=1, world_size=4, node_rank=0, connect_wait=5.0)
    st = sdk.stats()
    assert (st["rank"], st["local_rank"], st["world_size"], st["node_rank"]) == (3, 1, 4, 0)


def test_refusal_turns_tracing_off_with_one_line(sdk, traceml_log):
    server = SinkServer("right", "test-run").start()
    try:
        sdk.init(aggregator=f"127.0.0.1:{server.port}", token="wrong", run_name="test-run",
                 connect_wait=2.0)
        assert type(sdk.trace_step()).__name__ == "NullContext"
        assert sdk.stats()["refused"].startswith("authentication failed")
        sdk.shutdown()
    finally:
        server.stop()
    lines = [r.getMessage() for r in traceml_log.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and "refused" in lines[0]


def test_run_info_from_the_launcher_is_read_once(sink):
    script = """
        import traceml_core as traceml
        assert traceml.init()
        for _ in range(3):
            with traceml.trace_step():
                pass
    """
    env = subprocess_env(TRACEML_RUN_INFO=run_info_env(sink.port), RANK="5", LOCAL_RANK="1",
                         WORLD_SIZE="8")
    res = run_script(script, env)
    assert res.returncode == 0, res.stderr
    assert sink.wait_for(lambda s: 5 in s.ranks and s.ranks[5].bye is not None)
    log = sink.ranks[5]
    assert log.hello["local_rank"] == 1 and log.hello["world"] == 8 and log.hello["kind"] == "rank"
    assert log.bye == {"t": "bye", "rank": 5, "status": "clean", "steps": 3, "dropped": 0,
                       "error": None, "fail_step": None, "fail_in_step": False}, "atexit flushed and said goodbye without shutdown()"
    assert log.columns["step"] == [0, 1, 2]
    assert "traceml" not in res.stderr, "a healthy run prints nothing"


def test_a_crash_sends_the_error_and_behaves_as_without_traceml(sink):
    script = """
        import traceml_core as traceml
        traceml.init()
        for i in range(4):
            with traceml.trace_step():
                if i == 3:
                    raise RuntimeError("CUDA out of memory (pretend)")
    """
    res = run_script(script, subprocess_env(TRACEML_RUN_INFO=run_info_env(sink.port), RANK="1"))
    assert res.returncode == 1
    assert "RuntimeError: CUDA out of memory (pretend)" in res.stderr, "traceback still printed"
    assert sink.wait_for(lambda s: 1 in s.ranks and s.ranks[1].bye is not None)
    log = sink.ranks[1]
    assert log.bye["status"] == "error"
    assert log.bye["error"] == "RuntimeError: CUDA out of memory (pretend)"
    # the step whose block raised is not recorded; the bye says the failure was in step 3
    assert log.bye["steps"] == 3 and log.records == 3
    assert log.bye["fail_step"] == 3 and log.bye["fail_in_step"] is True
    (event,) = [e for e in log.events if e["kind"] not in FACT_KINDS]  # not the progress marks
    assert event["kind"] == "exception" and "Traceback" in event["text"]
    assert "CUDA out of memory (pretend)" in event["text"]


@pytest.mark.parametrize("call, said", [("sys.exit(5)", "sys.exit(5)"), ("exit(5)", "exit(5)"),
                                         ("quit(5)", "quit(5)")])
def test_a_failing_exit_call_marks_the_rank_error_with_the_same_exit_code(sink, call, said):
    script = f"""
        import sys
        import traceml_core as traceml
        traceml.init()
        for i in range(3):
            with traceml.trace_step():
                pass
        {call}
    """
    res = run_script(script, subprocess_env(TRACEML_RUN_INFO=run_info_env(sink.port), RANK="1"))
    assert res.returncode == 5, "the script's own exit code"
    assert sink.wait_for(lambda s: 1 in s.ranks and s.ranks[1].bye is not None)
    bye = sink.ranks[1].bye
    assert bye["status"] == "error" and bye["error"] == said and bye["steps"] == 3


def test_an_exception_in_a_helper_thread_is_an_event_not_a_failed_rank(sink):
    script = """
        import threading
        import traceml_core as traceml
        traceml.init()
        def bad():
            raise KeyError("prefetch worker died")
        t = threading.Thread(target=bad, name="prefetcher")
        t.start(); t.join()
        with traceml.trace_step():
            pass
    """
    res = run_script(script, subprocess_env(TRACEML_RUN_INFO=run_info_env(sink.port), RANK="0"))
    assert res.returncode == 0 and "prefetch worker died" in res.stderr
    assert sink.wait_for(lambda s: 0 in s.ranks and s.ranks[0].bye is not None)
    log = sink.ranks[0]
    assert log.bye["status"] == "clean"
    (event,) = [e for e in log.events if e["kind"] not in FACT_KINDS]  # not the progress marks
    assert event["kind"] == "thread_exception" and "prefetcher" in event["text"]
