"""The demo: synthetic hospitals in the real formats, onboarded, preprocessed, trained, logged, compared.

``fedauc demo`` / ``make demo`` run the ``demo`` flow with these defaults, sized for a 2-core CPU in
under 15 minutes. A second run reuses the generated data and the shards (nothing changed, nothing redone).
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from pipelines import flows, tracking
from pipelines.tables import markdown_table
from preprocessing.federation import load_federation
from preprocessing.synth import generate_federation

PROJECT_DIR = Path(__file__).resolve().parents[1]
CHEST = PROJECT_DIR / "sites" / "demo" / "chest.yaml"
MELANOMA = PROJECT_DIR / "sites" / "demo" / "melanoma.yaml"
DEMO_DATA = PROJECT_DIR / "demo_data"

# What every demo training shares (a federated.TrainConfig without sites and algorithm).
BASE_CONFIG = {
    "network": "small_resnet",
    "rounds": 40,
    "local_steps": 8,
    "batch_size": 32,
    "seed": 0,
    "eval_every": 5,
    "guarantee_positives": True,
}

# (federation, algorithm, algorithm params, overrides of BASE_CONFIG). Learning rates: each algorithm's best
# pooled validation macro-AUC on the demo chest federation (docs/sweeps.md, "Demo learning rates").
DEMO_TRAININGS = [
    (CHEST, "codasca", {"T0": 160}, {"lr": 1.0}),
    (CHEST, "localscgdam", {}, {"lr": 1.0}),
    (CHEST, "fedxl2", {}, {"lr": 0.3}),
    (CHEST, "fedavg", {}, {"lr": 0.3}),
    (MELANOMA, "codasca", {"T0": 160}, {"lr": 1.0}),
]


def ensure_generated(federation_yaml: Path, scale: float, seed: int) -> bool:
    """Generate the federation's synthetic hospitals unless the same ones are already on disk.

    Regenerating would rewrite every image (new mtimes, new content hash, new shards), so a marker beside
    the data records what was generated. Returns True when it generated.
    """
    federation = load_federation(federation_yaml)
    wanted = {"spec": json.loads(federation.spec.model_dump_json()), "scale": scale, "seed": seed}
    marker = DEMO_DATA / f".generated-{federation.name}.json"
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return False
    generate_federation(federation_yaml, scale=scale, seed=seed)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(wanted, indent=2))
    return True


@flow(name="demo")
def demo(scale: float = 1.0, seed: int = 0, rounds: int | None = None) -> str:
    """Generate, onboard, preprocess, train (CODASCA, LocalSCGDAM, FeDXL2, FedAvg on chest; CODASCA on
    melanoma), evaluate the champions and return the comparison tables as Markdown."""
    shards = DEMO_DATA / "shards"
    for federation_yaml in (CHEST, MELANOMA):
        ensure_generated(federation_yaml, scale, seed)
        for site in load_federation(federation_yaml).sites:
            flows.onboard_site(str(site.source))
        flows.preprocess_federation(str(federation_yaml), str(shards))
    for federation_yaml, algorithm, params, overrides in DEMO_TRAININGS:
        config = {**BASE_CONFIG, **overrides, "algorithm": algorithm, "params": params}
        if rounds is not None:
            config["rounds"] = rounds
        flows.train_federated(str(federation_yaml), str(shards), config, f"{algorithm}-I{config['local_steps']}")
    tables = []
    for federation_yaml in (CHEST, MELANOMA):
        flows.evaluate(str(federation_yaml), str(shards))
        task = load_federation(federation_yaml).task
        # One federation per demo experiment, all finished: its name heads the table instead of three columns.
        table = tracking.compare_runs(task).drop(columns=["federation", "sites", "status"])
        tables.append(f"## {task}\n\n" + markdown_table(table))
    return "\n".join(tables)
