"""The run's auth token: how every process of a run proves it belongs to the run.

Sources, in order:

1. ``TRACEML_TOKEN`` in the environment. The sbatch templates export a fresh random value before
   ``srun``; Slurm copies the batch shell's environment to every task on every node, and a
   process's environment is readable only by its owner and root. Needs no shared filesystem.
2. One node: a fresh random token made by the launcher, handed to its workers (environment).
3. Several nodes and no ``TRACEML_TOKEN``: ``HMAC(per-user secret, the job's identity)``. The
   per-user secret is 32 random bytes in ``~/.traceml/secret``, created once by whichever launcher
   needs it first (mode 0600 in a 0700 directory, atomically, so nodes starting together agree on
   one), and read by every later run. Home directories are shared across the nodes of nearly every
   cluster, so every node of the job computes the same token with no flag and no file per job;
   nobody who cannot read that file can compute it (the job id, user and node list in ``squeue``
   are not enough). Where homes are not shared, the nodes hold different secrets, node 0 refuses
   the others, and their launchers say so and name ``TRACEML_TOKEN`` (see
   :func:`disagreement_hint`).

The token itself never crosses the network: hellos carry an HMAC over a fresh nonce.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from ..config import LaunchConfig
from ..errors import TraceMLError

ENV_VAR = "TRACEML_TOKEN"
MIN_LENGTH = 16
SECRET_DIR = ".traceml"
SECRET_FILE = "secret"
#: the secret's length in bytes (stored as hex)
SECRET_BYTES = 32
SOURCE_SECRET = "user-secret"
EXPORT_HINT = f"export {ENV_VAR}=$(python3 -c 'import secrets;print(secrets.token_hex(16))')"


class TokenError(TraceMLError):
    """The per-user secret cannot be used; the message says why and names the fix."""

    exit_code = 2


@dataclass(frozen=True)
class Token:
    value: str
    source: str
    warning: Optional[str] = None
    #: the per-user secret file the token came from (source ``user-secret``)
    secret_path: Optional[Path] = None


def resolve_token(config: LaunchConfig, environ: Mapping[str, str]) -> Token:
    given = environ.get(ENV_VAR, "").strip()
    if given:
        if len(given) < MIN_LENGTH:
            return Token(given, f"env:{ENV_VAR}",
                         f"{ENV_VAR} is only {len(given)} characters; use at least {MIN_LENGTH} random "
                         f"characters (for example `{EXPORT_HINT}`).")
        return Token(given, f"env:{ENV_VAR}")
    if not config.is_multinode and config.layout != "task":
        # (the task layout's tasks cannot hand each other a random value: they derive it too)
        return Token(secrets.token_hex(16), "generated")
    path = secret_path(environ)
    value = job_token(user_secret(path), job_id=config.job_id, run_name=config.run_name,
                      master_addr=config.master_addr, aggregator_port=config.aggregator_port,
                      nnodes=config.nnodes)
    return Token(value, SOURCE_SECRET, secret_path=path)


def job_token(secret: bytes, *, job_id: Optional[str], run_name: str, master_addr: str,
              aggregator_port: int, nnodes: int) -> str:
    """The run's token from the per-user secret: every node of the job computes the same one."""
    material = "\0".join(["traceml-run-token-v2", str(job_id), run_name, master_addr,
                          str(aggregator_port), str(nnodes)])
    return hmac.new(secret, material.encode(), hashlib.sha256).hexdigest()[:32]


def secret_path(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / SECRET_DIR / SECRET_FILE


def disagreement_hint(token: Token) -> str:
    """What to tell the user when node 0 refuses a node whose token came from the per-user secret."""
    if token.source != SOURCE_SECRET:
        return (f"check that {ENV_VAR} is the same on every node (export it once in the sbatch "
                "script, before srun)")
    return (f"without {ENV_VAR}, each node's token comes from the per-user secret {token.secret_path}; "
            "node 0 refusing this node means node 0 read another secret, i.e. the home directory is "
            f"not shared between the nodes. Export a token in the sbatch script before srun: "
            f"`{EXPORT_HINT}`")


def user_secret(path: Path) -> bytes:
    """The per-user secret at ``path``, created (once, atomically) if it does not exist yet."""
    try:
        return _read_private(path)
    except FileNotFoundError:
        pass
    _make_private_dir(path.parent)
    tmp = path.parent / f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, also on NFS: of launchers racing here, exactly one wins
        except FileExistsError:
            pass  # another node's launcher made it first: use theirs
    except OSError as exc:
        raise TokenError(
            f"TraceML cannot create its per-user secret {path} ({exc.strerror or exc}); a multi-node "
            f"run without {ENV_VAR} needs it to make a token other users cannot compute. Make "
            f"{path.parent} writable, or export a token in the sbatch script before srun: "
            f"`{EXPORT_HINT}`.") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_private(path)


def _make_private_dir(d: Path) -> None:
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError as exc:
        raise TokenError(
            f"TraceML cannot create {d} ({exc.strerror or exc}) for its per-user secret. Make your home "
            f"directory writable, or export a token in the sbatch script before srun: `{EXPORT_HINT}`."
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise TokenError(
            f"{d} is not a private directory of yours (it must be a real directory you own that "
            f"others cannot write, e.g. `chmod 700 {d}`), so TraceML will not keep its per-user "
            f"secret there. Fix it, or export a token in the sbatch script before srun: `{EXPORT_HINT}`.")


def _read_private(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(str(path)) from None
        raise TokenError(
            f"TraceML cannot read its per-user secret {path} ({exc.strerror or exc}); remove it to have "
            f"a new one made, or export a token in the sbatch script before srun: `{EXPORT_HINT}`."
        ) from None
    try:
        st = os.fstat(fd)
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise TokenError(
            f"TraceML's per-user secret {path} can be read by others (mode {stat.S_IMODE(st.st_mode):04o}"
            f"{'' if st.st_uid == os.getuid() else ', not owned by you'}): anyone who reads it can "
            f"feed or read your runs' telemetry. Run `chmod 600 {path}` (or remove it: a new one is "
            f"made), or export a token in the sbatch script before srun: `{EXPORT_HINT}`.")
    text = data.decode(errors="replace").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise TokenError(
            f"TraceML's per-user secret {path} is not what TraceML writes (at least 32 hex digits). "
            f"Remove it to have a new one made, or export a token in the sbatch script before srun: "
            f"`{EXPORT_HINT}`.")
    return secret
