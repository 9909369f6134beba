"""What the checks of one node read: the Slurm facts, the options, and lazily-computed node facts.

Everything a check touches goes through :class:`NodeContext`: the job and the process environment as
:class:`~traceml_slurm.facts.Facts` (the checks never read the environment mapping; it is only handed
on to child processes), the launch config as ``traceml run`` resolves it, NVML, torch in a child
process, the network interfaces and the controller. Unit tests give it an environment mapping, a
fake NVML, a ready :class:`~.torchprobe.TorchInfo` and fake interfaces, and run the very same check
functions the agents run. Expensive facts are computed once, on first use; torch is started early in
the background because it is the slowest (:meth:`start_background`).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from traceml_core.config import LaunchConfig, resolve
from traceml_core.errors import ConfigError
from traceml_core import selftest

from ..context import Context
from ..facts import Facts, Gpus
from ..settings import SlurmVars

if TYPE_CHECKING:
    from traceml_core.selftest import NvmlBackend as Nvml
from .netinfo import Interface
from .progress import Progress, Quiet
from .thresholds import DEFAULT_TIMEOUT_S
from .torchprobe import INFO_ARGS, ProbeProcess, TorchInfo


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line (shipped to the agents as JSON)."""

    local: bool = False
    full: bool = False
    timeout: float = DEFAULT_TIMEOUT_S
    script: Optional[str] = None
    ignore: frozenset[str] = frozenset()
    verbose: bool = False
    #: the controller backend: "auto" (pyslurm when it imports, else scontrol), "pyslurm" or "scontrol"
    controller: str = "auto"

    def to_wire(self) -> dict[str, Any]:
        return {"local": self.local, "full": self.full, "timeout": self.timeout, "script": self.script,
                "ignore": sorted(self.ignore), "verbose": self.verbose, "controller": self.controller}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Options":
        return cls(bool(d.get("local")), bool(d.get("full")), float(d.get("timeout") or DEFAULT_TIMEOUT_S),
                   d.get("script"), frozenset(d.get("ignore") or ()), bool(d.get("verbose")),
                   str(d.get("controller") or "auto"))


@dataclass
class ConfigOutcome:
    """The launch config as `traceml run` would resolve it here, or why it does not resolve."""

    config: Optional[LaunchConfig] = None
    error: Optional[str] = None
    #: set when the config is what node 0's srun step WOULD resolve (we run in a batch/salloc shell)
    emulated: bool = False
    #: the refusal `traceml run` gives in this very shell, when emulated
    shell_refusal: Optional[str] = None


class NodeContext:
    def __init__(
        self,
        environ: Mapping[str, str],
        options: Options = Options(),
        *,
        hostname: Optional[str] = None,
        nvml_loader: Optional[Callable[[], "Nvml"]] = None,
        torch_info: Optional[TorchInfo] = None,
        interfaces: Optional[list[Interface]] = None,
        shm_path: str = "/dev/shm",
        clock: Callable[[], float] = time.time,
        cwd: Optional[str] = None,
        progress: Optional[Progress] = None,
        controller: Any = None,
        torch_process: Optional[ProbeProcess] = None,
    ) -> None:
        #: the environment, handed on unread to the processes the doctor starts (torch probe, srun)
        self.child_environ: Mapping[str, str] = dict(environ)
        self.facts = Facts.of(self.child_environ)
        self.options = options
        self.hostname = hostname or socket.gethostname()
        self._nvml_loader = nvml_loader
        self._nvml: Optional["Nvml"] = None
        self._nvml_error: Optional[str] = None
        self._nvml_loaded = False
        self._torch_info = torch_info
        self._torch_proc: Optional[ProbeProcess] = torch_process
        self._interfaces = interfaces
        self.shm_path = shm_path
        self.clock = clock
        self.cwd = cwd or os.getcwd()
        self.progress = progress or Quiet()
        self._config: Optional[ConfigOutcome] = None
        self._controller = controller
        #: the controller's answers for this run (doctor/controller.py: asked once, in the background)
        self.controller_answers: Any = None
        self.python = sys.executable
        self.python_version = ".".join(str(p) for p in sys.version_info[:3])

    # -- Slurm -----------------------------------------------------------------------------------

    @property
    def slurm(self) -> SlurmVars:
        """Raises ConfigError for a malformed SLURM_* variable (the context check reports it)."""
        return self.facts.vars

    @property
    def context(self) -> Context:
        return self.facts.context_or_guess

    @property
    def job_id(self) -> Optional[str]:
        return self.facts.job_id

    @property
    def node(self) -> str:
        """The node's Slurm name (as in SLURM_JOB_NODELIST), else its hostname."""
        return self.facts.node_name or self.hostname

    def job_nodes(self) -> list[str]:
        try:
            return list(self.facts.job_hosts)
        except ConfigError:
            return []

    def gpus(self) -> Gpus:
        """The GPUs Slurm gave this node (the same count the resolver starts workers for); none known
        when a SLURM_* value is malformed (slurm.context says which)."""
        try:
            return self.facts.gpus
        except ConfigError:
            return Gpus(None, None)

    def gpus_on_node(self) -> int:
        return self.gpus().allocated

    # -- the launch config ---------------------------------------------------------------------

    def launch(self) -> ConfigOutcome:
        if self._config is None:
            self._config = self._resolve()
        return self._config

    def _resolve(self) -> ConfigOutcome:
        try:
            return ConfigOutcome(resolve({}, self.facts.environ, script=self.options.script))
        except ConfigError as exc:
            first = str(exc)
        if self.context in (Context.BATCH_SHELL, Context.SALLOC_SHELL):
            # `traceml run` refuses in this shell by design; show what node 0's srun step would get.
            node0 = self.facts.node0_step()
            if node0 is not None:
                try:
                    return ConfigOutcome(resolve({}, node0.environ, script=self.options.script), emulated=True,
                                         shell_refusal=first)
                except ConfigError as exc:
                    return ConfigOutcome(error=str(exc), emulated=True, shell_refusal=first)
        return ConfigOutcome(error=first)

    def node_rank(self) -> Optional[int]:
        c = self.launch().config
        if c is not None and not self.launch().emulated:
            return c.node_rank
        if self.context is Context.BATCH_SHELL:
            return 0  # the batch shell runs on the first node of the allocation
        if self.context is Context.SALLOC_SHELL:
            return None  # the login host is no node of the job
        try:
            return self.facts.vars.nodeid
        except ConfigError:
            return None

    def is_node0(self) -> bool:
        return self.node_rank() == 0

    # -- NVML and torch ------------------------------------------------------------------------

    def nvml(self) -> "Nvml":
        """The NVML backend; raises NvmlUnavailable (cached) when there is none."""
        if not self._nvml_loaded:
            self._nvml_loaded = True
            try:
                self._nvml = (self._nvml_loader or selftest.load_nvml)()
            except selftest.NvmlUnavailable as exc:
                self._nvml_error = str(exc)
        if self._nvml is None:
            raise selftest.NvmlUnavailable(self._nvml_error or "NVML unavailable")
        return self._nvml

    def nvml_devices(self) -> tuple[Optional[list], Optional[str]]:
        try:
            return self.nvml().devices(), None
        except selftest.NvmlUnavailable as exc:
            return None, str(exc)
        except Exception as exc:  # noqa: BLE001 - an NVML call failing mid-way
            return None, f"NVML error: {type(exc).__name__}: {exc}"

    def start_background(self) -> None:
        """Start `import torch` in a child now: it is the slowest fact and overlaps everything else."""
        if self._torch_info is None and self._torch_proc is None:
            try:
                self._torch_proc = ProbeProcess(INFO_ARGS, self.options.timeout, self.child_environ, python=self.python)
            except OSError as exc:
                self._torch_info = TorchInfo(error=f"cannot start {self.python}: {exc}")

    def torch(self) -> TorchInfo:
        if self._torch_info is None:
            self.start_background()
        if self._torch_info is None:
            assert self._torch_proc is not None
            with self.progress.waiting("`import torch` in a child process", self.options.timeout):
                self._torch_info = TorchInfo.from_probe(self._torch_proc.result(), self.options.timeout)
        return self._torch_info

    def close(self) -> None:
        if self._torch_proc is not None and not self._torch_proc.done():
            self._torch_proc.kill()

    # -- network -------------------------------------------------------------------------------

    def interfaces(self) -> list[Interface]:
        if self._interfaces is None:
            from .netinfo import list_interfaces

            self._interfaces = list_interfaces()
        return self._interfaces

    # -- controller ----------------------------------------------------------------------------

    def controller(self) -> Any:
        """The controller-facts backend (pyslurm or scontrol); raises ControllerError."""
        if self._controller is None:
            from ..controller import select_backend

            prefer = None if self.options.controller == "auto" else self.options.controller
            self._controller = select_backend(timeout=min(5.0, self.options.timeout), prefer=prefer)
        return self._controller
