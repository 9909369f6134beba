"""The scenarios of the verdict matrix: each a cause injected into ``train.py`` (real work where it
matters), with the truth a correct summary must tell about it, and how every verdict of a run is
scored against that truth.

**Classes.** A verdict kind belongs to one *class* of the matrix: the cause it names, or ``none``
for the verdicts that describe a healthy run (``compute_bound``, ``no_clear_bottleneck``, and the
information ``cpu_contention``).

**Truth.** A scenario's :class:`Truth` says which cause it has (``none`` for controls), on which
rank and in which phase, what else is true of the run (``also``: a consequence that must be
listed, e.g. a straggler its memory creep slows; ``allowed``: a true co-cause that may be loud,
e.g. CPU-OVERSUBSCRIBED for 4 ranks on 2 cores), and the figures a sentence must not contradict
(the period of periodic work, the ratio of work between ranks, words a failure must quote).

**Every verdict is scored** (:func:`score`), not only the primary:

* the expected cause must be found (primary, unless ``primary_any`` names a co-cause that may
  come first), on the right rank and phase, its figures agreeing with the truth;
* every ``also`` must be listed (any severity);
* every other verdict at ``warning`` or ``critical`` whose class is not the cause, an ``also`` or
  ``allowed`` is a **false secondary**, unless it is a consequence of the cause found: listed
  after it, saying so (``evidence.explained_by``), on the cause's rank (a rank whose memory
  creeps is slower too: true, and said to follow from the creep); an information verdict whose sentence contradicts the
  truth (a rank "not called a straggler" that is the culprit) is an error too;
* a control (cause ``none``) is right only with no warning or critical verdict at all.

**Magnitudes.** Each cause comes at three magnitudes, relative to the machine's compute (train.py:
"1.0" is one step's compute): *below* its threshold (truth ``none``: the cause is there but too
small to be worth a verdict), *near* it (1.5-2.5x the threshold: the cause must be found; these
runs give the thresholds' error rate, reported apart) and well *above* it.

**Halves.** Every scenario is in the ``tune`` half (rules may be changed for what these runs
show) or the ``held`` half (written with the tune half, committed before any rule changed, and
never used to change a rule: it measures whether the rules generalise). Held-out scenarios vary
the rank, the phase, the period, the magnitude or the input path of their tune-half twins.
``held2`` is a second held-out set, written and committed after the first held-out pass was
reported and before the rules changed for what it showed (that pass then became tuning data):
it measures the second round of changes the way ``held`` measured the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

#: verdict kind -> class of the matrix (its column)
CLASS_OF = {
    "compute_bound": "none", "no_clear_bottleneck": "none", "cpu_contention": "none",
    "straggler": "straggler", "work_imbalance": "work_imbalance", "input_bound": "input_bound",
    "memory_creep": "memory_creep", "communication_bound": "communication_bound",
    "periodic_work": "periodic_work", "cpu_oversubscribed": "cpu_oversubscribed",
    "host_sync": "host_sync", "low_gpu_util": "low_gpu_util", "hang": "hang", "run_failed": "run_failed",
    "no_steps": "no_steps", "did_not_start": "did_not_start",
}
#: the columns of the matrix, in print order (a kind not listed gets a column of its own)
CLASSES = ("none", "input_bound", "straggler", "work_imbalance", "memory_creep", "periodic_work",
           "cpu_oversubscribed", "communication_bound", "host_sync", "low_gpu_util", "no_steps",
           "run_failed", "hang", "did_not_start")
LOUD = ("warning", "critical")
#: how far a quoted figure may be from the truth before the sentence contradicts it
PERIOD_TOLERANCE = 0.3
RATIO_TOLERANCE = 0.25


def class_of(kind: str) -> str:
    return CLASS_OF.get(kind, kind)


@dataclass(frozen=True)
class Truth:
    """What a correct summary says about a scenario."""

    #: the class of the injected cause; ``none`` for a control
    cause: str
    culprit: Optional[int] = None
    phase: Optional[str] = None
    #: kinds that must be listed too; ``a|b``: either
    also: tuple[str, ...] = ()
    #: classes that may be loud without being an error (a true co-cause)
    allowed: tuple[str, ...] = ()
    #: classes that may be the primary instead of the cause (a true co-cause listed first)
    primary_any: tuple[str, ...] = ()
    #: periodic work: steps from one pause to the next
    period: Optional[float] = None
    #: work imbalance: the culprit's work per step over the others'
    ratio: Optional[float] = None
    #: words the cause's verdict must hold (a library's own message)
    words: tuple[str, ...] = ()
    #: how the run must end (``run.status``); None: any
    status: Optional[str] = "completed"


@dataclass(frozen=True)
class Scenario:
    name: str
    #: the injected cause, in words (the row of the matrix)
    cause: str
    args: tuple[str, ...]
    truth: Truth
    #: ``tune`` or ``held`` (see the module docstring)
    half: str = "tune"
    #: ``below``, ``near``, ``above`` its threshold, or None (a control, a failure)
    magnitude: Optional[str] = None
    #: in the CI subset (tests/verdicts)
    ci: bool = False
    #: what the machine needs: "cpu" (any), "cuda"
    needs: str = "cpu"
    nproc: int = 2
    #: nodes of the dev Slurm cluster (1: a plain `traceml run` on this machine)
    nodes: int = 1
    #: environment for the workers (beyond OMP_NUM_THREADS=1, which torchrun sets anyway)
    env: tuple[tuple[str, str], ...] = field(default=())
    #: extra flags of `traceml run`
    launch: tuple[str, ...] = ()
    #: busy loops started beside the run (CPU load from outside the job)
    busy: int = 0
    #: a node's egress limited to this rate for the run (tc tbf), ("node2", "100mbit")
    throttle: Optional[tuple[str, str]] = None

    @property
    def expect(self) -> str:
        return self.truth.cause

    def label(self) -> str:
        return self.name


def _s(name: str, cause: str, truth: Truth, *args: str, **kw: Any) -> Scenario:
    return Scenario(name=name, cause=cause, args=tuple(args), truth=truth, **kw)


NONE = Truth("none")
S = ("--steps", "100")
HANG = ("--hang-report-after=4", "--hang-timeout=20")
#: 2 busy loops beside the run: the load of a CI machine running two test streams
BUSY = 2
#: a gradient of ~4 MB (one 1024 x 1024 layer) and little compute: the all-reduce dominates on a
#: slow link
BIG_GRADIENT = ("--features", "1024", "--width", "1024", "--depth", "1", "--batch", "8", "--steps", "30")


def _three(name: str, cause: str, kind: str, levels: tuple[float, float, float], flag: str,
           args: tuple[str, ...], half: str, truth: dict[str, Any], ci_at: str = "", **kw: Any) -> list[Scenario]:
    """A cause at three magnitudes (below / near / above its threshold): the factor ``flag``
    takes each of ``levels``; below is a control (truth ``none``); ``ci_at``: the magnitude in
    the CI subset."""
    out = []
    for mag, level in zip(("below", "near", "above"), levels):
        fig = {k: (level if v == "level" else v) for k, v in truth.items()}
        t = NONE if mag == "below" else Truth(kind, **fig)
        out.append(_s(f"{name}-{mag}", f"{cause}, {flag} {level:g}", t, *args, flag, f"{level:g}",
                      half=half, magnitude=mag, ci=mag == ci_at, **kw))
    return out


SCENARIOS: tuple[Scenario, ...] = (
    # --- controls: nothing wrong, in the ways a healthy run varies --------------------------------
    _s("control", "nothing (batches made up front)", NONE, *S, ci=True),
    _s("control-loader", "nothing: a DataLoader with 2 workers, cheap records", NONE, *S,
       "--input", "loader", "--workers", "2", half="held"),
    _s("control-busy", "nothing, beside 2 busy loops (equal work under CPU load)", NONE, *S,
       busy=BUSY, ci=True),
    _s("control-busy-loader", "nothing: a DataLoader with 1 worker, beside 2 busy loops", NONE, *S,
       "--input", "loader", "--workers", "1", busy=BUSY, half="held"),
    _s("control-long", "nothing, 400 steps", NONE, "--steps", "400"),
    _s("control-tokens", "nothing: [512, 16, 32] batches (a sequence model)", NONE, *S,
       "--batch", "512", "--tokens", "16", half="held"),
    _s("control-accum", "nothing: 4 micro-batches per step under no_sync()", NONE, *S,
       "--accum", "4", "--batch", "2048"),
    _s("control-zero-code", "nothing, no trace_step (steps from the optimizer)", NONE, *S,
       "--zero-code", half="held"),

    # --- straggler: one rank *waits* longer (a slower device, a blocking call): a sleep ----------
    *_three("slow-forward", "rank 1 waits in forward", "straggler", (0.03, 0.2, 1.0), "--slow-factor",
            (*S, "--slow-rank", "1", "--slow-phase", "forward"), "tune", {"culprit": 1, "phase": "forward"}),
    *_three("slow-backward", "rank 0 waits in backward", "straggler", (0.03, 0.2, 1.0), "--slow-factor",
            (*S, "--slow-rank", "0", "--slow-phase", "backward"), "held", {"culprit": 0, "phase": "backward"}),
    _s("slow-optimizer", "rank 0 waits 1x compute in the optimizer", Truth("straggler", 0, "optimizer"),
       *S, "--slow-rank", "0", "--slow-phase", "optimizer", "--slow-factor", "1.0", magnitude="above"),
    _s("slow-nophase", "rank 1 waits 1x compute in no phase (inside the step)", Truth("straggler", 1, "nophase"),
       *S, "--slow-rank", "1", "--slow-phase", "nophase", "--slow-factor", "1.0", magnitude="above",
       half="held"),
    _s("slow-input", "rank 1's batches take 1x compute longer to arrive (its shard is slow)",
       Truth("straggler", 1, "outside"), *S, "--slow-rank", "1", "--slow-phase", "input",
       "--slow-factor", "1.0", magnitude="above", ci=True),
    _s("slow-input-loader", "rank 0's DataLoader batches take 0.8x compute longer to arrive",
       Truth("straggler", 0, "outside"), *S, "--input", "loader", "--workers", "1", "--slow-rank", "0",
       "--slow-phase", "input", "--slow-factor", "0.8", magnitude="above", half="held"),

    # --- work imbalance: one rank *computes* more (real work) -------------------------------------
    *_three("batch", "rank 1's batches are bigger (uneven sampler)", "work_imbalance", (1.04, 1.3, 1.6),
            "--batch-factor", (*S, "--batch-rank", "1"), "tune", {"culprit": 1, "ratio": "level"}),
    *_three("batch-loader", "rank 0's DataLoader batches are bigger", "work_imbalance", (1.04, 1.3, 1.8),
            "--batch-factor", (*S, "--input", "loader", "--workers", "1", "--batch-rank", "0"), "held",
            {"culprit": 0, "ratio": "level"}),
    _s("seq", "rank 1's sequences are 1.6x longer (same samples, more tokens)",
       Truth("work_imbalance", 1, ratio=1.6), *S, "--batch", "512", "--tokens", "16", "--seq-rank", "1",
       "--seq-factor", "1.6", magnitude="above"),
    _s("seq-loader", "rank 0's sequences are 2x longer, from a DataLoader",
       Truth("work_imbalance", 0, ratio=2.0), *S, "--batch", "512", "--tokens", "16", "--input", "loader",
       "--chunk", "64", "--workers", "1", "--seq-rank", "0", "--seq-factor", "2", magnitude="above", half="held"),
    *_three("burn-forward", "rank 1 computes more in forward (rank-only work)", "work_imbalance",
            (0.03, 0.2, 1.0), "--burn-factor", (*S, "--burn-rank", "1", "--burn-phase", "forward"), "tune",
            {"culprit": 1, "phase": "forward"}),
    _s("burn-outside-near", "rank 0 computes 0.25x more between steps (metrics on rank 0 only)",
       Truth("work_imbalance", 0, "outside"), *S, "--burn-rank", "0", "--burn-phase", "outside",
       "--burn-factor", "0.25", magnitude="near", half="held"),
    _s("burn-outside-above", "rank 0 computes 1x more between steps (metrics on rank 0 only)",
       Truth("work_imbalance", 0, "outside"), *S, "--burn-rank", "0", "--burn-phase", "outside",
       "--burn-factor", "1.0", magnitude="above", half="held"),
    _s("burn-nophase", "rank 1 computes 0.8x more inside the step, after the optimizer",
       Truth("work_imbalance", 1, "nophase"), *S, "--burn-rank", "1", "--burn-phase", "nophase",
       "--burn-factor", "0.8", magnitude="above", half="held"),
    _s("batch-declared", "rank 1's batches are 1.6x, and every rank declares its samples_per_step",
       Truth("work_imbalance", 1, ratio=1.6), *S, "--batch-rank", "1", "--batch-factor", "1.6", "--declare",
       magnitude="above", half="held"),

    # --- input: the run waits for data ------------------------------------------------------------
    # records of 1024 samples: the DataLoader's own work per batch (getting and collating its
    # records in the rank's process) is then below the threshold (with 256-sample records it alone
    # was 19 % of the step at load 6-12: input-bound, truly; with 1024, 7 %, and a wait of 0.04x
    # the compute made it 11 %), so "below" (0.01x) is a control
    *_three("loader-wait", "a DataLoader batch waits on storage, no workers", "input_bound", (0.01, 0.25, 2.0),
            "--item-factor", (*S, "--input", "loader", "--workers", "0", "--chunk", "1024"), "tune", {}),
    _s("loader-wait-1w", "a DataLoader batch waits 3x compute on storage, 1 worker", Truth("input_bound"),
       *S, "--input", "loader", "--workers", "1", "--item-factor", "3", magnitude="above", half="held"),
    _s("loader-wait-held-near", "a DataLoader batch waits 0.3x compute on storage, no workers", Truth("input_bound"),
       *S, "--input", "loader", "--workers", "0", "--item-factor", "0.3", magnitude="near", half="held"),
    _s("loader-wait-held-below", "a DataLoader batch waits 0.04x compute on storage, no workers", NONE,
       *S, "--input", "loader", "--workers", "0", "--item-factor", "0.04", magnitude="below", half="held"),
    _s("loader-cpu", "a DataLoader batch computes 2x compute to make, 1 worker", Truth("input_bound"),
       *S, "--input", "loader", "--workers", "1", "--item-cpu-factor", "2", magnitude="above", ci=True),
    _s("loader-cpu-0w", "a DataLoader batch computes 1x compute to make, no workers", Truth("input_bound"),
       *S, "--input", "loader", "--workers", "0", "--item-cpu-factor", "1", magnitude="above", half="held"),
    _s("get-batch-cpu", "get_batch() computes 1x compute before each step, no DataLoader", Truth("input_bound"),
       *S, "--input", "get_batch", "--fetch-cpu-factor", "1", magnitude="above"),
    _s("get-batch-wait", "get_batch() waits 0.5x compute before each step, no DataLoader", Truth("input_bound"),
       *S, "--input", "get_batch", "--fetch-factor", "0.5", magnitude="above", half="held"),

    # --- periodic work between steps ---------------------------------------------------------------
    *_three("eval10", "every 10 steps every rank evaluates", "periodic_work", (0.03, 0.2, 1.0), "--eval-factor",
            (*S, "--eval-every", "10"), "tune", {"period": 10}),
    *_three("eval20", "every 20 steps every rank evaluates", "periodic_work", (0.03, 0.25, 0.8), "--eval-factor",
            (*S, "--eval-every", "20"), "held", {"period": 20}),
    _s("eval-rank0", "every 10 steps rank 0 alone evaluates (1x the compute of 10 steps)",
       Truth("periodic_work", 0, period=10), *S, "--eval-every", "10", "--eval-rank", "0", "--eval-factor", "1",
       magnitude="above", ci=True),
    _s("eval-rank1", "every 20 steps rank 1 alone evaluates (0.8x the compute of 20 steps)",
       Truth("periodic_work", 1, period=20), "--steps", "120", "--eval-every", "20", "--eval-rank", "1",
       "--eval-factor", "0.8", magnitude="above", half="held"),
    _s("eval20-busy", "every 20 steps every rank evaluates, beside 2 busy loops (jitter)",
       Truth("periodic_work", period=20), "--steps", "120", "--eval-every", "20", "--eval-factor", "0.5",
       busy=BUSY, magnitude="above"),
    _s("eval-rank0-busy", "every 20 steps rank 0 alone evaluates, beside 2 busy loops",
       Truth("periodic_work", 0, period=20), "--steps", "120", "--eval-every", "20", "--eval-rank", "0",
       "--eval-factor", "0.8", busy=BUSY, magnitude="above", half="held"),
    _s("checkpoint", "every 10 steps every rank waits 1x the compute of 10 steps (a save to slow storage)",
       Truth("periodic_work", period=10), *S, "--every", "10", "--every-factor", "1", magnitude="above"),

    # --- memory creep: real tensors kept --------------------------------------------------------------
    *_three("creep", "rank 1 keeps KiB per step (100 steps)", "memory_creep", (150, 900, 4096), "--leak-kib",
            (*S, "--leak-rank", "1"), "tune", {"culprit": 1}, ci_at="above"),
    *_three("creep-250", "rank 0 keeps KiB per step (250 steps)", "memory_creep", (200, 400, 2048), "--leak-kib",
            ("--steps", "250", "--leak-rank", "0"), "held", {"culprit": 0}),
    _s("plateau", "rank 1 keeps 2 MiB per step for 60 steps, then stops (250 steps)", NONE,
       "--steps", "250", "--leak-rank", "1", "--leak-kib", "2048", "--leak-until", "60", ci=True),
    _s("plateau-early", "rank 0 keeps 4 MiB per step for 30 steps, then stops (150 steps)", NONE,
       "--steps", "150", "--leak-rank", "0", "--leak-kib", "4096", "--leak-until", "30", half="held"),
    _s("creep-midrun", "rank 1 keeps 2 MiB per step from step 50 (150 steps)", Truth("memory_creep", 1),
       "--steps", "150", "--leak-rank", "1", "--leak-kib", "2048", "--leak-from", "50", magnitude="above",
       half="held"),
    _s("creep-slows", "rank 1 keeps 2 MiB per step and scans it (slows its rank)",
       Truth("memory_creep", 1, also=("straggler|work_imbalance",)), *S, "--leak-rank", "1", "--leak-kib",
       "2048", "--leak-touch", magnitude="above"),

    # --- CPU threads, and load from outside --------------------------------------------------------------
    _s("oversubscribed", "4 torch threads per rank, 2 ranks, 2 cores", Truth("cpu_oversubscribed"),
       *S, "--threads", "4", magnitude="above", ci=True),
    _s("oversubscribed-3ranks", "3 ranks of 1 thread on 2 cores", Truth("cpu_oversubscribed"), *S,
       nproc=3, magnitude="near", half="held"),
    _s("batch-busy", "rank 1's batches are 1.6x, beside 2 busy loops", Truth("work_imbalance", 1, ratio=1.6),
       *S, "--batch-rank", "1", "--batch-factor", "1.6", busy=BUSY, magnitude="above", ci=True),
    _s("burn-busy", "rank 1 computes 0.5x more in forward, beside 2 busy loops",
       Truth("work_imbalance", 1, "forward"), *S, "--burn-rank", "1", "--burn-phase", "forward",
       "--burn-factor", "0.5", busy=BUSY, magnitude="above", half="held"),
    _s("slow-busy", "rank 0 waits 1x compute in forward, beside 2 busy loops", Truth("straggler", 0, "forward"),
       *S, "--slow-rank", "0", "--slow-phase", "forward", "--slow-factor", "1.0", busy=BUSY, magnitude="above",
       half="held"),

    # --- causes that start mid-run ------------------------------------------------------------------
    _s("slow-midrun", "rank 1 waits 1x compute in forward from step 50 (150 steps)",
       Truth("straggler", 1, "forward"), "--steps", "150", "--slow-rank", "1", "--slow-phase", "forward",
       "--slow-factor", "1.0", "--cause-from", "50", magnitude="above"),
    _s("burn-midrun", "rank 0 computes 1x more in backward from step 60 (150 steps)",
       Truth("work_imbalance", 0, "backward"), "--steps", "150", "--burn-rank", "0", "--burn-phase", "backward",
       "--burn-factor", "1.0", "--cause-from", "60", magnitude="above", half="held"),

    # --- 4 ranks (on 2 cores: oversubscribed, truly) ------------------------------------------------
    _s("ranks4", "4 ranks of 1 thread on 2 cores, nothing else", Truth("cpu_oversubscribed"), *S, nproc=4),
    _s("ranks4-slow", "4 ranks; rank 2 waits 1x compute in backward",
       Truth("straggler", 2, "backward", allowed=("cpu_oversubscribed",), primary_any=("cpu_oversubscribed",)),
       *S, "--slow-rank", "2", "--slow-phase", "backward", "--slow-factor", "1.0", nproc=4, magnitude="above"),
    _s("ranks4-batch", "4 ranks; rank 3's batches are 1.6x",
       Truth("work_imbalance", 3, ratio=1.6, allowed=("cpu_oversubscribed",), primary_any=("cpu_oversubscribed",)),
       *S, "--batch-rank", "3", "--batch-factor", "1.6", nproc=4, magnitude="above", half="held"),
    _s("ranks4-eval", "4 ranks; every 20 steps rank 1 alone evaluates",
       Truth("periodic_work", 1, period=20, allowed=("cpu_oversubscribed",), primary_any=("cpu_oversubscribed",)),
       "--steps", "120", "--eval-every", "20", "--eval-rank", "1", "--eval-factor", "0.8", nproc=4,
       magnitude="above", half="held"),

    # --- zero-code scripts (no trace_step) and gradient accumulation --------------------------------
    _s("zero-code-slow", "no trace_step; rank 1 waits 1x compute in forward", Truth("straggler", 1), *S,
       "--zero-code", "--slow-rank", "1", "--slow-phase", "forward", "--slow-factor", "1.0", magnitude="above"),
    _s("zero-code-loader", "no trace_step; a DataLoader batch waits 2x compute, no workers",
       Truth("input_bound"), *S, "--zero-code", "--input", "loader", "--workers", "0", "--item-factor", "2",
       magnitude="above", half="held"),
    _s("accum-slow", "4 micro-batches under no_sync(); rank 1 waits 1x compute in backward",
       Truth("straggler", 1, "backward"), *S, "--accum", "4", "--batch", "2048", "--slow-rank", "1",
       "--slow-phase", "backward", "--slow-factor", "1.0", magnitude="above"),
    _s("accum-batch", "4 micro-batches under no_sync(); rank 0's batches are 1.6x",
       Truth("work_imbalance", 0, ratio=1.6), *S, "--accum", "4", "--batch", "2048", "--batch-rank", "0",
       "--batch-factor", "1.6", magnitude="above", half="held"),

    # --- failures -------------------------------------------------------------------------------------
    _s("fail-raise", "rank 1 raises RuntimeError at step 40", Truth("run_failed", 1, status="failed"), *S,
       "--fail-mode", "raise", "--fail-rank", "1", "--fail-step", "40"),
    _s("fail-kill", "rank 1 is killed by SIGKILL at step 40", Truth("run_failed", 1, status="failed"), *S,
       "--fail-mode", "kill", "--fail-rank", "1", "--fail-step", "40"),
    _s("fail-exit", "rank 0 runs out of data and ends cleanly at step 60; rank 1 loses its peer",
       Truth("run_failed", 0, status="failed"), *S, "--fail-mode", "exit", "--fail-rank", "0",
       "--fail-step", "60", half="held"),
    _s("fail-mismatch", "rank 0 calls one extra all_reduce at step 40 (a collective mismatch)",
       Truth("run_failed", 0, words=("mismatch",), status="failed"), *S, "--fail-mode", "mismatch",
       "--fail-rank", "0", "--fail-step", "40", half="held"),
    _s("did-not-start", "a typo in an argument (argparse exits before the first step)",
       Truth("did_not_start", status="failed"), "--steps", "ten"),
    _s("did-not-start-flag", "an unknown flag (argparse exits before the first step)",
       Truth("did_not_start", status="failed"), "--no-such-flag", half="held"),

    # --- hangs ----------------------------------------------------------------------------------------
    _s("hang", "rank 1 blocks forever at step 30, outside any collective", Truth("hang", 1, status=None),
       "--steps", "1000", "--hang-rank", "1", "--hang-step", "30", launch=HANG),
    _s("hang-rank0", "rank 0 blocks forever at step 40, outside any collective", Truth("hang", 0, status=None),
       "--steps", "1000", "--hang-rank", "0", "--hang-step", "40", launch=HANG, half="held"),

    # --- 2 nodes of the dev Slurm cluster (one rank per node) ------------------------------------------
    _s("nodes2-control", "2 nodes, nothing wrong", NONE, *S, nproc=1, nodes=2),
    _s("nodes2-batch", "2 nodes; rank 1 (on the second node) gets 1.6x batches: a rank-following cause",
       Truth("work_imbalance", 1, ratio=1.6), *S, "--batch-rank", "1", "--batch-factor", "1.6", nproc=1, nodes=2,
       magnitude="above", half="held"),
    _s("nodes2-slow-link", "2 nodes; node2's egress limited to 100 Mbit/s, a 4 MB gradient per step",
       Truth("communication_bound"), *BIG_GRADIENT, nproc=1, nodes=2, throttle=("node2", "100mbit"),
       magnitude="above"),
    _s("nodes2-slow-link-held", "2 nodes; node1's egress limited to 100 Mbit/s, a 2.4 MB gradient per step",
       Truth("communication_bound"), "--features", "768", "--width", "768", "--depth", "1", "--batch", "8",
       "--steps", "30", nproc=1, nodes=2, throttle=("node1", "100mbit"), magnitude="above", half="held"),

    # --- held2: a second held-out set (see the module docstring) ------------------------------------
    _s("h2-control-busy3", "nothing, beside 3 busy loops", NONE, *S, busy=3, half="held2"),
    _s("h2-control-loader", "nothing: a DataLoader of 1024-sample records, 2 workers", NONE, *S,
       "--input", "loader", "--workers", "2", "--chunk", "1024", half="held2"),
    _s("h2-control-loader-busy", "nothing: a DataLoader of 1024-sample records, no workers, beside 2 busy loops",
       NONE, *S, "--input", "loader", "--workers", "0", "--chunk", "1024", busy=BUSY, half="held2"),
    _s("h2-slow-backward-busy", "rank 1 waits 1x compute in backward, beside 2 busy loops",
       Truth("straggler", 1, "backward"), *S, "--slow-rank", "1", "--slow-phase", "backward", "--slow-factor", "1.0",
       busy=BUSY, magnitude="above", half="held2"),
    _s("h2-slow-optimizer-busy", "rank 0 waits 0.8x compute in the optimizer, beside 2 busy loops",
       Truth("straggler", 0, "optimizer"), *S, "--slow-rank", "0", "--slow-phase", "optimizer", "--slow-factor",
       "0.8", busy=BUSY, magnitude="above", half="held2"),
    _s("h2-slow-forward-near", "rank 0 waits 0.3x compute in forward", Truth("straggler", 0, "forward"), *S,
       "--slow-rank", "0", "--slow-phase", "forward", "--slow-factor", "0.3", magnitude="near", half="held2"),
    _s("h2-burn-backward-busy", "rank 0 computes 0.8x more in backward, beside 2 busy loops",
       Truth("work_imbalance", 0, "backward"), *S, "--burn-rank", "0", "--burn-phase", "backward", "--burn-factor",
       "0.8", busy=BUSY, magnitude="above", half="held2"),
    _s("h2-batch-loader", "rank 1's DataLoader batches (1024-sample records) are 1.5x",
       Truth("work_imbalance", 1, ratio=1.5), *S, "--input", "loader", "--workers", "1", "--chunk", "1024",
       "--batch-rank", "1", "--batch-factor", "1.5", magnitude="above", half="held2"),
    _s("h2-get-batch-busy", "get_batch() waits 0.8x compute before each step, beside 2 busy loops",
       Truth("input_bound"), *S, "--input", "get_batch", "--fetch-factor", "0.8", busy=BUSY, magnitude="above",
       half="held2"),
    _s("h2-eval15-rank0-busy", "every 15 steps rank 0 alone evaluates (0.6x), beside 2 busy loops",
       Truth("periodic_work", 0, period=15), "--steps", "120", "--eval-every", "15", "--eval-rank", "0",
       "--eval-factor", "0.6", busy=BUSY, magnitude="above", half="held2"),
    _s("h2-creep-busy", "rank 1 keeps 3 MiB per step, beside 2 busy loops", Truth("memory_creep", 1), *S,
       "--leak-rank", "1", "--leak-kib", "3072", busy=BUSY, magnitude="above", half="held2"),
    _s("h2-ranks3-slow", "3 ranks; rank 2 waits 1x compute in forward",
       Truth("straggler", 2, "forward", allowed=("cpu_oversubscribed",), primary_any=("cpu_oversubscribed",)),
       *S, "--slow-rank", "2", "--slow-phase", "forward", "--slow-factor", "1.0", nproc=3, magnitude="above",
       half="held2"),
    _s("h2-fail-raise-busy", "rank 0 raises at step 30, beside 2 busy loops", Truth("run_failed", 0, status="failed"),
       *S, "--fail-mode", "raise", "--fail-rank", "0", "--fail-step", "30", busy=BUSY, half="held2"),
    _s("h2-accum-slow-busy", "4 micro-batches under no_sync(); rank 0 waits 1x compute in forward, beside 2 busy loops",
       Truth("straggler", 0, "forward"), *S, "--accum", "4", "--batch", "2048", "--slow-rank", "0", "--slow-phase",
       "forward", "--slow-factor", "1.0", busy=BUSY, magnitude="above", half="held2"),

    # --- CUDA only ------------------------------------------------------------------------------------
    _s("host-sync", "loss.item() every step (CUDA)", Truth("host_sync"), *S, "--sync", needs="cuda"),
)

BY_NAME = {s.name: s for s in SCENARIOS}
assert len(BY_NAME) == len(SCENARIOS), "scenario names must be unique"


def ci_subset() -> list[Scenario]:
    return [s for s in SCENARIOS if s.ci]


def shortened(sc: Scenario, steps: int) -> Scenario:
    """The scenario with at most ``steps`` steps (the CI subset's budget), its other
    step counts (a plateau's end, a cause's start) scaled with it."""
    args = list(sc.args)
    if "--steps" not in args:
        return sc
    i = args.index("--steps")
    old = int(args[i + 1])
    if old <= steps:
        return sc
    args[i + 1] = str(steps)
    for flag in ("--leak-until", "--leak-from", "--cause-from"):
        if flag in args:
            j = args.index(flag)
            args[j + 1] = str(max(1, int(args[j + 1]) * steps // old))
    return replace(sc, args=tuple(args))


# --- what a run got, and its score ------------------------------------------------------------------
@dataclass
class Seen:
    """One verdict of a run, as scored."""

    kind: str
    severity: str
    rank: Optional[int]
    node: Optional[int]
    phase: Optional[str]
    why: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def cls(self) -> str:
        return class_of(self.kind)

    @property
    def loud(self) -> bool:
        return self.severity in LOUD


@dataclass
class Outcome:
    """What one run of a scenario got (from its ``final_summary.json``)."""

    scenario: str
    mode: str
    run: int
    verdicts: list[Seen]
    status: str
    wall_s: float
    load: tuple[float, float]
    error: str = ""

    @property
    def primary(self) -> Optional[Seen]:
        return self.verdicts[0] if self.verdicts else None

    @property
    def kind(self) -> str:
        return self.primary.kind if self.primary else "?"

    @property
    def severity(self) -> str:
        return self.primary.severity if self.primary else "?"

    @property
    def culprit(self) -> Optional[int]:
        return self.primary.rank if self.primary else None

    @property
    def phase(self) -> Optional[str]:
        return self.primary.phase if self.primary else None

    @property
    def cls(self) -> str:
        return class_of(self.kind)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Outcome":
        return cls(d["scenario"], d["mode"], d["run"], [Seen(**v) for v in d["verdicts"]], d["status"],
                   d["wall_s"], tuple(d["load"]), d.get("error", ""))  # type: ignore[arg-type]


#: evidence keys kept in an outcome (the figures the scoring reads; the rest stays in the run's
#: final_summary.json)
KEPT_EVIDENCE = ("period_steps", "ratio", "samples_ratio", "elements_ratio", "cpu_ratio", "excused_rank",
                 "excess_ms", "phase", "explained_by", "source", "pacing_rank", "rank", "metric")


def _seen(v: dict[str, Any]) -> Seen:
    ev = v.get("evidence") or {}
    culprit = v.get("culprit") or {}
    return Seen(kind=v.get("kind") or "?", severity=v.get("severity") or "?", rank=culprit.get("rank"),
                node=culprit.get("node"), phase=ev.get("phase") if isinstance(ev.get("phase"), str) else None,
                why=v.get("why") or "", evidence={k: ev[k] for k in KEPT_EVIDENCE if k in ev})


def outcome_from_summary(summary: dict[str, Any], scenario: str, mode: str, run: int, wall_s: float,
                         load: tuple[float, float]) -> Outcome:
    """An outcome from a run's summary (a partial summary, which has no verdicts, too)."""
    found = [summary["verdict"]] if summary.get("verdict") else []
    verdicts = [_seen(v) for v in found + list(summary.get("other_verdicts") or [])]
    status = (summary.get("run") or {}).get("status") or "?"
    if summary.get("partial"):
        status += " (partial summary)"
    return Outcome(scenario=scenario, mode=mode, run=run, verdicts=verdicts, status=status,
                   wall_s=wall_s, load=load)


@dataclass
class Score:
    """One run against its truth: the classes found right (``tp``), expected and not found or
    found wrong (``fn``), loud and false (``fp``, by class), allowed co-causes that were loud
    (``allowed``), and why each error is one."""

    tp: list[str] = field(default_factory=list)
    fn: list[str] = field(default_factory=list)
    fp: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def right(self) -> bool:
        return not self.errors

    @property
    def verdicts_right(self) -> int:
        return len(self.tp) + len(self.allowed)

    @property
    def verdicts_scored(self) -> int:
        return len(self.tp) + len(self.fn) + len(self.fp) + len(self.allowed)


def _figures(t: Truth, v: Seen) -> list[str]:
    """Where a verdict's figures contradict the truth."""
    out = []
    if t.culprit is not None and v.rank != t.culprit:
        out.append(f"rank {v.rank}, the cause is on rank {t.culprit}")
    if t.phase is not None and v.cls in ("straggler", "work_imbalance") and v.phase != t.phase:
        out.append(f"phase {v.phase}, the cause is in {t.phase}")
    if t.period is not None and v.cls == "periodic_work":
        got = v.evidence.get("period_steps")
        if got is None or abs(got - t.period) > PERIOD_TOLERANCE * t.period:
            out.append(f"every ~{got} steps, the truth is every {t.period:g}")
    if t.ratio is not None and v.cls == "work_imbalance":
        got = v.evidence.get("ratio")
        if got is None or abs(got - t.ratio) > RATIO_TOLERANCE * t.ratio:
            out.append(f"work ratio {got}, the truth is {t.ratio:g}")
    for w in t.words:
        if w.lower() not in v.why.lower():
            out.append(f"does not say {w!r}")
    return out


def score(sc: Scenario, o: Outcome) -> Score:
    """Every verdict of one run against the scenario's truth (see the module docstring)."""
    t, s = sc.truth, Score()
    if o.error:
        s.fn.append(t.cause)
        s.errors.append(o.error)
        return s
    if t.status is not None and o.status.split(" (")[0] != t.status:
        s.errors.append(f"run {o.status}, expected {t.status}")
    verdicts = o.verdicts
    if t.cause == "none":
        loud = [v for v in verdicts if v.loud or v.cls != "none"]
        for v in loud:
            s.fp.append(v.cls)
            s.errors.append(f"{v.kind} ({v.severity}) on a control")
        if loud:
            s.fn.append("none")
        else:
            s.tp.append("none")
        return s
    expected = {t.cause}
    # the cause: the first verdict of its class (primary unless a co-cause may come first)
    found = next((v for v in verdicts if v.cls == t.cause), None)
    if found is None:
        s.fn.append(t.cause)
        s.errors.append(f"no {t.cause} (primary {o.kind} {o.severity})")
    else:
        bad = _figures(t, found)
        prim = verdicts[0]
        if prim is not found and prim.cls not in t.primary_any:
            bad.append(f"not the primary ({prim.kind} {prim.severity} comes first)")
        if bad:
            s.fn.append(t.cause)
            s.errors.extend(f"{found.kind}: {b}" for b in bad)
        else:
            s.tp.append(t.cause)
    for also in t.also:
        alts = also.split("|")
        expected.update(alts)
        if any(v.kind in alts or v.cls in alts for v in verdicts):
            s.tp.append(alts[0])
        else:
            s.fn.append(alts[0])
            s.errors.append(f"no {also} among the verdicts")
    for v in verdicts:
        if v is found:
            continue
        consequence = (found is not None and v.evidence.get("explained_by") == found.kind
                       and (v.rank is None or v.rank == found.rank))
        if v.loud and v.cls not in expected:
            if v.cls in t.allowed or consequence:
                s.allowed.append(v.cls)
            else:
                s.fp.append(v.cls)
                s.errors.append(f"false secondary {v.kind} ({v.severity})")
        elif not v.loud and v.kind == "cpu_contention" and t.culprit is not None \
                and v.evidence.get("excused_rank") == t.culprit and not consequence:
            s.fp.append(v.cls)
            s.errors.append(f"cpu_contention excuses rank {t.culprit}, the culprit")
    return s


def problems(sc: Scenario, o: Outcome) -> list[str]:
    """Why an outcome is wrong for its scenario (empty: right)."""
    return score(sc, o).errors
