"""The real pyslurm, replayed: a module with pyslurm's API whose objects are what the real pyslurm
25.11.2 returned on a real Slurm 25.11 (``tests/fixtures/pyslurm/<generation>/<situation>.json``,
made by ``tests/fixtures/pyslurm/record.py``).

An object has exactly the attributes the real one had, with the recorded values and types: any other
name raises ``AttributeError`` as pyslurm does (``Config.kill_wait`` does not exist in 25.11), a
method the recording did not call raises :class:`NotRecorded`, and values of pyslurm's own types
(``TrackableResources``, ...) are :class:`Opaque`. A variant of a situation changes recorded values
(``job={"state": "COMPLETING"}``), but only to a type the real pyslurm was seen to return for that
attribute in some recording, so a test cannot build a pyslurm that does not exist.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pyslurm"
GENERATION = "25.11"


class NotRecorded(Exception):
    """The real object has this method, but the recording did not call it."""


class Opaque:
    """A value of one of pyslurm's own types: recorded by type only; any use is a test error."""

    def __init__(self, type_name: str) -> None:
        self._type = type_name

    def __getattr__(self, name: str) -> Any:
        raise NotRecorded(f"a {self._type} was recorded by type only; the backend must not read .{name}")

    def __repr__(self) -> str:
        return f"<recorded {self._type}>"


def plain(rec: Mapping[str, Any]) -> Any:
    """A recorded ``{"type", "value"}`` as the Python value the real pyslurm returned."""
    if rec.get("opaque"):
        return Opaque(rec["type"])
    if rec["type"] == "RAISES":
        raise RuntimeError(rec["value"])
    v = rec["value"]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


@functools.lru_cache(maxsize=None)
def load(situation: str, generation: str = GENERATION) -> dict[str, Any]:
    return json.loads((FIXTURES / generation / f"{situation}.json").read_text())


@functools.lru_cache(maxsize=None)
def seen_types(generation: str = GENERATION) -> dict[tuple[str, str], frozenset[str]]:
    """(object type, attribute) -> every type the real pyslurm returned for it in any recording."""
    seen: dict[tuple[str, str], set[str]] = {}

    def add(obj: Mapping[str, Any]) -> None:
        for name, rec in obj["attrs"].items():
            seen.setdefault((obj["type"], name), set()).add(rec["type"])

    for path in sorted((FIXTURES / generation).glob("*.json")):
        doc = json.loads(path.read_text())
        for key in ("job", "config"):
            if doc.get(key):
                add(doc[key])
        for group in ("nodes", "partitions"):
            for obj in doc.get(group, {}).values():
                add(obj)
    return {k: frozenset(v) for k, v in seen.items()}


#: attributes pyslurm marks deprecated in its source: reading one warns here (DeprecationWarning), so
#: a test run with warnings as errors proves the backend does not (pyslurm 25.11.2, core/job/job.pyx:
#: "DEPRECATED - removed in the next major release")
DEPRECATED = {("Job", "gres_per_node")}


class Recorded:
    """One object as the real pyslurm returned it, with optional changed values (see the module doc)."""

    def __init__(self, rec: Mapping[str, Any], changes: Optional[Mapping[str, Any]] = None) -> None:
        self._rec = rec
        self._changes = dict(changes or {})
        seen = seen_types()
        for name, value in self._changes.items():
            if name not in rec["attrs"]:
                raise AssertionError(f"the real {rec['type']} has no attribute {name!r}: a variant cannot add one")
            allowed = seen.get((rec["type"], name), frozenset())
            if type(value).__name__ not in allowed:
                raise AssertionError(f"the real pyslurm never returned a {type(value).__name__} for {rec['type']}.{name} "
                                     f"(recorded: {', '.join(sorted(allowed))})")

    def __getattr__(self, name: str) -> Any:
        rec = self.__dict__["_rec"]
        if (rec["type"], name) in DEPRECATED:
            warnings.warn(f"{rec['type']}.{name} is deprecated in pyslurm (removed in the next major release)",
                          DeprecationWarning, stacklevel=2)
        if name in self.__dict__["_changes"]:
            return self.__dict__["_changes"][name]
        if name in rec["attrs"]:
            return plain(rec["attrs"][name])
        if name in rec.get("calls", {}):
            return lambda: plain(rec["calls"][name])
        if name in rec["methods"]:
            def not_recorded(*_a: Any, **_k: Any) -> Any:
                raise NotRecorded(f"{rec['type']}.{name}() exists but was not recorded")
            return not_recorded
        raise AttributeError(f"'{rec['type']}' object has no attribute '{name}'")


class RPCError(Exception):
    """What pyslurm raises for an unknown job, node or partition."""


def replay(situation: str = "gres2", *, states: Optional[str] = None, job: Optional[Mapping[str, Any]] = None,
           nodes: Optional[Mapping[str, Mapping[str, Any]]] = None,
           partitions: Optional[Mapping[str, Mapping[str, Any]]] = None,
           config: Optional[Mapping[str, Any]] = None, batch_script: Optional[str] = None) -> Any:
    """A pyslurm module replaying ``situation``; its nodes and partitions from the recording
    ``states`` when given (a job's recording with another moment's node states)."""
    import types

    doc = load(situation)
    node_doc = load(states)["nodes"] if states else doc["nodes"]
    part_doc = load(states)["partitions"] if states else doc["partitions"]
    job_rec = doc.get("job")
    script = batch_script if batch_script is not None else (plain(job_rec["calls"]["get_batch_script"]) if job_rec else None)
    # every change checked now, not when the backend happens to load the object
    if job:
        Recorded(job_rec, job)
    for group, changes in ((node_doc, nodes), (part_doc, partitions)):
        for name, change in (changes or {}).items():
            Recorded(group[name], change)
    if config:
        Recorded(doc["config"], config)

    class Job:
        def __init__(self, job_id: int) -> None:
            self.id = job_id

        @staticmethod
        def load(job_id: int) -> Recorded:
            if job_rec is None or job_id != job_rec["attrs"]["id"]["value"]:
                raise RPCError(f"Job {job_id} does not exist")
            return Recorded(job_rec, job)

        def get_batch_script(self) -> str:
            if job_rec is None or self.id != job_rec["attrs"]["id"]["value"]:
                raise RPCError(f"Job {self.id} does not exist")
            return script  # type: ignore[return-value]

    class Node:
        @staticmethod
        def load(name: str) -> Recorded:
            if name not in node_doc:
                raise RPCError(f"Invalid node name specified: {name}")
            return Recorded(node_doc[name], (nodes or {}).get(name))

    class Nodes:
        @staticmethod
        def load() -> dict[str, Recorded]:
            return {name: Recorded(rec, (nodes or {}).get(name)) for name, rec in node_doc.items()}

    class Partition:
        @staticmethod
        def load(name: str) -> Recorded:
            if name not in part_doc:
                raise RPCError(f"Partition {name} does not exist")
            return Recorded(part_doc[name], (partitions or {}).get(name))

    class Config:
        @staticmethod
        def load() -> Recorded:
            return Recorded(doc["config"], config)

    return types.SimpleNamespace(Job=Job, Node=Node, Nodes=Nodes, Partition=Partition, slurmctld=types.SimpleNamespace(Config=Config),
                                 RPCError=RPCError, __version__=plain(doc["module"]["__version__"]))


def job_env(situation: str = "gres2", **extra: Optional[str]) -> dict[str, str]:
    """The batch shell's environment of the recorded job (what the doctor's job checks need of it)."""
    a = load(situation)["job"]["attrs"]
    nodes = a["allocated_nodes"]["value"]
    env = {"SLURM_JOB_ID": str(a["id"]["value"]), "SLURM_JOB_NAME": a["name"]["value"], "SLURM_JOB_NODELIST": nodes,
           "SLURM_NODELIST": nodes, "SLURM_JOB_NUM_NODES": str(a["num_nodes"]["value"]),
           "SLURM_NNODES": str(a["num_nodes"]["value"]), "SLURM_NODEID": "0", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURMD_NODENAME": a["batch_host"]["value"], "SLURM_SUBMIT_DIR": "/home/u/p",
           "PATH": "/usr/bin:/bin"}
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
