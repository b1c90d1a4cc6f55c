"""NVIDIA FLARE's own FedAvg for python -m benchmarks.peers: its PyTorch ``FedAvgRecipe`` (the FedAvg controller with
in-time aggregation, the PyTorch file persistor) run on its simulator (``SimEnv``, every client a thread of one
process, all K at once), the sites' loop in nvflare_client.py; the initial weights are the checkpoint every
system starts from. Run by the peers benchmark in a fresh process:
``python -m benchmarks.peers.systems.nvflare --one '<job JSON>'``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", required=True)
    job = json.loads(parser.parse_args().one)
    sys.argv = sys.argv[:1]  # the recipe reads --export from the command line
    from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe
    from nvflare.recipe import SimEnv

    torch.set_num_threads(1)
    out = Path(job["out"])
    (out / "job.json").write_text(json.dumps(job))
    recipe = FedAvgRecipe(
        name="peers-fedavg", min_clients=job["K"], num_rounds=job["rounds"],
        model={"class_path": "models.networks.SmallResNet",
               "args": {"num_classes": job["classes"], "in_channels": job["channels"]}},
        initial_ckpt=job["init"], train_script=str(HERE / "nvflare_client.py"),
        train_args=f"--job {out / 'job.json'}")
    env = SimEnv(clients=job["sites"], num_threads=job["K"], workspace_root=str(out / "workspace"))
    recipe.execute(env)
    found = sorted((out / "workspace").rglob("FL_global_model.pt"))
    if not found:
        raise SystemExit(f"NVFlare's FedAvg left no FL_global_model.pt under {out / 'workspace'}")
    saved = torch.load(found[-1], weights_only=False)
    state = saved.get("model", saved) if isinstance(saved, dict) else saved
    torch.save({k: torch.as_tensor(v) for k, v in state.items()}, out / "final.pt")
    model = {k: torch.as_tensor(v) for k, v in state.items()}
    print("RESULT " + json.dumps({"bytes": 2 * job["K"] * sum(t.numel() * t.element_size() for t in model.values())}))


if __name__ == "__main__":
    main()
