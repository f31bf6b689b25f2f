"""The learner boundary (issue 26): an 11M-parameter model to the worker and back, against a
K = 10 round, and the memory of daemon + worker against a lone daemon.

Run: ``nice -n 10 .venv/bin/python -m benchmarks.bench_learner`` (``--device cuda`` on a GPU;
``--write`` stores the readings, with the commit and this command, in
docs/reproduction/learner[-DEVICE].json and renders the section of docs/benchmarks.md between
the ``<!-- bench:learner -->`` markers; tests/docs/test_learner_doc.py re-renders it).

The model is a ResNet-18 (benchmarks/_learner_models.py: 11,181,642 parameters, 122 tensors
with the batch-norm statistics; one copy is their bytes). In one process, the "daemon":

* **the round**: K = 10 steps of the built-in learner (``peerd.core.local_update``, ρ = 0.1,
  x̄ as the anchor) on the device, generated 3 × 32 × 32 images, batch 16: the baseline;
* **the boundary**: ``peerd.learn.learner.step.fit_into`` through a real
  ``WorkerLearner`` whose learner hands x̄ straight back: x̄ into the input buffer, the
  worker's checks and its copy into the output buffer, the daemon's checks of the result and
  its copy into the model — everything a learner of the user's adds to a round but its
  training. Its time is a fraction of the round's (interleaved, medians).
* **memory of the boundary**: each process's peak RSS is reset (``/proc/PID/clear_refs``,
  "5") before a call and read after it (``VmHWM``); its growth over the RSS before the call
  is that call's transient memory, in model copies, daemon and worker added (pages both map
  count twice: an upper bound). The two buffers, which stay mapped for the worker's life,
  show as the first call's growth; what both processes keep of them is the PSS
  (``/proc/PID/smaps_rollup``: shared pages split between their mappers) after that call.
* **daemon + worker against a lone daemon**: the lone daemon's peak RSS is taken over a
  built-in round before any worker exists; then the worker trains the same K steps itself
  (its own copy, on the device) and both peaks are read.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import _provenance
from benchmarks._learner_models import images, resnet18, sync
from benchmarks._report import DOC, machine
from peerd.core.local_update import local_update
from peerd.learn.learner.check import schema_of
from peerd.learn.learner.contract import FitConfig, LearnerContext, LearnerKind
from peerd.learn.learner.fleet import DeviceError, resolve_device
from peerd.learn.learner.step import LearnerRound, fit_into
from peerd.learn.learner.worker import WorkerLearner, WorkerSpec

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "docs" / "reproduction"
MARK = "learner"
#: The readings of the boundary as it was before it was made fast (same command, commit named).
BEFORE = READINGS / "learner-before.json"


def readings_path(device_type: str) -> Path:
    return READINGS / ("learner.json" if device_type == "cpu" else f"learner-{device_type}.json")


def _commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "peerd"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


# ---------------------------------------------------------------------------- /proc


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1]) * 1024
    return out


def _pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss line")


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


class Peaks:
    """Peak RSS growth over a block of code, per process."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids

    def __enter__(self) -> Peaks:
        for pid in self.pids:
            _reset_peak(pid)
        self.before = {pid: _status(pid)["VmRSS"] for pid in self.pids}
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = {pid: _status(pid)["VmHWM"] for pid in self.pids}
        self.growth = {pid: self.peak[pid] - self.before[pid] for pid in self.pids}


# ---------------------------------------------------------------------------- the run


def run(device_name: str, steps: int, batch: int, rows: int, rounds: int, calls: int,
        threads: int) -> dict[str, Any]:
    device = torch.device(resolve_device(device_name))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = resnet18()  # the daemon's model: on the CPU, as a daemon holds it
    own = {k: v.detach() for k, v in model.state_dict().items()}
    x_bar = {k: v.clone() for k, v in own.items()}  # what the daemon holds as published
    copy_bytes = sum(t.numel() * t.element_size() for t in own.values())
    params = sum(p.numel() for p in model.parameters())
    me = int(Path("/proc/self").resolve().name)

    dev = None
    if device.type != "cpu":
        from peerd.learn.ondevice import DeviceCopy  # the daemon's way onto a device

        dev = DeviceCopy(model, str(device))
    x, y = images(rows, 1)

    def builtin_round() -> None:
        model.load_state_dict(x_bar)  # every round from the same x̄
        if dev is None:
            local_update(model, x, y, steps=steps, batch_size=batch, lr=0.01, rho=0.1,
                         loss="cross_entropy", generator=torch.Generator().manual_seed(1),
                         anchor=x_bar)
            return
        dev.load(model)
        xd, yd = dev.rows(x, y)
        local_update(dev.model, xd, yd, steps=steps, batch_size=batch, lr=0.01, rho=0.1,
                     loss="cross_entropy", generator=torch.Generator().manual_seed(1),
                     anchor=dev.anchor(x_bar))
        dev.store(model)
        sync(device)

    builtin_round()  # warm-up (allocator, kernels)
    with Peaks(me) as lone:
        builtin_round()

    folder = Path(tempfile.mkdtemp(prefix="bench-learner-"))
    spec = WorkerSpec(kind=LearnerKind.PYTHON, entry="benchmarks._learner_models:Bench",
                      context=LearnerContext(node_id="bench", device=str(device)),
                      schema=schema_of(own), buffer_dir=folder, timeout_s=1800.0,
                      torch_threads=threads)
    worker = WorkerLearner(spec)
    worker.start()
    assert worker.pid is not None
    child = worker.pid
    learner = LearnerRound(learner=worker, schema=schema_of(own), round=1, device=str(device))

    def config(train: bool) -> FitConfig:
        return FitConfig(round=1, rho=0.1, steps=steps, seed=1, device=str(device),
                         batch_size=batch, lr=0.01,
                         run_config={"train": train, "rows": rows})

    def boundary() -> None:
        fitted = fit_into(own, learner, config(False))
        if fitted.failure is not None:
            raise RuntimeError(f"the boundary refused x̄: {fitted.failure}")

    try:
        model.load_state_dict(x_bar)
        pss_before = _pss(me) + _pss(child)
        with Peaks(me, child) as cold:
            t0 = time.perf_counter()
            boundary()
            cold_s = time.perf_counter() - t0
        pss_kept = _pss(me) + _pss(child) - pss_before
        round_s: list[float] = []
        boundary_s: list[float] = []
        copy_s: list[float] = []
        steady: list[int] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            builtin_round()
            round_s.append(time.perf_counter() - t0)
            model.load_state_dict(x_bar)
            for _ in range(calls):
                with Peaks(me, child) as p:
                    t0 = time.perf_counter()
                    boundary()
                    boundary_s.append(time.perf_counter() - t0)
                steady.append(sum(p.growth.values()))
                t0 = time.perf_counter()
                for name, t in own.items():  # one model copy, memory to memory, no allocation
                    t.copy_(x_bar[name])
                copy_s.append(time.perf_counter() - t0)
        # Daemon + worker: the worker trains the round itself.
        model.load_state_dict(x_bar)
        with Peaks(me, child) as both:
            t0 = time.perf_counter()
            fitted = fit_into(own, learner, config(True))
            learner_round_s = time.perf_counter() - t0
        if fitted.fit is None:
            raise RuntimeError(f"the training learner failed: {fitted.failure}")
        fit_s = float(fitted.fit.metrics["fit_s"])
    finally:
        worker.close()
        folder.rmdir()
    b, r = statistics.median(boundary_s), statistics.median(round_s)
    return {
        "device": str(device), "model": "a ResNet-18, benchmarks/_learner_models.py",
        "params": params, "tensors": len(own), "copy_bytes": copy_bytes,
        "steps": steps, "batch": batch, "rows": rows, "threads": threads,
        "round_s": round_s, "boundary_s": boundary_s, "cold_boundary_s": cold_s,
        "copy_s": copy_s, "copy_median_s": statistics.median(copy_s),
        "round_median_s": r, "boundary_median_s": b, "boundary_fraction": b / r,
        "cold_growth_copies": {"daemon": cold.growth[me] / copy_bytes,
                               "worker": cold.growth[child] / copy_bytes},
        "kept_pss_copies": pss_kept / copy_bytes,
        "steady_growth_copies_max": max(steady) / copy_bytes,
        "lone_daemon_peak_bytes": lone.peak[me],
        "daemon_peak_bytes": both.peak[me], "worker_peak_bytes": both.peak[child],
        "learner_round_s": learner_round_s, "learner_fit_s": fit_s,
    }


# ---------------------------------------------------------------------------- the doc


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


def _row(label: str, r: dict[str, Any]) -> str:
    cold = r["cold_growth_copies"]
    return (f"| {label} (`{r['commit']}`, {r['device']}) | {r['boundary_median_s']:.3f} | "
            f"{r['boundary_median_s'] / r['copy_median_s']:.1f} | "
            f"{r['round_median_s']:.2f} | **{100 * r['boundary_fraction']:.1f} %** | "
            f"{cold['daemon']:.2f} + {cold['worker']:.2f} | {r['kept_pss_copies']:.2f} | "
            f"**{r['steady_growth_copies_max']:.2f}** |")


def render(now: dict[str, Any], before: dict[str, Any] | None,
           gpu: dict[str, Any] | None) -> list[str]:
    """The section, from the readings of this commit, the one before the boundary was made
    fast (if stored) and a GPU run (if stored)."""
    one = _mb(now["copy_bytes"])
    lines = [
        "## Learner boundary (issue 26)",
        "",
        f"An 11M-parameter model ({now['model']}: {now['params']:,} parameters, "
        f"{now['tensors']} tensors, one copy = {one}) to the learner's worker and back "
        "(`fit_into` through a real `WorkerLearner` whose learner returns x̄: every copy and "
        "check, no training), against one model copy (x̄ `copy_`-ed into the model, "
        f"same run) and a K = {now['steps']} round of the built-in learner "
        f"(batch {now['batch']}, 3 × 32 × 32 images, {now['threads']} torch thread"
        f"{'s' * (now['threads'] > 1)}), interleaved in one run, medians of "
        f"{len(now['boundary_s'])} calls and {len(now['round_s'])} rounds. Memory in model "
        "copies: a process's peak RSS (`VmHWM`, reset through `/proc/PID/clear_refs`) over "
        "its RSS before the call, daemon + worker; the buffers the two processes keep mapped "
        "between calls as their PSS. Targets: ≤ 5 % of the round, ≤ 2 copies.",
        "",
        f"Measured on {now['machine']}: `{now['command']}` (readings in "
        "[`reproduction/learner.json`](reproduction/learner.json)"
        + (", before: [`reproduction/learner-before.json`](reproduction/learner-before.json)"
           if before else "") + ").",
        "",
        "| boundary | s per fit | × one copy's time | K-step round s | fit / round | first "
        "call: daemon + worker growth (copies) | kept buffers, PSS (copies) | later calls: "
        "growth (copies, max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if before is not None:
        lines.append(_row("before: a mapping per call, `isfinite().all()`", before))
    lines.append(_row("now: mapped once, one min/max pass", now))
    if gpu is not None:
        lines.append(_row("now, on the GPU", gpu))
    else:
        lines.append("| now, on a GPU (`--device cuda`) | not measured: this machine has no "
                     "GPU | | | | | | |")
    lone = now["lone_daemon_peak_bytes"]
    pair = now["daemon_peak_bytes"] + now["worker_peak_bytes"]
    lines += [
        "",
        "The first call maps the two buffers' pages in (about one copy each in each process, "
        "shared between them: the PSS is what they cost together, ~2 copies, kept for the "
        "worker's life); a later call adds about nothing. Before, every call mapped the "
        "buffers anew, and the finiteness check (`torch.isfinite(t).all()`: a mask of the "
        "model's size through several passes, in the worker and again in the daemon) was "
        "most of the round trip under cProfile; now it is one `aminmax` pass per tensor "
        "(exact: min and max propagate NaN, and no sum that could overflow). Neither JSON "
        "framing nor the pipes were more than a few milliseconds.",
        "",
        "The lone daemon is this benchmark's process holding what a daemon holds for a "
        "round (the model, x̄, the rows) through a built-in round, before any worker exists; "
        "then the worker trains the same round on its own copy.",
        "",
        "| peak RSS | lone daemon (built-in round) | daemon (learner round) | worker "
        "(trains the round) | daemon + worker | × lone |",
        "|---|---:|---:|---:|---:|---:|",
        f"| {now['device']} | {_mb(lone)} | {_mb(now['daemon_peak_bytes'])} | "
        f"{_mb(now['worker_peak_bytes'])} | {_mb(pair)} | {pair / lone:.2f} |",
        "",
        f"The learner round took {now['learner_round_s']:.2f} s, of which the worker's fit "
        f"{now['learner_fit_s']:.2f} s. The worker is a second interpreter with torch and its "
        "own copy of the model and data: most of the pair's extra is that, not the boundary.",
    ]
    return lines


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def rendered() -> list[str]:
    now = _load(readings_path("cpu"))
    if now is None:
        raise FileNotFoundError(readings_path("cpu"))
    return render(now, _load(BEFORE), _load(readings_path("cuda")))


def write(r: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r, indent=1) + "\n")
    if readings_path("cpu").exists():
        _write_doc()


def _write_doc() -> None:
    text = DOC.read_text()
    block = f"<!-- bench:{MARK} -->\n" + "\n".join(rendered()) + f"\n<!-- /bench:{MARK} -->"
    pattern = re.compile(rf"<!-- bench:{MARK} -->.*?<!-- /bench:{MARK} -->", re.S)
    text = (pattern.sub(lambda _: block, text) if pattern.search(text)
            else text.rstrip() + "\n\n" + block + "\n")
    DOC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps")
    ap.add_argument("--steps", type=int, default=10, help="K, the round's local steps")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rows", type=int, default=256, help="generated images")
    ap.add_argument("--rounds", type=int, default=3, help="K-step rounds timed")
    ap.add_argument("--calls", type=int, default=4, help="boundary calls after each round")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, daemon and worker")
    ap.add_argument("--out", type=Path, help="the readings' file (default: by device; "
                    "docs/reproduction/learner-before.json for the old boundary)")
    ap.add_argument("--write", action="store_true", help="store the readings, render the doc")
    ap.add_argument("--render", action="store_true",
                    help="only render the doc from the stored readings")
    args = ap.parse_args()
    if args.render:
        _write_doc()
        return
    try:  # a device this machine lacks: one line, before anything is built
        resolve_device(args.device)
    except DeviceError as exc:
        print(f"bench_learner: {exc}", file=sys.stderr)
        sys.exit(2)
    started = _provenance.start(ap, args)
    r = run(args.device, args.steps, args.batch, args.rows, args.rounds, args.calls,
            args.threads)
    r.update(commit=_commit(), machine=machine(),
             command="python -m benchmarks.bench_learner " + shlex.join(sys.argv[1:]),
             provenance=started.record())
    print(json.dumps({k: v for k, v in r.items() if not isinstance(v, list)}, indent=1))
    if args.write:
        write(r, args.out or readings_path(torch.device(r["device"]).type))


if __name__ == "__main__":
    main()
