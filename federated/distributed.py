"""One site per process: ``torchrun --nproc-per-node K -m federated.distributed config.json --out result.pt``.

Across machines, run torchrun on each with ``--nnodes``, ``--node-rank`` and ``--rdzv-endpoint``; site
k of the config is the process of global rank k. The config is a ``TrainConfig`` as JSON (sites of
kind ``shard`` or ``synthetic``). Rank 0 writes the result (global model state and history) with
torch.save. A site that dies or stops answering makes every other site exit with status 1 and a
message naming the failed collective, after at most ``timeout_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from federated.backends import SiteFailure
from federated.config import TrainConfig
from federated.engine import Engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federated.distributed", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="TrainConfig as JSON")
    parser.add_argument("--out", type=Path, help="where rank 0 writes the TrainResult fields (torch.save)")
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.config.read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"{args.config}: cannot read the config: {err}", file=sys.stderr)
        return 2
    raw["backend"] = "distributed"
    config = TrainConfig.model_validate(raw)
    engine = Engine(config)
    try:
        result = engine.run()
    except SiteFailure as err:
        print(f"fedauc distributed: {err}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Immediate exit: tearing down a process group whose peer died can abort the interpreter
        # (gloo's destructor), which would replace this clear failure by a SIGABRT.
        os._exit(1)
    if args.out is not None and engine.is_leader:
        torch.save({"global_state": result.global_state, "history": result.history,
                    "input_shape": result.input_shape, "num_classes": result.num_classes}, args.out)
    engine.backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
