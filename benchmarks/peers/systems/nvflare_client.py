"""NVIDIA FLARE's own FedAvg, a site's half: the Client API loop its examples show (``flare.init``, ``receive``,
local training, ``send`` with the step count), training as every system of python -m benchmarks.peers does
(``benchmarks.peers.common.local_train``). The recipe copies this script into the job; the repository is on its
``PYTHONPATH`` (the peers benchmark starts every system so)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import nvflare.client as flare
import torch

from benchmarks.peers.common import Batches, local_train, log_round, network, site_tensors

parser = argparse.ArgumentParser()
parser.add_argument("--job", required=True)
args = parser.parse_args()

job = json.loads(Path(args.job).read_text())
torch.set_num_threads(1)
flare.init()
site = flare.get_site_name()
index = job["sites"].index(site)
x, target = site_tensors(Path(job["data"]), site)
model = network(job)
batches = Batches(len(x), job["batch"], 1000 + index)
while flare.is_running():
    received = flare.receive()
    model.load_state_dict({k: torch.as_tensor(v) for k, v in received.params.items()})
    compute_s = local_train(model, x, target, batches, job["local_steps"], job["lr"])
    log_round(Path(job["out"]), "nvflare", site, received.current_round, compute_s)
    flare.send(flare.FLModel(params={k: v.detach().clone() for k, v in model.state_dict().items()},
                             meta={"NUM_STEPS_CURRENT_ROUND": job["local_steps"]}))
