"""Scoring throughput at a hospital: ``fedauc predict`` against decoding plus the network alone.

N synthetic chest radiographs (VinDr-CXR DICOMs from the synthetic hospitals, 64 px tiles, the demo's
``small_resnet``) are scored two ways on the same files, in this process (``workers=0``), CPU time from
``getrusage`` (other load on a shared machine distorts wall time, much less CPU time):

* baseline: ``preprocessing.tiles.process_file`` on each file (decode, resize) and ``predict_scores`` on the
  tiles, in a loop: the least any scoring path pays;
* predict: ``pipelines.hospital.table.predict_to_table`` (chunks, DICOM header and UIDs, the view check,
  decisions, rows, a Parquet table written chunk by chunk).

Target: predict >= 0.8 x the baseline's images per CPU-second. Best of ``--rounds`` interleaved rounds.

Run: ``.venv/bin/python -m benchmarks.throughput.predict [--images 256] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from pathlib import Path

import numpy as np
import torch

from federated.network import build_named
from federated.predict import predict_scores
from pipelines.hospital.table import predict_to_table
from pipelines.model_package.contract import ModelContract
from pipelines.model_package.loading import Chosen
from pipelines.model_package.predict import Item, Scorer
from preprocessing.records import TASK_DISEASES
from preprocessing.synth import generate_site
from preprocessing.tiles import Chunk, process_file

TARGET = 0.8


def bench_scorer() -> Scorer:
    """The chest model both scoring benchmarks run: an untrained small_resnet at 64 x 64 (the rate and the memory
    do not depend on the weights)."""
    diseases = list(TASK_DISEASES["chest-xray"])
    contract = ModelContract(task="chest-xray", diseases=diseases, network="small_resnet", input_shape=(1, 64, 64),
                             image_size=64, min_image_size=16, channels=1, allowed_modalities=["CR", "DX", "DR"],
                             views=["AP", "PA"], code_version="benchmark")
    network = build_named("small_resnet", {}, (1, 64, 64), len(diseases))
    return Scorer.from_state(contract, network.state_dict(), "fedauc-chest-xray", "bench")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def baseline(scorer: Scorer, files: list[str], root: str) -> None:
    transform = scorer.contract.transform()
    chunk = Chunk("bench", 0, tuple(files), root)
    tiles = [process_file(chunk, i, transform)[0] for i in range(len(files))]
    predict_scores(scorer.network, np.stack(tiles), torch.device("cpu"), batch_size=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scorer = bench_scorer()
    diseases = scorer.contract.diseases
    with tempfile.TemporaryDirectory() as tmp:
        generate_site("vindr-cxr", Path(tmp) / "site", n=args.images, seed=7, workers=0, progress=False)
        root = str((Path(tmp) / "site").resolve())
        files = sorted(str(p) for p in Path(root).rglob("*.dicom"))
        chosen = Chosen("youden", dict.fromkeys(diseases, 0.5), "benchmark")
        best = {"baseline": 0.0, "predict": 0.0}
        for _ in range(args.rounds):
            start = cpu_seconds()
            baseline(scorer, files, root)
            best["baseline"] = max(best["baseline"], len(files) / (cpu_seconds() - start))
            start = cpu_seconds()
            counts = predict_to_table(scorer, (Item(f, root) for f in files), Path(tmp) / "out.parquet", chosen,
                                      batch_size=64, workers=0)
            best["predict"] = max(best["predict"], len(files) / (cpu_seconds() - start))
            assert counts == {"scored": len(files)}, counts
    ratio = best["predict"] / best["baseline"]
    print(f"{len(files)} DICOM radiographs, 64 px tiles, small_resnet, one thread, best of {args.rounds}:")
    print(f"  decode + forward alone: {best['baseline']:.1f} images per CPU-second")
    print(f"  fedauc predict:         {best['predict']:.1f} images per CPU-second")
    print(f"  ratio predict / (decode + forward): {ratio:.2f} (target >= {TARGET}) "
          f"{'OK' if ratio >= TARGET else 'BELOW TARGET'}")


if __name__ == "__main__":
    main()
