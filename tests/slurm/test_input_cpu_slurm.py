"""Input-bound joined with the CPU on the real local Slurm cluster (issue 25 item 3; docs/node-health.md).

Two one-node jobs at the same time, each ``--cpus-per-task=1``, a DataLoader whose workers compute
(25 ms of CPU per batch, tests/unit/scripts/loader_train.py; 120 steps: the workers' CPU use is
sampled from /proc twice a second, and 30 steps ended in under a second on a quiet machine, too
few samples to tell computing workers from idle ones): with 4 workers they want more CPUs
than the task may run on, so the input-bound verdict names the CPU and ends in the lines for the
next job script (Slurm 22.05's srun does not pass --cpus-per-task on: the export line too); with
1 worker (the control) CPUs are left over and the verdict does not ask for CPUs. A loader that
sleeps instead is not blamed on the CPU: tests/unit/test_cpu_binding.py.
"""

from __future__ import annotations

import json

from e2e import REPO, job_env

SCRIPT = REPO / "tests" / "unit" / "scripts" / "loader_train.py"
JOB = f"""#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {SCRIPT}
"""


def test_workers_sharing_the_tasks_cpu_get_the_cpus_per_task_line_and_a_job_with_cpus_to_spare_does_not(
        slurm_cluster, tmp_path):
    logs = {w: tmp_path / f"w{w}" for w in (4, 1)}
    jobs = {w: slurm_cluster.submit(JOB, "--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1",
                                    env=job_env(d, LOADER_WORKERS=str(w), LOADER_WORK="cpu", LOADER_MS="25",
                                                LOADER_STEPS="120"))
            for w, d in logs.items()}
    states = {w: slurm_cluster.wait(j, timeout=240) for w, j in jobs.items()}
    outs = {w: slurm_cluster.output(j) for w, j in jobs.items()}
    assert states == {4: "COMPLETED", 1: "COMPLETED"}, outs
    docs = {w: json.loads(next(d.glob("*/final_summary.json")).read_text()) for w, d in logs.items()}
    verdicts = {w: {v["kind"]: v for v in [doc["verdict"]] + doc["other_verdicts"]} for w, doc in docs.items()}
    bound = verdicts[4]["input_bound"]
    cpu = bound["evidence"]["cpu"]
    assert cpu["cause"] == "cpu_binding" and cpu["workers"] == 4, bound
    assert (cpu["scheduler"], cpu["cpus_per_task"]) == ("Slurm", 1) and cpu["version"].startswith("22.05"), cpu
    lines = ["#SBATCH --cpus-per-task=5", "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"]
    assert "4 DataLoader worker(s) and the rank share" in bound["why"] and "Slurm gave each task 1 CPU" in bound["why"]
    assert bound["next_step"].endswith("in the next job script: " + "; ".join(lines)), bound["next_step"]
    assert docs[4]["next_job"]["lines"] == lines
    text = outs[4][outs[4].index("TraceML summary"):]
    assert "Next job script (paste into your sbatch script):\n  #SBATCH --cpus-per-task=5" in text, text
    # the control: one worker, CPUs to spare: whatever it says of the input, it does not ask for CPUs
    control = verdicts[1].get("input_bound")
    assert control is None or (control["evidence"]["cpu"] or {}).get("cause") != "cpu_binding", control
    assert "--cpus-per-task" not in json.dumps(docs[1].get("next_job") or {}), docs[1].get("next_job")
