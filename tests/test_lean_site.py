"""A hospital's job process loads what a site needs and nothing of the centre's: no MLflow, Prefect or plotting,
no scipy or scikit-learn (the site's metrics are numpy), no fedauc ``pipelines``; nor what only its preprocessing
needs (pandas, the DICOM and image decoders, the site YAML's dataset adapters). Checked in a fresh process that
loads what NVIDIA FLARE loads for a site (``federated.flare.site.job``) and then does a site's work: an engine
training with its evaluation on real shards, and the site's report on its data."""

from __future__ import annotations

import json
import subprocess
import sys

CENTRE_ONLY = ("mlflow", "prefect", "matplotlib", "scipy", "sklearn", "pipelines", "torchvision", "seaborn")
# The hospital's preprocessing reads its tables and decodes its images; its training process reads shards only
# (pyarrow for the manifests' labels), and every simulated site would hold these again (about 50 MB each).
PREPROCESSING_ONLY = ("pandas", "pydicom", "PIL", "preprocessing.sites", "preprocessing.adapters")

SITE_WORK = """
import json, resource, sys
from pathlib import Path
import federated.flare.site.job  # what a hospital's job process loads
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
from federated import ShardSite, TrainConfig, train
from federated.sites import site_report
from preprocessing.sharing import SharingPolicy
shards = Path(sys.argv[1])
names = sys.argv[2:]
config = TrainConfig(algorithm="codasca", params={"T0": 2}, sites=[ShardSite(name=n, path=shards / n) for n in names],
                     network="small_resnet", network_kwargs={"widths": [8, 16, 32]}, rounds=2, local_steps=2,
                     batch_size=16, eval_every=1, progress=False, loader_workers=0, device="cpu")
result = train(config)
report = site_report(names[0], shards / names[0], SharingPolicy(), result.input_shape, result.num_classes)
assert "valid/pooled/auc_macro" in result.history[-1]["metrics"] and report["site"] == names[0]
print(json.dumps({"modules": sorted(sys.modules), "import_rss_mb": imported,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def test_a_site_process_loads_nothing_of_the_centres(melanoma_shards):
    root, _ = melanoma_shards
    done = subprocess.run([sys.executable, "-c", SITE_WORK, str(root / "shards"), "vienna", "barcelona"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = sorted({m.split(".")[0] for m in out["modules"]} & set(CENTRE_ONLY))
    assert loaded == [], f"a site process loaded {loaded}"
    loaded = sorted(set(out["modules"]) & set(PREPROCESSING_ONLY))
    assert loaded == [], f"a site's training process loaded {loaded}"
    # The check can fail: the centre's MLflow module, the preprocessing's QC report (pandas) are one import away.
    probe = subprocess.run([sys.executable, "-c", "import sys, federated.flare.site.job, pipelines.runs, preprocessing.qc; "
                            "print('mlflow' in sys.modules, 'pandas' in sys.modules)"],
                           capture_output=True, text=True, timeout=300)
    assert probe.stdout.strip() == "True True"
