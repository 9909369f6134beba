"""`traceml slurm template` refuses bad input with the list of valid values, and accepts every
time format Slurm accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_slurm.cli import main as slurm_main
from traceml_slurm.template import presets
from traceml_slurm.template.options import TEMPLATE_OPTIONS
from traceml_slurm.template.slurmtime import parse_time

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return tmp_path


def template(*args):
    return slurm_main(["template", "--no-check", *args])


@pytest.mark.parametrize("text,seconds", [
    ("90", 90 * 60), ("0:30", 30), ("90:30", 90 * 60 + 30), ("12:00:00", 12 * 3600), ("1:90:00", 150 * 60),
    ("2-12", (2 * 24 + 12) * 3600), ("2-12:30", (2 * 24 + 12) * 3600 + 30 * 60),
    ("2-12:30:15", (2 * 24 + 12) * 3600 + 30 * 60 + 15), ("0-0:5", 300),
    ("UNLIMITED", None), ("infinite", None), ("INFINITE", None), ("-1", None), ("0", None), ("0:00:00", None),
])
def test_every_slurm_time_format(text, seconds):
    assert parse_time(text).seconds == seconds


def test_seconds_round_up_to_whole_minutes_like_slurm():
    assert parse_time("0:30").minutes == 1
    assert parse_time("1:01").minutes == 2
    assert parse_time("2-00:00:00").describe() == "2-00:00:00"


@pytest.mark.parametrize("text", ["2h", "1:2:3:4", "1-2-3", "-5", "1.5", "", "1-:00", "90m", "1 day"])
def test_bad_time_lists_the_formats(text):
    with pytest.raises(ValueError) as err:
        parse_time(text)
    for fmt in ("minutes", "hours:minutes:seconds", "days-hours:minutes:seconds", "UNLIMITED"):
        assert fmt in str(err.value)


# flag, bad value, words the error must contain (the valid values)
REFUSED = [
    ("--gpu-request", "gpus", ["gres", "gpus-per-node"]),
    ("--mode", "live", ["summary", "cli", "dashboard"]),
    ("--time", "2h", ["minutes:seconds", "days-hours", "UNLIMITED"]),
    ("--nodes", "0", ["from 1 to 65536"]),
    ("--nodes", "99999999999", ["from 1 to 65536"]),
    ("--nodes", "two", ["whole number"]),
    ("--gpus-per-node", "-1", ["from 0 to 1024"]),
    ("--gpus-per-node", "5000", ["from 0 to 1024"]),
    ("--signal-margin", "70000", ["from 0 to 65535"]),
    ("--mem", "64GiB", ["K, M, G or T", "64G"]),
    ("--output-pattern", "run-%q.out", ["%j", "%x", "%N", "%%"]),
    ("--env", "1X=2", ["KEY=VALUE"]),
    ("--env", "NOVALUE", ["KEY=VALUE"]),
    ("--partition", "gpu queue", ["letters, digits"]),
    ("--constraint", "a b", ["& (and)", "| (or)"]),
    ("--nccl-ifname", "eth 0", ["eth0", "^"]),
    ("--container-mount", "/a,/b", ["SRC[:DST[:FLAGS]]"]),
    ("--job-name", "my job", ["letters, digits"]),
]


@pytest.mark.parametrize("flag,value,valid", REFUSED, ids=[f"{f}={v}" for f, v, _ in REFUSED])
def test_invalid_value_gets_the_valid_values(in_tmp, capsys, flag, value, valid):
    from traceml_core.errors import ConfigError

    extra = ["--container-image", "img"] if flag == "--container-mount" else []
    with pytest.raises(ConfigError) as err:
        template(*extra, f"{flag}={value}", "train.py")
    message = str(err.value)
    assert flag in message and repr(value) in message
    for word in valid:
        assert word in message, f"{word!r} missing from: {message}"
    assert not list(in_tmp.glob("*.sbatch")), "nothing is written when the input is refused"


COMBINATIONS = [
    (["--nodes", "2", "--mode", "cli"], ["--mode=cli", "summary"]),
    (["--container-image", "a", "--apptainer-image", "b"], ["one container runtime"]),
    (["--container-mount", "/data"], ["--container-image", "--apptainer-image"]),
    (["--gpu-type", "a100"], ["--gpus-per-node"]),
    (["--gpus-per-node", "4", "--workers-per-node", "2"], ["one worker per GPU", "--gpus-per-node=0"]),
    (["--time", "5", "--signal-margin", "300"], ["0 to 299", "--time"]),
    (["--time", "0:30", "--signal-margin", "60"], ["0 to 59"]),
    (["--env", "TRACEML_TOKEN=abc"], ["fresh random token"]),
    (["--env", "A=1", "--env", "A=2"], ["twice"]),
    (["--nccl-ifname", "eth0", "--env", "NCCL_SOCKET_IFNAME=ib0"], ["keep one"]),
    (["--setup", "echo 'unbalanced"], ["not valid shell", "--setup"]),
    (["--node-setup", "module load x", "--no-wrapper"], ["--no-wrapper"]),
    (["--preset", "pyxis"], ["--container-image"]),
    (["--preset", "slurmy"], ["generic", "pyxis", "apptainer"]),
]


@pytest.mark.parametrize("args,words", COMBINATIONS, ids=[" ".join(a) for a, _ in COMBINATIONS])
def test_contradictions_are_refused_with_the_fix(in_tmp, args, words):
    from traceml_core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        template(*args, "train.py")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        slurm_main(["template", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for o in TEMPLATE_OPTIONS:
        assert o.flag in out
    assert "%x-%j.out" in out  # Slurm's % patterns survive argparse's %-formatting


def test_missing_script_is_refused(in_tmp):
    from traceml_core.errors import ConfigError

    with pytest.raises(ConfigError, match="training script is missing"):
        template("--nodes", "2")


def test_cli_error_is_one_paragraph_with_status_2_and_no_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "template", "--gpu-request=gpus",
                           "train.py"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("traceml: error: --gpu-request='gpus'")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_existing_files_are_not_overwritten_without_force(in_tmp, capsys):
    from traceml_core.errors import ConfigError

    assert template("train.py") == 0
    before = (in_tmp / "traceml-train.sbatch").read_text()
    with pytest.raises(ConfigError, match="--force"):
        template("--nodes", "2", "train.py")
    assert (in_tmp / "traceml-train.sbatch").read_text() == before
    assert template("--force", "--nodes", "2", "train.py") == 0
    assert "--nodes=2" in (in_tmp / "traceml-train.sbatch").read_text()


def test_print_and_json_alone_write_nothing(in_tmp, capsys):
    assert template("--print", "train.py") == 0
    assert template("--json", "train.py") == 0
    assert not list(in_tmp.glob("*.sbatch"))


def test_json_is_the_only_output_and_carries_sources(in_tmp, capsys):
    capsys.readouterr()
    assert template("--json", "--preset", "generic", "--nodes", "3", "--time", "1-00", "train.py", "--lr", "1") == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    job = data["job"]
    assert job["nodes"] == {"value": 3, "source": "flag"}
    assert job["gpus_per_node"] == {"value": 4, "source": "preset:generic"}
    assert job["workers_per_node"]["source"] == "derived:gpus_per_node"
    assert job["mode"] == {"value": "summary", "source": "default"}
    assert job["setup"]["source"] == "preset:generic"
    assert data["derived"]["world_size"] == 12 and data["derived"]["time_limit_minutes"] == 24 * 60
    assert data["derived"]["traceml_run"] == ["traceml", "run", "--mode=summary", "train.py", "--", "--lr", "1"]
    assert data["slurm"]["checked"] is False


def test_flags_beat_presets_and_lists_extend_them(in_tmp, capsys):
    capsys.readouterr()
    assert template("--json", "--preset", "generic", "--gpus-per-node", "2", "--setup", "module load x",
                    "train.py") == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert job["gpus_per_node"] == {"value": 2, "source": "flag"}
    assert job["setup"]["value"][-1] == "module load x" and len(job["setup"]["value"]) == 3
    assert job["setup"]["source"] == "preset:generic+flag"


def test_preset_file_by_path_and_its_errors(in_tmp, capsys):
    from traceml_core.errors import ConfigError

    site = in_tmp / "site.toml"
    site.write_text('description = "our site"\n[job]\npartition = "gpu"\ngpus-per-node = 2\nexclusive = true\n')
    capsys.readouterr()
    assert template("--json", "--preset", str(site), "train.py") == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert job["partition"] == {"value": "gpu", "source": "preset:site"}
    assert job["exclusive"] == {"value": True, "source": "preset:site"}
    site.write_text('[job]\ngpus = 2\n')
    with pytest.raises(ConfigError, match="unknown option 'gpus'. Valid keys: .*gpus_per_node"):
        template("--preset", str(site), "train.py")
    site.write_text('[job]\ntime = "2h"\n')
    with pytest.raises(ConfigError, match=r"--time='2h' \(from preset:site\)"):
        template("--preset", str(site), "train.py")


def test_every_shipped_preset_loads_and_only_uses_known_keys():
    names = presets.available()
    assert {"generic", "pyxis", "apptainer"} <= set(names)
    keys = {o.key for o in TEMPLATE_OPTIONS}
    for name in names:
        p = presets.load(name)
        assert p.description
        assert set(p.values) <= keys and set(p.requires) <= keys
