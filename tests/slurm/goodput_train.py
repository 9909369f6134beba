"""A DDP training script (gloo, CPU) that checkpoints, resumes after a requeue and records its own
truth, for the goodput ledger's tests.

Each rank writes ``$GOODPUT_TRUTH/rank<R>-a<restart>.jsonl``, one JSON object a line, with the
wall clock (``time.time()``) of everything the ledger divides:

``{"k": "start", "t"}``            the process started (before ``import torch``)
``{"k": "step", "g", "start", "end", "input", "redo"}``  one step: its global step ``g``, from
                                   before the batch is fetched to the end of the traced block,
                                   the fetch's own time, and whether an earlier attempt had done
                                   this global step already (``g`` at or below the highest one
                                   any earlier attempt's ranks wrote)
``{"k": "ckpt", "start", "end", "step"}``  one save (``torch.save`` of this rank's own file, or
                                   ``torch.distributed.checkpoint.save``): steps done when taken
``{"k": "fail", "t"}``             the rank raises (``--fail-rank``/``--fail-step``, first attempt)
``{"k": "usr1", "t"}``             SIGUSR1 arrived (``--usr1``: the handler's flag; the loop saves
                                   and ends at the next step boundary)

Every step sleeps ``--step-ms`` inside the model's forward (productive time); a checkpoint
every ``--ckpt-every`` steps (up to ``--ckpt-until``) holds ``--ckpt-ms`` of writing (a file object that writes slowly, so
the time is inside the save). A requeued attempt resumes from the checkpoint
(``--ckpt-dir``: the step in ``step.txt``, written after the save).
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import glob  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import traceml_core as traceml  # noqa: E402


class Slow(torch.nn.Module):
    def __init__(self, ms: float, ballast: int = 0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.ms = ms
        # a weight the step does not use, only so that a save takes measurable time
        self.ballast = torch.nn.Parameter(torch.zeros(ballast), requires_grad=False) if ballast else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return self.lin(x)


class SlowFile(io.RawIOBase):
    """A file that takes ``seconds`` in all to be written (the save's time is inside torch.save)."""

    def __init__(self, path: str, seconds: float) -> None:
        self.f = open(path, "wb")
        self.seconds = seconds

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        if self.seconds > 0:
            time.sleep(self.seconds)
            self.seconds = 0.0
        return self.f.write(b)

    def close(self) -> None:
        self.f.close()
        super().close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80, help="global steps in all")
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--ckpt-until", type=int, default=0, help="periodic saves up to this global step (0: all)")
    ap.add_argument("--ckpt-ms", type=float, default=300.0)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--save", choices=("torch", "dcp", "safetensors"), default="torch",
                    help="safetensors: save_model and save_file by turns, of a model with a large extra weight")
    ap.add_argument("--give-step", action="store_true", help="trace_step(model, step=global_step)")
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--fail-step", type=int, default=-1)
    ap.add_argument("--usr1", action="store_true", help="on SIGUSR1: save and end")
    ap.add_argument("--tokens-per-step", type=float, help="traceml.declare_work(tokens_per_step=...)")
    ap.add_argument("--samples-per-step", type=float)
    ap.add_argument("--flops-per-step", type=float)
    ap.add_argument("--dtype")
    args = ap.parse_args()

    truth_dir = os.environ["GOODPUT_TRUTH"]
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = open(os.path.join(truth_dir, f"rank{rank}-a{restart}.jsonl"), "a", buffering=1)

    def truth(**kw: object) -> None:
        out.write(json.dumps(kw) + "\n")

    truth(k="start", t=STARTED)
    usr1 = {"at": None}
    if args.usr1:
        signal.signal(signal.SIGUSR1, lambda *_: usr1.__setitem__("at", time.time()))
    done_before = -1
    for path in glob.glob(os.path.join(truth_dir, "rank*-a*.jsonl")):
        if path.endswith(f"-a{restart}.jsonl"):
            continue
        for line in open(path):
            rec = json.loads(line)
            if rec.get("k") == "step":
                done_before = max(done_before, rec["g"])
    traceml.init()
    if args.tokens_per_step or args.samples_per_step or args.flops_per_step:
        traceml.declare_work(tokens_per_step=args.tokens_per_step, samples_per_step=args.samples_per_step,
                             flops_per_step=args.flops_per_step, dtype=args.dtype)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        Slow(args.step_ms, 16 * 2**20 if args.save == "safetensors" else 0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    marker = os.path.join(args.ckpt_dir, "step.txt")
    start = int(open(marker).read()) if os.path.exists(marker) else 0
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4096, 8)), batch_size=4)
    it = iter(data)

    def save(step: int) -> None:
        t0 = time.time()
        state = {"model": model.module.state_dict(), "step": step}
        if args.save == "safetensors":   # imported here, after init(): as a script that saves late
            from safetensors.torch import save_file, save_model

            path = os.path.join(args.ckpt_dir, f"rank{rank}-{step}.safetensors")
            if (step // args.ckpt_every) % 2:
                save_model(model.module, path)
            else:
                save_file(model.module.state_dict(), path)
            for old in glob.glob(os.path.join(args.ckpt_dir, f"rank{rank}-*.safetensors")):
                if old != path:
                    os.remove(old)   # 64 MB each: keep the last
        elif args.save == "dcp":
            import torch.distributed.checkpoint as dcp

            time.sleep(args.ckpt_ms / 1e3 / 2)
            dcp.save(state, checkpoint_id=os.path.join(args.ckpt_dir, f"dcp-{step}"))
        else:
            f = SlowFile(os.path.join(args.ckpt_dir, f"rank{rank}.pt"), args.ckpt_ms / 1e3)
            torch.save(state, f)
            f.close()
        truth(k="ckpt", start=t0, end=time.time(), step=step)
        dist.barrier()
        if rank == 0:
            with open(marker + ".tmp", "w") as m:
                m.write(str(step))
            os.replace(marker + ".tmp", marker)

    for g in range(start, args.steps):
        t0 = time.time()
        try:
            (x,) = next(it)
        except StopIteration:   # a long run (the time-limit tests) goes round the data again
            it = iter(data)
            (x,) = next(it)
        t1 = time.time()
        with (traceml.trace_step(model, step=g) if args.give_step else traceml.trace_step(model)):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        truth(k="step", g=g, start=t0, end=time.time(), input=t1 - t0, redo=g <= done_before)
        if restart == 0 and g == args.fail_step and rank == args.fail_rank:
            truth(k="fail", t=time.time())
            raise RuntimeError(f"rank {rank} fails on purpose at step {g}")
        if args.usr1 and dist.get_world_size() > 1:  # every rank stops at the same step boundary
            flag = torch.tensor([0 if usr1["at"] is None else 1])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and usr1["at"] is None:
                usr1["at"] = time.time()
        periodic = (g + 1) % args.ckpt_every == 0 and (not args.ckpt_until or g + 1 <= args.ckpt_until)
        if periodic or usr1["at"] is not None:
            save(g + 1)
        if usr1["at"] is not None:
            truth(k="usr1", t=usr1["at"])
            break
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
