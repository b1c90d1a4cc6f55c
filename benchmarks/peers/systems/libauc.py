"""The AUC-margin step, fedauc's against LibAUC 2.0.1's, for python -m benchmarks.peers: steps per second on one site's
training rows at the same batch and network, after a warm-up. LibAUC: ``AUCMLoss`` on sigmoid scores and its
``PESG`` optimizer with CODA+'s settings (margin 1, epoch_decay = 1/gamma = 1/500, weight decay 1e-4, no momentum:
fedauc's CODA+ step is PESG's plain-SGD form, federated/algorithms/codaplus.py). fedauc: CODA+ on that one site
through its engine (one round of warm-up, then one timed round of ``steps`` local steps).
Run in LibAUC's own environment: ``python -m benchmarks.peers.systems.libauc --one '<job JSON>'``; ``fedauc_aucm_rate`` in fedauc's."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.peers.common import Batches, network, site_tensors

WARMUP = 5


def libauc_rate(job: dict) -> dict:
    from libauc.losses import AUCMLoss
    from libauc.optimizers import PESG

    torch.set_num_threads(1)
    x, target = site_tensors(Path(job["data"]), job["sites"][0])
    y = target[:, :1]
    model = network(job).train()
    loss_fn = AUCMLoss(margin=1.0, imratio=float(y.mean()))
    optimizer = PESG(model.parameters(), loss_fn=loss_fn, lr=job["lr"], margin=1.0, epoch_decay=1 / 500,
                     weight_decay=1e-4, momentum=0.0)
    batches = Batches(len(x), job["batch"], 1000)

    def step() -> None:
        idx = batches.next()
        loss = loss_fn(torch.sigmoid(model(x[idx])), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(WARMUP):
        step()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(job["steps"]):
        step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"steps_per_s": job["steps"] / wall, "steps_per_cpu_s": job["steps"] / cpu}


def fedauc_aucm_rate(job: dict) -> dict:
    from federated import ShardSite, TrainConfig, train

    torch.set_num_threads(1)
    shard = Path(job["shards"]) / job["sites"][0]
    marks: list[tuple[float, float]] = []
    config = TrainConfig(algorithm="codaplus", params={"stages": 1}, sites=[ShardSite(path=shard)],
                         network=job["network"], rounds=2, local_steps=job["steps"], batch_size=job["batch"],
                         lr=job["lr"], progress=False, loader_workers=0, device="cpu", eval_every=10 ** 6, seed=0)
    history = train(config, callbacks=[lambda record: marks.append((time.perf_counter(), time.process_time()))]).history
    return {"steps_per_s": job["steps"] / history[1]["site_compute_s"][0],
            "steps_per_cpu_s": job["steps"] / (marks[1][1] - marks[0][1])}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", required=True)
    print("RESULT " + json.dumps(libauc_rate(json.loads(parser.parse_args().one))), flush=True)
