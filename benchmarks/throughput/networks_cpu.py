"""CPU training cost of the networks: milliseconds per image for one SGD step at 64 and 128 px.

SmallResNet is meant to train in minutes on a 2-core CPU; DenseNet121 and ResNet-18 are the GPU
backbones. Measures forward + backward + optimiser step on batches of 32 one-channel images, after one
warm-up step, with 1 and 2 intra-op threads. Prints the table, the time of a 10,000-image epoch of
SmallResNet at 128 px, and the speed ratio DenseNet121 / SmallResNet at 128 px
(target: SmallResNet epoch under 5 minutes and at least 10x faster than DenseNet121).

Run: ``.venv/bin/python -m benchmarks.throughput.networks_cpu [--steps 3]``.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from models.networks import build_network, count_parameters

BATCH = 32


def ms_per_image(name: str, size: int, steps: int) -> float:
    torch.manual_seed(0)
    model = build_network(name, num_classes=5, in_channels=1).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(BATCH, 1, size, size)
    y = (torch.rand(BATCH, 5) < 0.3).float()

    def step():
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps / BATCH * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    cases = [("small_resnet", 64), ("small_resnet", 128), ("resnet18", 128), ("densenet121", 128)]
    table: dict[tuple[str, int, int], float] = {}
    print(f"{'network':<13} {'params':>9} {'px':>4} {'threads':>7} {'ms/img':>8}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, size in cases:
            table[(name, size, threads)] = ms_per_image(name, size, args.steps)
            params = count_parameters(build_network(name, 5, 1))
            print(f"{name:<13} {params:>9,} {size:>4} {threads:>7} {table[(name, size, threads)]:>8.2f}", flush=True)
    best = min(table[("small_resnet", 128, t)] for t in (1, 2))
    epoch_min = best * 10_000 / 1000 / 60
    ratio = min(table[("densenet121", 128, t)] for t in (1, 2)) / best
    print(f"SmallResNet 128 px: 10,000-image epoch {epoch_min:.1f} min (target < 5); "
          f"DenseNet121 / SmallResNet time ratio {ratio:.1f}x (target >= 10)")
    return 0 if epoch_min < 5 and ratio >= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
