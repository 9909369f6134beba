"""Every threshold behind a verdict, in one place, each with the reason for its value.

A verdict needs BOTH a relative condition (a fraction of the step) AND an absolute floor (in
milliseconds or bytes): a 0.4 ms input wait in a 1.6 ms toy step is 25 % of the step but not worth
an engineer's afternoon, and any fraction of a tiny number is noise from timers and the scheduler.
Severities: ``critical`` (fix this first), ``warning`` (worth a look), ``info`` (a description of
where the time goes, not a problem).

Changing a value here changes the verdicts of every run; say why in the comment.
"""

from __future__ import annotations

# the warm-up steps left out of the "steady" means: split off where the statistics are computed
# (its reason is there); re-exported, as every verdict reads it here
from ..statistics.window import WARMUP_STEPS  # noqa: F401

MiB = 1024 * 1024

# --- evidence ------------------------------------------------------------------------------------
#: With fewer steady steps per rank than this, no bottleneck verdict is given: a mean of a
#: handful of steps is dominated by one-off hiccups (a checkpoint save, a GC pause).
MIN_STEPS = 20

# --- input bound ---------------------------------------------------------------------------------
#: Waiting for the next batch for 10 % of each step is about where raising DataLoader workers
#: usually pays back (10 % more throughput for a config change); below that it is rarely the
#: best next step.
INPUT_FRACTION_WARN = 0.10
#: At 30 % a third of the GPU time is idle waiting for data: the single biggest lever.
INPUT_FRACTION_CRIT = 0.30
#: Below 1 ms of wait per step the "input" time is mostly the iterator's own Python overhead
#: and timer granularity, which more workers cannot remove (the 0.4 ms in a 1.6 ms toy step).
INPUT_FLOOR_MS = 1.0
#: A critical input verdict also needs 5 ms per step: enough for a worker/prefetch change to be
#: measurable at once in the step time.
INPUT_CRIT_FLOOR_MS = 5.0

# --- straggler -----------------------------------------------------------------------------------
#: A rank whose own work per step (step minus backward, where DDP waits for the others, plus time
#: outside the traced step) exceeds the median rank's by 10 % of the median step slows every rank
#: by that much at each synchronisation; below 10 % it is within ordinary rank-to-rank jitter
#: (data shards of different sizes, NUMA placement).
STRAGGLER_EXCESS_WARN = 0.10
#: At 25 % of a step every rank loses a quarter of its time waiting for one rank.
STRAGGLER_EXCESS_CRIT = 0.25
#: ...and at least 2 ms per step: below that the difference is scheduler and timer noise on
#: small CPU runs.
STRAGGLER_FLOOR_MS = 2.0
#: A straggler is slower through the run, not in a stretch of it: the excess judged is the one
#: the rank shows in at least half of the run's stretches of steps (the median of its excess per
#: stretch over the other ranks' median). A rank that another process starved of its core for a
#: while, or that was paused, has a large mean excess but none in most stretches; one with a
#: slower GPU, a slower data shard or extra work shows it in every stretch. The median, not a
#: lower quantile: on a machine shared with other jobs, two ranks' stretches differ by tens of
#: milliseconds either way, and a lower quantile would hide a real straggler under that noise.
STRAGGLER_PERSISTENT_QUANTILE = 0.5
#: ...and beyond the run's own noise: the mean excess over the stretches less this many standard
#: errors (the stretches' robust scatter about their trend), about 97.5 % one-sided confidence.
#: On a machine shared with other jobs two ranks' stretches differ by tens of milliseconds either
#: way, and persist for a while; an excess that noise can explain is not a straggler.
STRAGGLER_CONFIDENCE_SE = 2.0
#: A stretch is at least this many steps (whole windows of the run's series).
STRAGGLER_STRETCH_STEPS = 8
#: ...judged on at least this many stretches of steady steps; with fewer, the mean excess is
#: used, the verdict says that persistence was not checked (and how many it needs), and it is
#: information only: on a loaded machine 24 steady steps of two ranks differ by 27 % of a step
#: by chance (a hang scenario's first 30 steps at load 13 read as a critical straggler).
STRAGGLER_MIN_WINDOWS = 4
#: "mostly in <phase>" only when that phase holds at least half of the rank's excess; otherwise
#: the excess is "spread over" every phase holding at least a fifth of it.
ATTRIBUTION_MOSTLY = 0.5
ATTRIBUTION_LIST = 0.2
#: A pause is not a straggler (verdicts.one_pause): one wait of the other ranks longer than 50
#: median steps is one event (a rank stopped, a debugger, a save on one rank), not slowness at
#: every step; it is taken out of that rank's excess before the rest is judged. 50 steps: a
#: straggler's own longest step rarely exceeds a few of its slow steps, while the pauses this is
#: for last seconds to minutes.
PAUSE_MIN_STEPS = 50.0

# --- work imbalance -----------------------------------------------------------------------------
#: The slowest rank does more work when its batches (samples, elements or tokens per step,
#: measured on sampled steps, or declared with ``traceml.declare_work``) are at least 5 % more than
#: the other ranks' median: a batch's size is an exact count, so below that only variable-length
#: batches differ, by chance (the mean of ~50 sampled steps of lengths that vary +-30 % moves by
#: about 4 %).
WORK_RATIO_MIN = 1.05
#: ...and that extra work accounts for at least half of its judged excess (its own time scaled by
#: the ratio): a rank whose batches are 5 % bigger but that is 40 % slower has another cause.
#: Half, as for a wait for a core (CAUSE_SHARE): then the work is most of what makes it slower.
WORK_EXPLAINS = 0.5
#: Without a difference in batches, a rank does more work *for the same code* when its training
#: thread's CPU time per step exceeds the other ranks' median by at least half its judged excess
#: (CAUSE_SHARE) and by 10 %: on one node every rank's core is the same, so more CPU time for the
#: same batch is work only that rank does (metrics, logging, an extra loss). CPU runs only: on a
#: GPU the training thread's CPU time is kernel launches and waiting, not the work.
WORK_CPU_RATIO_MIN = 1.10

# --- memory creep --------------------------------------------------------------------------------
#: The early window starts after this fraction of the run (allocator caches and optimizer state
#: grow during the first steps, which is not a leak).
MEM_SKIP_FRACTION = 0.10
#: Peak memory 10 % higher at the end of the run than early on, and still rising through the
#: middle, is the signature of a leak (tensors kept in a list, a growing cache); fragmentation
#: alone rarely adds more than a few percent.
MEM_CREEP_GROWTH_WARN = 0.10
#: 30 % growth: a long run will likely hit OOM.
MEM_CREEP_GROWTH_CRIT = 0.30
#: ...and at least 64 MiB, so allocator rounding and a few cached blocks on a small model are not
#: called a leak.
MEM_CREEP_FLOOR_BYTES = 64 * MiB
#: The trend (a robust Theil-Sen line, report/trend.py) needs this many windows of steps with a
#: memory sample after the skipped start: four points give six pairwise slopes, enough for a
#: median that one outlier cannot move; fewer, and the summary says so and how many it needs.
MEM_MIN_WINDOWS = 4
#: Still rising at the end: the slope over the last half of the windows is at least half the
#: whole run's. A leak keeps its pace (late slope ~ the whole run's); a plateau (memory that grew
#: early, then stopped: caches filling, optimizer state) has a late slope near zero.
MEM_STILL_RISING = 0.5

# --- periodic work between steps ----------------------------------------------------------------
#: Time between steps is *periodic* (an evaluation, a checkpoint, logging every k steps) when it
#: comes in pauses (report/pauses.py): gaps between steps over 3x the typical (median) gap, and
#: over it by at least 1 ms, hold at least 60 % of the time between steps (their time above the
#: typical gap), there are at least 2 of them and they are at most half of the gaps. Otherwise it
#: is spread over every step (a get_batch()).
PERIODIC_BURST_RATIO = 3.0
PERIODIC_BURST_FLOOR_MS = 1.0
PERIODIC_BURST_SHARE = 0.6
PERIODIC_MIN_BURSTS = 2
#: ...needs this many steady gaps to see a pattern at all.
PERIODIC_MIN_GAPS = 20
#: A pause is also longer than the scheduler's jitter *for that rank*: its typical gap plus the
#: spread of its own steps (p90 - p50 of its step time). On a loaded machine a thread loses its
#: core for milliseconds at random, in a step or between two; the same jitter that widens its steps
#: lengthens its gaps, so a gap is a pause only beyond it (a 0.18 ms typical gap made 1.2 ms of
#: jitter a "pause" at load 3-9: "every ~8 steps" for an evaluation every 20). Once, not twice: a
#: loaded machine's steps are heavy-tailed (p90 twice the median), and twice the spread cut off
#: an evaluation of two steps' compute every 10 steps (0 of its 9 pauses seen on one rank).
PERIODIC_JITTER_SPREADS = 1.0
#: ...and holds its part of the pauses' time: at least a quarter of the mean pause. Periodic work is
#: long pauses (an evaluation, a save); jitter that passes the cut is short ones, which a mean
#: pause length then leaves out (twice: the mean without them is longer), so neither the count nor
#: the period ("every N steps") counts them. A quarter keeps an evaluation every 20 steps beside a
#: checkpoint 10 times as long every 100.
PERIODIC_OF_MEAN_PAUSE = 0.25
#: Periodic work is one rank's when fewer than half of the ranks pause (an evaluation or logging on
#: rank 0 only: the others wait for it in the next step's all-reduce, not between steps); else the
#: run's.
PERIODIC_RANKS_SHARE = 0.5
#: Severity, as for input: the share of the wall clock per step the bursts take, and an absolute
#: floor in ms per step on average.
PERIODIC_FRACTION_WARN = 0.10
PERIODIC_FRACTION_CRIT = 0.30
PERIODIC_FLOOR_MS = 1.0
PERIODIC_CRIT_FLOOR_MS = 5.0

# --- CPU threads -----------------------------------------------------------------------------------
#: A CPU run is oversubscribed when the ranks of a node ask, together, for more torch intra-op
#: threads than the cores they may run on (their affinity masks' union): more than one thread per
#: core, some always wait; OpenMP's threads spin while they wait, which makes it worse than the
#: ratio suggests. Critical from two threads per core.
CPU_OVERSUBSCRIBED = 1.0
CPU_OVERSUBSCRIBED_CRIT = 2.0
#: Waiting for a core a tenth of the wall clock per step (the training thread runnable, not
#: running) is worth a note: the step times include it. Information only, never a warning: it
#: comes from outside the job's work (other processes, or the job's own threads, which the
#: oversubscription verdict judges), and a rank's excess it explains is not a straggler.
CPU_CONTENTION_NOTE = 0.10
#: A rank's wait for a core is a cause of its excess only where its wait *per CPU second* exceeds
#: the other ranks' median (rules/slowest.py: the wait beyond what its own CPU time costs at their
#: rate): every rank on a busy CPU waits in proportion to the CPU time it asks for, so a rank that
#: computes 1.3x the others' waits 1.3x as long, at the same rate: that wait is part of its work.
#: Likewise a core that runs slower (another process on its physical core, a lower clock) makes the
#: same work take more CPU time in *every* phase alike, where more work of its own adds CPU time
#: where that work is: a rank's extra CPU time is its core's, not its work, when the phase it grew
#: least in grew at least half as much as the whole (CPU_UNIFORM).
CPU_UNIFORM = 0.5
#: Whose processes held the cores: the job's own when its ranks (their threads and DataLoader
#: workers) used at least 90 % of the cores they may run on, others' when the ranks left at least
#: a quarter of them (the node's CPUs busy beside them); otherwise not said.
CONTENTION_OWN_SHARE = 0.9
CONTENTION_OTHERS_SHARE = 0.25
#: A straggler comes from its node's oversubscription when at least this share of its excess was
#: its extra wait for a core (measured: sdk/threads.py); half, because then the wait is most of
#: what makes it slower.
CAUSE_SHARE = 0.5
#: ...or, where each rank computes with more than one torch thread, when its excess is in the
#: phases torch runs on those threads: only the training thread's wait for a core is measured,
#: and an operator split over threads that wait for a core takes longer on the training thread
#: without it waiting at all (2 ranks x 4 threads on 2 cores: a rank falls behind in forward, its
#: training thread waiting no more than the others').
INTRA_OP_PHASES = ("forward", "backward", "optimizer")

# --- GPU utilisation -----------------------------------------------------------------------------
#: NVML utilisation is the fraction of time any kernel ran; under 50 % on average the GPUs are idle
#: half the time, which is worth explaining even when no phase stands out.
GPU_UTIL_WARN_PCT = 50.0
#: Under 25 % the job uses a quarter of what it reserved.
GPU_UTIL_CRIT_PCT = 25.0
#: At least this many samples (at ~1 Hz) so start-up and shutdown do not decide the average.
GPU_MIN_SAMPLES = 10

# --- communication bound -------------------------------------------------------------------------
#: Judged on the rank that waits *least* for communication (exposed time: waiting after its own
#: compute is done), so a straggler, for which every other rank waits inside the all-reduce, is
#: not mistaken for a slow network: the last rank to arrive still waits for the bytes to move.
#: 15 % of every step: DDP hides most of the all-reduce behind backward when the network keeps
#: up, so a wait this size means it does not, and the usual fixes (the right interface, bucket
#: size, gradient accumulation) are configuration changes that win most of it back.
COMM_FRACTION_WARN = 0.15
#: 35 %: a third of the step idle on the network, more than most model-side work could win.
COMM_FRACTION_CRIT = 0.35
#: ...and at least 1 ms per step: below that the wait is the fixed latency of a few small
#: all-reduces (tens to hundreds of microseconds each over TCP) plus timer noise.
COMM_FLOOR_MS = 1.0
#: A critical communication verdict also needs 5 ms per step.
COMM_CRIT_FLOOR_MS = 5.0
#: The wait judged is each rank's 10th percentile of its per-step wait, the least over ranks: in
#: a step, the last rank to arrive at the all-reduce waits only for the transfer itself, the
#: others also for it. Ranks that take turns at arriving last (jitter from a busy CPU, no slow
#: link) each wait little in a good share of steps, so their low percentile is small however
#: long their mean wait; on a slow link every step waits for the bytes to move, so even the 10th
#: percentile is long. (With more than ~5 ranks taking turns, each is last in under a tenth of
#: the steps, and the figure includes some waiting for peers.)
COMM_WAIT_QUANTILE = 0.10
#: Overlap below 30 % (exposed wait >= 70 % of the time collectives are in flight): the
#: all-reduce mostly runs after backward instead of under it, so bucket size and ordering
#: (bucket_cap_mb, static_graph) are worth a look besides the network itself.
COMM_LOW_OVERLAP = 0.30

#: Collectives of under 1 MB each are latency-bound: over TCP at 1-10 GB/s a megabyte moves in
#: 0.1-1 ms, the same order as one collective's fixed cost (tens to hundreds of microseconds), so
#: below it the bandwidth figure describes latency and the advice is "fewer calls", not "a
#: faster link".
COMM_SMALL_BYTES = 1_000_000
#: A node whose CPUs were this busy on average leaves gloo's communication threads waiting for a
#: core: part of a CPU run's communication latency is then scheduling, not the network.
COMM_CPU_BUSY_PCT = 90.0

# --- bandwidth probe between nodes ------------------------------------------------------------------
#: A node is named as the slow link when its best measured transfer rate is below half the
#: median of the other nodes': real NICs of one model differ by a few percent, a degraded link
#: (wrong speed negotiated, errors, a 1 GbE fallback next to 25 GbE) by 2x or far more.
PROBE_SLOW_FRACTION = 0.5
#: The doctor's micro-benchmarks (a matmul on the CPU and on each GPU, the host-to-device copy):
#: a node below half the median of the other nodes' in the same job is worse than its peers.
#: Nodes of one model differ by a few percent; a throttled GPU, a CPU quota, another job's
#: processes or a degraded PCIe link by 2x or more.
BENCH_SLOW_FRACTION = 0.5

# --- compute bound -------------------------------------------------------------------------------
#: When forward + backward + optimizer (+ host-to-device copies) take 80 % or more of the step, the
#: time goes into the model itself (communication is its own phase when measured; otherwise the
#: DDP all-reduce hides inside backward).
COMPUTE_FRACTION = 0.80
#: ...and, when GPU samples exist, the GPUs are busy at least 70 % of the time; otherwise the model
#: phases are long because of launch overhead or host work, not the GPU's math.
COMPUTE_GPU_UTIL_PCT = 70.0

# --- hangs (report/hangstate.py decides; aggregator/hangwatch.py samples) ----------------------
#: Where every rank is and whether it progresses is looked at once no rank has completed a step
#: for 5 s: shorter, ordinary steps of a few seconds would be sampled for nothing. Sampling costs
#: each rank one answer on its client thread (a few hundred microseconds, no signal) every
#: HANG_PROBE_EVERY_S while the silence lasts, so a look that finds everyone working is harmless.
HANG_PROBE_AFTER_S = 5.0
#: ...but not before 1.5 median steps: a run of 20 s steps would otherwise be looked at inside
#: every step (harmless, but noise in the work of the ranks and of node 0).
HANG_PROBE_STEPS = 1.5
#: Samples while the silence lasts, this far apart.
HANG_PROBE_EVERY_S = 5.0
#: A hang is declared on state only after the ranks it names made no progress for this long
#: (two samples at least): one sample cannot tell a rank that is stuck from one between two
#: bursts of work, and 10 s of nothing is far beyond a GC pause or a scheduler hiccup. With the
#: 5 s of silence first and the last step records' way to node 0, a hang is named ~17-25 s after
#: it began.
HANG_CONFIRM_S = 10.0
#: A rank works when its main thread (the one that trains) used at least a tenth of a core over
#: the window, or its child processes (DataLoader workers) did: a rank blocked in its own code
#: (a lock, a queue, a sleep, a polling loop with sleeps) uses a few percent at most; a save, an
#: evaluation or a data rebuild uses most of a core.
HANG_WORK_CPU = 0.10
#: ...or it read or wrote at least 256 KiB/s (files, pipes, sockets): a checkpoint written to a
#: slow shared file system is I/O, not CPU; a rank's own logging is far below this.
HANG_WORK_IO_BPS = 256 * 1024
#: A rank waiting in a collective is moving data (not stuck) when its whole process used at
#: least a fifth of a core: gloo's and MPI's threads copy and send while the main thread waits.
HANG_COLLECTIVE_CPU = 0.20
#: The backstop, when the state cannot be read (no rank or relay answers): no rank completing a
#: step for a minute, and at least 20 median steps (a run of 10 s steps would otherwise be called
#: stalled after six missed steps). It never fires while a sample shows a rank working: a 5-minute
#: save that writes is not a hang, however long.
HANG_REPORT_FLOOR_S = 60.0
HANG_REPORT_STEPS = 20.0

# --- compare (traceml compare A B) -----------------------------------------------------------------
#: Confidence level of the intervals `compare` prints and judges by.
COMPARE_LEVEL = 0.95
#: A change is called faster/slower only when it is at least 3 % of A's median. Two reasons: the
#: summary's histograms resolve a step time to one bucket, about 1.1 % wide, so medians one or
#: two buckets apart (up to ~2.2 %) are at the resolution limit; and two runs of the same script
#: on the same node differ by a percent or two from clock boost, page cache and neighbours,
#: whatever the per-step statistics of each run say. A run's own drift between its halves raises
#: this floor further (see report/uncertainty.py).
COMPARE_MIN_CHANGE_PCT = 3.0
#: The floor applies in milliseconds to every row alike, the step's and each phase's: the floor
#: above times A's median step, and at least 10 us (below that a change is timer granularity and
#: scheduler jitter, not something a code change did). A phase change under it cannot move the
#: step beyond noise, however large relative to the phase (0.02 ms more backward in a 6 ms step
#: is scheduling); when its interval excludes zero it is called "negligible", not "within noise".
COMPARE_MIN_CHANGE_MS = 0.01
#: With fewer step records than this (all ranks together) a run is not compared: a median of a
#: handful of steps is mostly warm-up.
COMPARE_MIN_STEPS = 20
