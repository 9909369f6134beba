"""The run token without TRACEML_TOKEN: from a per-user secret, never from public facts.

Real files in a temporary home, real processes racing to create the secret.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import stat

import pytest

from traceml_core.config import resolve
from traceml_core.launcher.token import ENV_VAR, TokenError, resolve_token, secret_path

JOB = {"SLURM_JOB_ID": "4242"}


def _config(environ, **cli):
    base = {"nnodes": "2", "node_rank": "0", "nproc_per_node": "2", "master_addr": "node1",
            "run_name": "r1"}
    base.update(cli)
    return resolve(base, environ, clusters=[])


def _env(home, **extra):
    return {"HOME": str(home), **extra}


def test_zero_config_multinode_token_comes_from_a_private_per_user_secret(tmp_path):
    env = _env(tmp_path)
    tok = resolve_token(_config(env), env)
    path = secret_path(env)
    assert tok.source == "user-secret" and tok.secret_path == path and tok.warning is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # created once: every later run (and every other node, sharing the home) reads the same one
    first = path.read_bytes()
    assert resolve_token(_config(env), env).value == tok.value and path.read_bytes() == first
    # keyed with the run: another run name or job gives another token
    assert resolve_token(_config(env, run_name="r2"), env).value != tok.value
    assert not list(path.parent.glob(".*.tmp")), "no temporary file is left behind"


def test_the_token_cannot_be_computed_from_public_facts(tmp_path):
    """What the previous version derived (and another user could compute from squeue) is not the
    token now, and nothing public determines it: another user's secret gives another token."""
    env = _env(tmp_path)
    cfg = _config(env)
    tok = resolve_token(cfg, env)
    public = "\0".join(["traceml-v1", str(cfg.job_id), "root", cfg.master_addr, cfg.run_name,
                        str(cfg.nnodes), str(cfg.aggregator_port)])
    assert tok.value != hashlib.sha256(public.encode()).hexdigest()[:32]
    other = _env(tmp_path / "someone-else")
    assert resolve_token(_config(other), other).value != tok.value


def _race(home, q):
    env = _env(home)
    q.put(resolve_token(_config(env), env).value)


def test_nodes_starting_together_agree_on_one_secret(tmp_path):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(tmp_path, q)) for _ in range(8)]
    for p in procs:
        p.start()
    values = {q.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(10)
    assert len(values) == 1


def test_an_explicit_token_wins_and_one_node_needs_no_secret(tmp_path):
    env = _env(tmp_path, **{ENV_VAR: "x" * 32})
    assert resolve_token(_config(env), env).source == f"env:{ENV_VAR}"
    env = _env(tmp_path)
    assert resolve_token(_config(env, nnodes="1"), env).source == "generated"
    assert not secret_path(env).exists()


def test_a_secret_others_can_read_is_refused_with_the_fix(tmp_path):
    env = _env(tmp_path)
    resolve_token(_config(env), env)
    path = secret_path(env)
    os.chmod(path, 0o644)
    with pytest.raises(TokenError) as err:
        resolve_token(_config(env), env)
    msg = str(err.value)
    assert str(path) in msg and "0644" in msg and f"chmod 600 {path}" in msg and ENV_VAR in msg
    assert err.value.exit_code == 2


def test_a_home_that_cannot_hold_the_secret_names_traceml_token(tmp_path):
    home = tmp_path / "ro"
    home.mkdir()
    (home / ".traceml").write_text("a file where the directory should be")
    env = _env(home)
    with pytest.raises(TokenError) as err:
        resolve_token(_config(env), env)
    assert ENV_VAR in str(err.value) and ".traceml" in str(err.value)
