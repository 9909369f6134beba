"""Pieces of the live views that need no aggregator: the output pump and the view settings."""

from __future__ import annotations

import subprocess

from traceml_core.views import start_view
from traceml_core.views.output import OutputPump
from traceml_core.views.settings import ViewSettings


def test_training_output_reaches_the_terminal_as_a_terminal_would_show_it():
    got: list[str] = []
    pump = OutputPump(got.append)
    script = ('echo first; printf "epoch 1\\r\\n"; printf "bar 10%%\\rbar 50%%\\rbar 100%%\\n"; '
              'printf "prompt without newline"; sleep 1.5; echo "to stderr" >&2; printf "tail"')
    proc = subprocess.Popen(["bash", "-c", script], **pump.popen_kwargs())
    pump.start()
    assert proc.wait(timeout=10) == 0
    assert pump.join(timeout=5), "EOF once the child is gone"
    text = "".join(got)
    assert text.splitlines() == ["first", "epoch 1", "bar 100%", "prompt without newline", "to stderr", "tail"]


def test_output_falls_back_to_plain_writes_when_the_view_fails(capfd):
    def broken(_text: str) -> None:
        raise RuntimeError("console gone")

    pump = OutputPump(broken)
    proc = subprocess.Popen(["bash", "-c", "echo still here"], **pump.popen_kwargs())
    pump.start()
    proc.wait(timeout=10)
    pump.join(timeout=5)
    assert "still here" in capfd.readouterr().out


def test_bad_view_settings_are_named_and_replaced_by_defaults():
    s = ViewSettings.from_env({"TRACEML_STATUS_INTERVAL": "soon", "TRACEML_DASHBOARD_PORT": "70000",
                               "TRACEML_DASHBOARD_HOST": "my laptop", "TRACEML_LIVE_REFRESH": "2"})
    assert (s.status_interval, s.dashboard_port, s.dashboard_host, s.refresh) == (10.0, 0, "127.0.0.1", 2.0)
    assert len(s.warnings) == 3
    assert "TRACEML_STATUS_INTERVAL='soon' is invalid" in s.warnings[0] and "default (10.0)" in s.warnings[0]
    assert "TRACEML_DASHBOARD_PORT='70000'" in s.warnings[2]


def test_no_view_for_summary_mode_or_other_nodes():
    class Cfg:
        mode, node_rank, aggregator_port = "summary", 0, 29765

    assert start_view(Cfg(), lambda req: None) is None
    Cfg.mode, Cfg.node_rank = "cli", 1
    assert start_view(Cfg(), lambda req: None) is None
