"""One site per process, one data centre: ``torchrun --nproc-per-node K -m federated.distributed config.json
--out result.pt``.

For many GPUs or machines inside one trust domain (plain TCP, no identities: across hospitals use the
NVFlare consortium, infra/README.md). On one machine the process of local rank k holds site k. Across
machines every process names its site (``--site <name>``): the rendezvous assigns ranks in arrival order,
so a rank says nothing about the site, and the transport maps sites to ranks by these names. The config is
a ``TrainConfig`` as JSON (sites of kind ``shard`` or ``synthetic``; ``fedauc train --backend torchrun``
writes one from a federation YAML). The process holding site 0 writes the result (global model state
and history) with torch.save. A site that dies or stops answering makes every other site exit with
status 1 and a message naming the failed collective, after at most ``timeout_s``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from common.errors import ConfigError, FedaucError
from federated import ood
from federated.backends import DistributedTransport, SiteFailure
from federated.config import TensorSite, TrainConfig
from federated.engine import Engine
from federated.network import training_device
from federated.sites import site_index, site_names


def _check_same_config(config: TrainConfig, transport: DistributedTransport) -> None:
    """Every process must train the same job: a process started with another learning rate or algorithm
    would otherwise be averaged in silently. Shard paths may differ between machines; site names may not."""
    job = json.loads(config.model_dump_json(exclude={"sites", "device"}))
    job["sites"] = site_names(config)
    digest = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).digest()
    mine = torch.tensor(list(digest), dtype=torch.uint8, device=transport.device)[None]
    everyone = transport.gather([mine])
    differing = [name for name, row in zip(job["sites"], everyone) if not torch.equal(row, everyone[0])]
    if differing:
        raise ConfigError(f"the processes of site(s) {', '.join(differing)} run another config than site "
                          f"{job['sites'][0]!r}'s", fix="start every process with the same config JSON")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federated.distributed", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="TrainConfig as JSON")
    parser.add_argument("--out", type=Path, help="where site 0's process writes the TrainResult fields (torch.save)")
    parser.add_argument("--site", help="the site this process trains, by name (needed across machines; "
                                       "default: the site of the local rank)")
    args = parser.parse_args(argv)
    # Without it an NCCL collective whose peer died blocks forever instead of timing out; read by the process
    # group this process starts (DistributedTransport), so set here, at the process's entry.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        raw = json.loads(args.config.read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"{args.config}: cannot read the config: {err}", file=sys.stderr)
        return 2
    try:
        config = TrainConfig.model_validate(raw)
        if any(isinstance(s, TensorSite) for s in config.sites):
            raise ConfigError("sites of kind 'tensor' live in the process that made them; one site per process "
                              "needs 'shard' or 'synthetic' sites", fix="write the sites' data as shards")
        site = None if args.site is None else site_index(config, args.site)
        device = training_device(config, int(os.environ.get("LOCAL_RANK", "0")))
        if config.dp is not None:
            # Before the process group exists: Opacus (the ledger's accountant) imports torch.distributed's
            # sharding modules, and imported while a group is up they keep it referenced, so that
            # destroy_process_group no longer frees it and gloo's threads run into interpreter exit, where
            # tearing them down aborts the ranks (SIGABRT, "terminate called without an active exception").
            import opacus.accountants  # noqa: F401
        transport = DistributedTransport(config.timeout_s, device, site)
        _check_same_config(config, transport)
        engine = Engine(config, transport)
    except FedaucError as err:
        print(f"fedauc distributed: {err}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # as below: the process group may be up, and its teardown can abort the interpreter
    try:
        result = engine.run()
    except (SiteFailure, FedaucError) as err:  # a FedaucError: every process stops with it (a diverged round)
        print(f"fedauc distributed: {err}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Immediate exit: tearing down a process group whose peer died can abort the interpreter
        # (gloo's destructor), which would replace this clear failure by a SIGABRT.
        os._exit(1)
    if args.out is not None and engine.is_leader:
        torch.save({"global_state": result.global_state, "history": result.history,
                    "input_shape": result.input_shape, "num_classes": result.num_classes,
                    "ood": ood.to_saved(result.ood)}, args.out)
    engine.transport.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
