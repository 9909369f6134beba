"""A run that never reaches its first step, as a user meets it: the real `traceml run`, real
torchrun and gloo workers where anything starts.

Caught by the pre-flight before anything starts (exit status 2, one paragraph, no run directory):
the master port taken (by a socket this test holds) and a syntax error (Python's own error: file,
line, caret). Caught when the workers fail before their first step (a missing import, above and
below `import torch`): one headline, DID-NOT-START, naming Python's error with file and line, no
traceback through torch or TraceML anywhere in the output, and nothing about steps, peers or
performance.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from scenarios.runner import clean_env, free_ports  # noqa: E402

#: a frame of a traceback inside torch or TraceML (what the user must never have to read)
INTERNAL_FRAME = re.compile(r'File "[^"]*(site-packages/torch|traceml_core|<frozen runpy>)')
#: words that belong to a run that trained, or to a lost peer: wrong in the headline of a run that
#: never started
WRONG_WORDS = ("consequence", "lost peer", "too few steps", "traceml.init() cannot report",
               "run at least", "NO-STEPS", "RUN-FAILED")


def _run(tmp: Path, name: str, script: Path, *flags: str, timeout: float = 240) -> subprocess.CompletedProcess:
    master, agg = free_ports(2)
    args = [sys.executable, "-m", "traceml_core.cli", "run", "--nproc-per-node=2", f"--logs-dir={tmp}",
            f"--run-name={name}", f"--aggregator-port={agg}"]
    if not any(f.startswith("--master-port") for f in flags):
        args.append(f"--master-port={master}")
    return subprocess.run(args + list(flags) + [str(script)], capture_output=True, text=True,
                          env=clean_env(), timeout=timeout, cwd=tmp)


def _no_internal_traceback(text: str) -> None:
    bad = [ln for ln in text.splitlines() if INTERNAL_FRAME.search(ln)]
    assert not bad, "a traceback through torch or TraceML:\n" + "\n".join(bad[:10])
    assert "ChildFailedError" not in text


def test_master_port_taken_is_refused_before_anything_starts(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    try:
        p = _run(tmp_path, "port", script, f"--master-port={port}", timeout=60)
    finally:
        holder.close()
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err  # one paragraph
    assert f"master port {port} (from --master-port) is already in use" in err
    assert "--master-port" in err and "Nothing was started" in err
    assert "Traceback" not in p.stderr + p.stdout
    assert not (tmp_path / "port").exists()  # no run directory, no aggregator


def test_syntax_error_is_pythons_own_error_before_anything_starts(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\n\ndef main(:\n    pass\n")
    p = _run(tmp_path, "syntax", script, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = p.stderr
    assert "does not compile, so no worker was started" in err
    assert f'File "{script}", line 3' in err and "def main(:" in err and "^" in err
    assert "SyntaxError" in err
    assert "Traceback" not in err and "run at least" not in err + p.stdout
    assert not (tmp_path / "syntax").exists()


def _did_not_start(tmp: Path, name: str, source: str, line: int) -> None:
    script = tmp / f"{name}.py"
    script.write_text(source)
    p = _run(tmp, name, script)
    out = p.stdout + p.stderr
    assert p.returncode == 1, (p.returncode, out[-3000:])
    s = json.loads((tmp / name / "final_summary.json").read_text())
    v = s["verdict"]
    assert v["kind"] == "did_not_start" and v["severity"] == "critical", v
    assert v["evidence"]["exception_type"] == "ModuleNotFoundError", v
    assert v["evidence"]["where"] == f"{name}.py:{line} in <module>", v
    assert "No module named 'no_such_module_xyz'" in v["why"]
    assert v["why"].startswith("no rank reached its first step: rank ")
    assert "install the missing module" in v["next_step"]
    assert s["other_verdicts"] == [], s["other_verdicts"]  # nothing about steps or performance
    headline = [ln for ln in p.stdout.splitlines() if ln.startswith("Verdict:")]
    assert len(headline) == 1 and "DID-NOT-START (critical)" in headline[0], p.stdout
    # the headline (reason, verdict, advice): nothing about peers, steps or performance (the
    # rank list may say a rank torchrun stopped before it raised was stopped: that is true)
    head = "\n".join(ln for ln in p.stdout.splitlines()
                     if ln.lstrip().startswith(("reason:", "Verdict:", "next:", "also:")))
    for word in WRONG_WORDS:
        assert word not in head, (word, head)
    # Python's own error, from the user's file, in the workers' output
    assert f'File "{script}", line {line}, in <module>' in p.stderr, p.stderr[-3000:]
    _no_internal_traceback(out)


def test_missing_import_before_torch_did_not_start(tmp_path):
    # TraceML never starts in these workers (it starts when the script imports torch): the error
    # reaches the summary through torchrun's record of each worker
    _did_not_start(tmp_path, "early", "import os\nimport no_such_module_xyz\nimport torch\n", 2)


def test_missing_import_after_torch_did_not_start(tmp_path):
    # TraceML runs here (the import of torch started it): its exception hook reports the error
    _did_not_start(tmp_path, "late", "import torch\nimport torch.distributed as dist\n"
                   "dist.init_process_group('gloo')\nimport no_such_module_xyz\n", 4)
