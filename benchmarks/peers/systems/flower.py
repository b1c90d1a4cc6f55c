"""Flower's FedAvg for python -m benchmarks.peers: its simulation (``run_simulation``: a ServerApp with the FedAvg
strategy, a ClientApp whose NumPyClient trains as every system of the peers benchmark does, clients as Ray actors), as
Flower's PyTorch quickstart builds it. Each client's resources are the machine's cores, so one client trains at a
time (as fedauc in-process trains its sites); a client's rows are read once per actor (a module-level cache,
as Flower's examples keep their partitions). Flower builds a client per round, so a site's batches are seeded
per round. Run in Flower's own environment: ``python -m benchmarks.peers.systems.flower --one '<job JSON>'``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

from benchmarks.peers.common import Batches, local_train, log_round, network, site_tensors

ROWS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def main() -> None:
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    parser = argparse.ArgumentParser()
    parser.add_argument("--one", required=True)
    job = json.loads(parser.parse_args().one)
    out = Path(job["out"])
    torch.set_num_threads(1)
    keys = list(network(job).state_dict())

    class Site(NumPyClient):
        def __init__(self, index: int):
            self.index, self.site = index, job["sites"][index]
            if self.site not in ROWS:
                ROWS[self.site] = site_tensors(Path(job["data"]), self.site)
            self.model = network(job)

        def fit(self, parameters, config):
            torch.set_num_threads(1)
            self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in zip(keys, parameters)})
            x, target = ROWS[self.site]
            round_ = int(config["round"])
            batches = Batches(len(x), job["batch"], 1000 + self.index + 7919 * round_)
            compute_s = local_train(self.model, x, target, batches, job["local_steps"], job["lr"])
            log_round(out, "flower", self.site, round_, compute_s)
            return [t.detach().numpy() for t in self.model.state_dict().values()], len(x), {}

    def client_fn(context: Context):
        return Site(int(context.node_config["partition-id"])).to_client()

    class SavingFedAvg(FedAvg):
        def aggregate_fit(self, server_round, results, failures):
            if failures:
                raise RuntimeError(f"round {server_round}: {len(failures)} Flower clients failed: {failures[:1]}")
            parameters, metrics = super().aggregate_fit(server_round, results, failures)
            if server_round == job["rounds"]:
                arrays = parameters_to_ndarrays(parameters)
                torch.save({k: torch.from_numpy(np.array(v)) for k, v in zip(keys, arrays)}, out / "final.pt")
            return parameters, metrics

    def server_fn(context: Context):
        init = [t.numpy() for t in network(job).state_dict().values()]
        strategy = SavingFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=job["K"],
                                min_available_clients=job["K"], initial_parameters=ndarrays_to_parameters(init),
                                on_fit_config_fn=lambda r: {"round": r})
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=job["rounds"]))

    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=job["K"],
                   backend_config={"client_resources": {"num_cpus": os.cpu_count(), "num_gpus": 0.0},
                                   "init_args": {"num_cpus": os.cpu_count()}})
    if not (out / "final.pt").exists():
        raise SystemExit("Flower's simulation ended before its last round (its log above says why)")
    state_bytes = sum(t.nbytes for t in (np.asarray(v) for v in network(job).state_dict().values()))
    print("RESULT " + json.dumps({"bytes": 2 * job["K"] * state_bytes}), flush=True)


if __name__ == "__main__":
    main()
