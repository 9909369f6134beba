"""Pieces of the live views that need no aggregator: the output pump and the view settings."""

from __future__ import annotations

import subprocess

import pytest

from traceml_core.views import start_view
from traceml_core.views.output import OutputPump


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


def test_view_settings_are_launch_options_refused_before_anything_starts():
    """The view's settings are options of the one table: a bad value is named at resolution (before
    the aggregator or the workers start), with the range; a good one shows its source."""
    from traceml_core.config import resolve
    from traceml_core.errors import ConfigError

    for env, needle in [({"TRACEML_STATUS_INTERVAL": "soon"}, "TRACEML_STATUS_INTERVAL='soon' is not a number"),
                        ({"TRACEML_DASHBOARD_PORT": "70000"}, "TRACEML_DASHBOARD_PORT='70000' must be between 0 and 65,535"),
                        ({"TRACEML_DASHBOARD_HOST": "my laptop"}, "TRACEML_DASHBOARD_HOST='my laptop'"),
                        ({"TRACEML_LIVE_REFRESH": "0"}, "TRACEML_LIVE_REFRESH='0' must be between 0.05 and 60")]:
        with pytest.raises(ConfigError) as err:
            resolve({}, env, [])
        assert needle in str(err.value) and "\n" not in str(err.value)
    c = resolve({"live_refresh": "2"}, {"TRACEML_STATUS_INTERVAL": "30"}, [])
    assert (c.live_refresh, c.source("live_refresh")) == (2.0, "cli")
    assert (c.status_interval, c.source("status_interval")) == (30.0, "env:TRACEML_STATUS_INTERVAL")


def test_no_view_for_summary_mode_or_other_nodes():
    class Cfg:
        mode, node_rank, aggregator_port = "summary", 0, 29765

    assert start_view(Cfg(), lambda req: None) is None
    Cfg.mode, Cfg.node_rank = "cli", 1
    assert start_view(Cfg(), lambda req: None) is None
