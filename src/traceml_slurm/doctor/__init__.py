"""`traceml slurm doctor`: preflight checks of a Slurm allocation, on every node.

Layout: one module per group of checks (context, gpu, software, network, filesystem, walltime,
controller; crossnode judges what the agents report), the per-node agent (agent.py) and the
coordinator that starts the agents with srun and drives the cross-node phases (coordinator.py),
the coordinator<->agent messages (wire.py, on the wire protocol's framing and HMAC hello),
rendering (render.py), the command line (cli.py). Nothing here imports torch: torchprobe.py runs
it in a child process. Importing this package is cheap on purpose.
"""
