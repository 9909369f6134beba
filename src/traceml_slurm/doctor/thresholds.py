"""Every number the doctor judges by, in one place, each with the reason for its value."""

from __future__ import annotations

#: Free space in the logs dir below which we warn. A final summary is tens of kB; per-rank step
#: files of a long run are a few MB. 200 MiB leaves room for both and for the user's own outputs.
LOGS_MIN_FREE_BYTES = 200 * 1024 * 1024

#: /dev/shm per GPU (or per worker on CPU) below which we warn. DataLoader workers pass batches
#: through /dev/shm and NCCL uses it for intra-node transport; container defaults of 64 MiB make
#: both fail with "bus error" / "No space left on device". 1 GiB per GPU is the usual advice.
SHM_MIN_BYTES_PER_GPU = 1024 * 1024 * 1024
#: on a CPU node the workers still use /dev/shm through DataLoader; 256 MiB each is plenty
SHM_MIN_BYTES_PER_CPU_WORKER = 256 * 1024 * 1024

#: Seconds TraceML needs between SIGTERM and SIGKILL to stop the workers and write the summary:
#: the launcher gives torchrun 15 s (launcher.run.STOP_GRACE_S), then the aggregator finalises
#: (a few seconds for a large run). Slurm's default KillWait of 30 s is enough.
SUMMARY_BUDGET_S = 25.0

#: Time left in the allocation below which we fail / warn. A multi-node start (rendezvous, data
#: loading, the first compiled steps) takes minutes; under 2 minutes nothing useful can run.
TIME_LEFT_FAIL_S = 120.0
TIME_LEFT_WARN_S = 600.0

#: Clock skew between nodes above which we warn: step timestamps (t_end_ns) are wall-clock, so the
#: cross-node timeline in the summary is off by this much; NTP-synced nodes agree within ms.
CLOCK_SKEW_WARN_S = 1.0
#: ... and above which we fail: the aggregator refuses hellos whose timestamp differs from its clock
#: by more than wire.protocol.HELLO_WINDOW_S (300 s). Half of it leaves margin for drift during a run.
CLOCK_SKEW_FAIL_S = 150.0

#: Seconds a node waits for a TCP connect to node 0 in the reachability check. A healthy LAN
#: answers in milliseconds; a firewall that drops packets never answers, and 3 s tells that apart
#: without making the check slow (each port is tried once per node, all nodes in parallel).
CONNECT_TIMEOUT_S = 3.0

#: a GPU whose memory is this full with no visible process is probably used from another container
GPU_FOREIGN_MEMORY_BYTES = 1024 * 1024 * 1024

#: NCCL all-reduce sizes of the --full bandwidth sweep (bytes): from latency-bound to bandwidth-bound
NCCL_SWEEP_BYTES = (1 << 20, 16 << 20, 128 << 20)

#: default for --timeout: the longest any one wait may take (agents starting, a node answering, torch
#: importing on a slow shared filesystem). Healthy nodes answer in 1-3 s; 15 s tolerates a cold cache.
DEFAULT_TIMEOUT_S = 15.0
#: ...and the --timeout the doctor suggests when `import torch` did not finish within it: long
#: enough for a first import from a cold parallel filesystem
IMPORT_RETRY_TIMEOUT_S = 120.0
#: sw.torch warns when `import torch` took this long: every rank of every start pays it (warm
#: local imports take 1-3 s, 10-20 s on an overloaded node; a cold shared filesystem serving the
#: wheel's thousands of files, 30 s to minutes)
IMPORT_SLOW_S = 30.0

#: cross.compute-speed: a node whose own cgroup's CPU quota throttled its CPU matmul in this share of
#: the quota's periods or more is held back by a CPU limit (measured, not inferred from the ratio)...
BENCH_THROTTLED = 0.5
#: ...when the other nodes' median share is below this (the same quota everywhere is the job's, not
#: one node's: no node is worse than its peers for it)
BENCH_THROTTLED_PEERS = 0.1
