"""Where the batched CNN round loses to the per-agent loop (issue 28 item 8).

Run: ``.venv/bin/python -m benchmarks.profile_simcnn`` (``--threads 1`` by default: one
thread makes the per-op times far less sensitive to the shared machine's load than two
threads that wait on each other; ``--no-profile`` for the conv1 A/B only).

It prints (a) torch.profiler's self CPU time by op and input shape for one MNIST-CNN round
of :mod:`benchmarks.bench_simflops` (N = 100, K = 1, batch 64) through
:func:`peerd.sim.train.train_batched` and through :func:`peerd.sim.train.train_loop`, and
(b) the CPU time of the first conv block alone (conv 1→32 5×5, ReLU, max-pool, for 9 agents
of 64 images, one ``train_batched`` call's worth) three ways: one agent after another,
``vmap`` over ``functional.conv2d`` (which vmap turns into a grouped convolution of 9 groups of one
input channel), and ``vmap`` over im2col + matmul. Prints only; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from torch.func import grad, vmap
from torch.nn import functional
from torch.profiler import ProfilerActivity, profile

from peerd.core.entry import flatten
from peerd.learn.data import load_dataset, partition
from peerd.learn.models import build_model
from peerd.sim.train import draw_batches, model_schema, train_batched, train_loop

Params = dict[str, torch.Tensor]
Conv = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def profile_round(rows: int) -> None:
    ds = load_dataset("mnist")
    agents, steps, batch = 100, 1, 64
    parts = partition(ds.y_train, agents, "shards", np.random.default_rng(0))
    model = build_model("cnn", ds.input_shape, ds.num_classes, seed=0)
    schema = model_schema(model)
    init = flatten(dict(model.named_parameters()), schema)
    matrix = init + 0.01 * torch.randn(agents, init.numel(),
                                       generator=torch.Generator().manual_seed(0))
    batches = draw_batches(parts, steps, batch, seed=0, round_index=0)
    paths: dict[str, Callable[[], object]] = {
        "batched": lambda: train_batched(model, matrix, schema, ds.x_train, ds.y_train,
                                         batches, lr=0.1, rho=0.01),
        "loop": lambda: train_loop(model, matrix, schema, ds.x_train, ds.y_train, parts,
                                   steps=steps, batch_size=batch, lr=0.1, rho=0.01, seed=0,
                                   round_index=0)}
    for fn in paths.values():
        fn()  # warm-up
    for name, fn in paths.items():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn()
        print(f"== {name}")
        print(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=rows))


def conv_im2col(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A valid (no padding, stride 1) convolution as unfold + matmul; the result is a
    channels-last view, which the ReLU and max-pool after it accept as it is."""
    n, _, h, wd = x.shape
    out_ch, _, kh, kw = w.shape
    cols = functional.unfold(x, (kh, kw)).transpose(1, 2)  # [n, L, c·kh·kw]
    out = cols @ w.reshape(out_ch, -1).t() + b
    return out.view(n, h - kh + 1, wd - kw + 1, out_ch).permute(0, 3, 1, 2)


def conv1_ab(repeat: int) -> None:
    agents, batch = 9, 64
    g = torch.Generator().manual_seed(0)
    x = torch.randn(agents, batch, 1, 28, 28, generator=g)
    p = {"w": 0.2 * torch.randn(agents, 32, 1, 5, 5, generator=g), "b": torch.zeros(agents, 32)}

    def block(q: Params, xs: torch.Tensor, conv: Conv) -> torch.Tensor:
        return functional.max_pool2d(functional.relu(conv(xs, q["w"], q["b"])), 2).square().sum()

    def loop() -> None:
        for a in range(agents):
            q = {k: v[a].detach().requires_grad_() for k, v in p.items()}
            torch.autograd.grad(block(q, x[a], functional.conv2d), list(q.values()))

    def batched(conv: Conv) -> Callable[[], object]:
        return lambda: vmap(grad(lambda q, xs: block(q, xs, conv)))(p, x)

    fns = {"loop": loop, "vmap conv2d": batched(functional.conv2d), "vmap im2col": batched(conv_im2col)}
    ref, alt = batched(functional.conv2d)(), batched(conv_im2col)()
    assert isinstance(ref, dict)
    assert isinstance(alt, dict)
    for k in ref:
        rel = float((ref[k] - alt[k]).abs().max() / ref[k].abs().max())
        print(f"im2col vs conv2d gradient {k}: max relative difference {rel:.1e}")
    for fn in fns.values():
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):  # interleaved: the machine's load drifts between repetitions
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            cpu[name].append(time.process_time() - t0)
    for name, ts in cpu.items():
        print(f"conv1 block, {agents} agents x {batch}: {name:12s} CPU min {min(ts) * 1e3:6.1f} "
              f"ms, median {statistics.median(ts) * 1e3:6.1f} ms ({repeat} runs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=14)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.no_profile:
        profile_round(args.rows)
    conv1_ab(args.repeat)


if __name__ == "__main__":
    main()
