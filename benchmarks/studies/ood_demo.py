"""Out-of-distribution refusal and calibration of a demo's champions, measured as ``fedauc predict`` scores
(issue 54 item 4).

The chest and melanoma champions of the store in ``--home`` (a ``FEDAUC_HOME`` the demo ran in) are loaded by
``pipelines.model_package.loading.load_registered`` and every file is scored by
``pipelines.model_package.predict.score_items``, the path ``fedauc predict`` takes (decoder, DICOM header
checks, network, Mahalanobis refusal). Each set of images is counted as refused (any reason, and the
out-of-distribution reason alone) out of scored:

* foreign images given to the chest champion (target: at least 99 % of each refused): ``--noise`` PNGs of five
  kinds (uniform, Gaussian, salt and pepper, smooth, RGB) at seeded sizes; blank frames (black, white, mid-gray);
  pydicom-data's RG3 (a CR of a lower leg) exported as PNG, with crops, flips and rotations; pydicom-data's CT
  slices exported as PNG at four windowings; the melanoma sites' test images (dermoscopy phantoms);
* the chest sites' test images given to the melanoma champion (the same target);
* the melanoma sites' test tiles under the colour casts of the drift test (tests/test_hospital_predict.py: a mild
  blue cast, darker, as a new dermoscope or light would give, and a strong one), given to the melanoma champion:
  no target, the refused share is what docs/algorithms.md section 15 discusses;
* each site's own test images given to its task's champion, its source files as the shard manifest lists them
  (target: at most the contract's stated false-refusal rate + 1 point), twice: with the registered threshold
  the federation read (federated/ood_fit.py: a hospital that did not train, or has not run ``fedauc
  thresholds``), and with the site's own threshold and calibration map, read on its validation split as
  ``fedauc thresholds`` reads them (``table.recalibrate``, applied by ``loading.with_refit``).

The calibration errors are read from the champion's contract: the pooled test split's ECE before and after the
Platt map, with their bootstrap intervals (pipelines/model_package/calibration.py).

Run: ``.venv/bin/python -m benchmarks.studies.ood_demo [--home /tmp/m54] [--noise 100]`` after
``[FEDAUC_HOME=/tmp/m54] fedauc demo`` (``--home``: the folder the demo ran in, by default this machine's).
"""

from __future__ import annotations

import argparse
import itertools
import platform
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
from PIL import Image
from pydicom.data import get_testdata_file

from common.errors import FedaucError
from common.home import fedauc_home
from federated.data import load_shard
from pipelines import tracking
from pipelines.hospital.table import recalibrate
from pipelines.model_package.loading import load_registered, with_refit
from pipelines.model_package.predict import OOD_COLUMN, OUT_OF_DISTRIBUTION, SCORED, Item, Scorer, score_items
from pipelines.store_uri import default_tracking_uri, tracking_uri
from preprocessing.federation import load_federation
from preprocessing.shard_format import manifest_path

FOREIGN_TARGET, FALSE_REFUSAL_MARGIN = 0.99, 0.01
FEDERATIONS = {"chest-xray": "sites/demo/chest.yaml", "melanoma": "sites/demo/melanoma.yaml"}
NOISE_KINDS = ("uniform", "gaussian", "salt-and-pepper", "smooth", "rgb")
# (centre, width) in Hounsfield units: lung, soft tissue, bone; None: the slice's own range.
CT_WINDOWS = {"lung": (-600, 1500), "soft tissue": (40, 400), "bone": (400, 1800), "full range": None}
CASTS = {"mild blue cast (gains 0.8, 0.85, 1.0)": (0.8, 0.85, 1.0),
         "strong blue cast (gains 0.35, 0.45, 1.0)": (0.35, 0.45, 1.0)}
CT_FILES = ("CT_small.dcm", "693_UNCI.dcm", "eCT_Supplemental.dcm", "J2K_pixelrep_mismatch.dcm",
            "bad_sequence.dcm", "explicit_VR-UN.dcm")


def _png(folder: Path, name: str, pixels: np.ndarray) -> Item:
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(folder / f"{name}.png")
    return Item(str(folder / f"{name}.png"), str(folder))


def _to_uint8(values: np.ndarray, low: float, high: float) -> np.ndarray:
    return (np.clip((values - low) / max(high - low, 1e-6), 0, 1) * 255 + 0.5).astype(np.uint8)


def noise_images(folder: Path, count: int) -> list[Item]:
    items = []
    for i in range(count):
        kind, rng = NOISE_KINDS[i % len(NOISE_KINDS)], np.random.default_rng(i)
        shape = (int(rng.integers(64, 513)), int(rng.integers(64, 513)))
        if kind == "uniform":
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        elif kind == "gaussian":
            pixels = _to_uint8(rng.normal(0.5, rng.uniform(0.05, 0.3), shape), 0, 1)
        elif kind == "salt-and-pepper":
            pixels = np.where(rng.random(shape) < rng.uniform(0.05, 0.5), 255, 0).astype(np.uint8)
            pixels[rng.random(shape) < 0.5] = 128
        elif kind == "smooth":  # blobs like anatomy's scale: coarse noise upsampled
            coarse = rng.random((8, 8)).astype(np.float32)
            pixels = np.asarray(Image.fromarray(_to_uint8(coarse, 0, 1)).resize(shape[::-1], Image.BICUBIC))
        else:
            pixels = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        items.append(_png(folder, f"{kind}-{i}", pixels))
    return items


def blank_images(folder: Path) -> list[Item]:
    return [_png(folder, f"{name}-{size}", np.full((size, size), value, dtype=np.uint8))
            for name, value in (("black", 0), ("white", 255), ("mid-gray", 128)) for size in (64, 256, 1024)]


def _variants(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """The image, four corner crops and two centre crops, each as is, flipped both ways and turned."""
    h, w = pixels.shape
    crops = {"full": pixels, "centre 60%": pixels[h // 5: h - h // 5, w // 5: w - w // 5],
             "centre 80%": pixels[h // 10: h - h // 10, w // 10: w - w // 10]}
    for name, (top, left) in {"top left": (0, 0), "top right": (0, w * 2 // 5), "bottom left": (h * 2 // 5, 0),
                              "bottom right": (h * 2 // 5, w * 2 // 5)}.items():
        crops[name] = pixels[top: top + h * 3 // 5, left: left + w * 3 // 5]
    return {f"{name}, {turn}": image for name, crop in crops.items() for turn, image in (
        ("as is", crop), ("left-right", crop[:, ::-1]), ("up-down", crop[::-1]), ("turned", np.rot90(crop)))}


def leg_images(folder: Path) -> list[Item]:
    ds = pydicom.dcmread(get_testdata_file("RG3_UNCI.dcm"))
    pixels = pydicom.pixels.apply_voi_lut(ds.pixel_array, ds).astype(np.float64)
    if ds.PhotometricInterpretation == "MONOCHROME1":
        pixels = pixels.max() - pixels
    exported = _to_uint8(pixels, pixels.min(), pixels.max())
    return [_png(folder, f"leg-{i}", np.ascontiguousarray(image)) for i, image in enumerate(_variants(exported).values())]


def ct_images(folder: Path) -> list[Item]:
    items = []
    for name in CT_FILES:
        ds = pydicom.dcmread(get_testdata_file(name))
        try:
            frames = ds.pixel_array
        except Exception as error:  # a codec this environment lacks: the others still count
            print(f"  {name}: not decoded here ({type(error).__name__}), left out")
            continue
        frames = frames.reshape(-1, *frames.shape[-2:])
        slope, intercept = float(ds.get("RescaleSlope", 1)), float(ds.get("RescaleIntercept", 0))
        for f, frame in enumerate(frames):
            hu = frame.astype(np.float64) * slope + intercept
            for window, setting in CT_WINDOWS.items():
                low, high = (hu.min(), hu.max()) if setting is None else (setting[0] - setting[1] / 2,
                                                                          setting[0] + setting[1] / 2)
                items.append(_png(folder, f"{Path(name).stem}-{f}-{window.replace(' ', '-')}", _to_uint8(hu, low, high)))
    return items


def cast_images(home: Path, folder: Path, gains: tuple[float, float, float]) -> list[Item]:
    """The melanoma sites' test tiles with each colour channel scaled by ``gains``, as PNGs."""
    federation = load_federation(home / FEDERATIONS["melanoma"])
    tiles = np.concatenate([load_shard(federation.shards / site.name).splits["test"].images for site in federation.sites])
    return [_png(folder, f"cast-{i}", (tile.astype(np.float32) * gains).clip(0, 255).astype(np.uint8))
            for i, tile in enumerate(tiles)]


def test_images(home: Path, task: str) -> dict[str, list[Item]]:
    """Each site's test split, as the source files its shard manifest lists, rooted at the site's data root."""
    federation = load_federation(home / FEDERATIONS[task])
    sets = {}
    for site in federation.sites:
        manifest = pd.read_parquet(manifest_path(federation.shards / site.name, "test"), columns=["image_path"])
        root = Path(site.root).resolve()
        sets[site.name] = [Item(str(root / path), str(root)) for path in manifest["image_path"]]
    return sets


def refitted(home: Path, task: str, scorer: Scorer) -> dict[str, Scorer]:
    """Per site, the scorer with the threshold and calibration map ``fedauc thresholds`` reads on its
    validation split, applied as predict applies the file it writes."""
    federation = load_federation(home / FEDERATIONS[task])
    out = {}
    for site in federation.sites:
        out[site.name] = with_refit(scorer, recalibrate(scorer, site, federation.shards / site.name))
    return out


def refusals(scorer: Scorer, items: list[Item]) -> dict:
    rows = pd.DataFrame(list(score_items(scorer, items, workers=0)))
    refused = rows["status"] != SCORED
    reasons = rows.loc[refused & (rows["reason"] != OUT_OF_DISTRIBUTION), "reason"].value_counts()
    return {"images": len(rows), "refused": int(refused.sum()), "ood": int((rows["reason"] == OUT_OF_DISTRIBUTION).sum()),
            "other": ", ".join(f"{reason} {n}" for reason, n in reasons.items()) or "-",
            "accepted": [(Path(source).name, distance) for source, distance in
                         zip(rows.loc[~refused, "source"], rows.loc[~refused, OOD_COLUMN])],
            # Refused for another reason, or farther than a threshold: what another threshold would refuse.
            "other_refused": int((refused & (rows["reason"] != OUT_OF_DISTRIBUTION)).sum()),
            "distances": rows[OOD_COLUMN].astype(float).to_numpy()}


def _line(model: str, images: str, counts: dict, target: str, met: bool | None) -> str:
    rate = counts["refused"] / counts["images"]
    return (f"| {model} | {images} | {counts['images']} | {rate:.1%} | {counts['ood']} | {counts['other']} | "
            f"{target} | {'-' if met is None else 'yes' if met else 'NO'} |")


def _ece(error) -> str:
    return "-" if error is None else f"{error.value:.3f} [{error.low:.3f}, {error.high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=fedauc_home(),
                        help="the FEDAUC_HOME the demo ran in (default: this machine's, as fedauc commands find it)")
    parser.add_argument("--noise", type=int, default=100, help="noise PNGs to score")
    args = parser.parse_args()
    home = args.home.resolve()
    if tracking_uri(home) == default_tracking_uri(home) and not (home / "mlruns.db").is_file():
        # MLflow would create an empty store there, then say it holds no champion.
        raise SystemExit(f"{home}: no fedauc store (mlruns.db)\n  fix: run `FEDAUC_HOME={home} fedauc demo` first")
    tracking.configure(home)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"store {home}; code {commit}; {platform.processor() or platform.machine()}, {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="fedauc-ood-") as scratch:
        scratch = Path(scratch)
        try:
            scorers = {task: load_registered(None, task, scratch / task) for task in FEDERATIONS}
        except FedaucError as error:
            raise SystemExit(str(error)) from None
        tests = {task: test_images(home, task) for task in FEDERATIONS}
        for task, scorer in scorers.items():
            ood = scorer.contract.ood
            print(f"{task}: {scorer.name} v{scorer.version}; threshold {ood.threshold:.2f}, stated false refusal "
                  f"{ood.target_false_refusal:.1%} (pooled validation {ood.valid_false_refusal:.1%}, pooled test "
                  f"{ood.test_false_refusal:.1%} from the federation's histograms)")
        foreign = {"chest-xray": {"noise": noise_images(scratch / "noise", args.noise),
                                  "blank": blank_images(scratch / "blank"),
                                  "lower-leg CR (RG3) as PNG": leg_images(scratch / "leg"),
                                  "CT slices as PNG": ct_images(scratch / "ct"),
                                  "dermoscopy (melanoma sites' test)": list(itertools.chain(*tests["melanoma"].values()))},
                   "melanoma": {"chest radiographs (chest sites' test)": list(itertools.chain(*tests["chest-xray"].values()))}}
        casts = {name: cast_images(home, scratch / f"cast-{i}", gains) for i, (name, gains) in enumerate(CASTS.items())}
        print("\n| model | images | n | refused | of which OOD | other reasons | target | met |\n|---|---|---|---|---|---|---|---|")
        accepted, foreign_counts = [], {}
        for task, sets in foreign.items():
            for name, items in sets.items():
                counts = foreign_counts[task, name] = refusals(scorers[task], items)
                print(_line(task, name, counts, f">= {FOREIGN_TARGET:.0%}", counts["refused"] >= FOREIGN_TARGET * counts["images"]))
                accepted += [f"{task} scored {file} ({name}) at distance {distance:.2f}" for file, distance in counts["accepted"]]
        for name, items in casts.items():
            foreign_counts["melanoma", name] = counts = refusals(scorers["melanoma"], items)
            print(_line("melanoma", name, counts, "none: drift, not foreign", None))
        own_scorers = {task: refitted(home, task, scorer) for task, scorer in scorers.items()}
        # The same foreign images at each site's own threshold (the same distances: only the threshold moves).
        print("\n| model | images | refused at each site's own threshold |\n|---|---|---|")
        for (task, name), counts in foreign_counts.items():
            print(f"| {task} | {name} | " + "; ".join(
                f"{site} ({own.contract.ood.threshold:.2f}) "
                f"{(counts['other_refused'] + int((counts['distances'] > own.contract.ood.threshold).sum())) / counts['images']:.1%}"
                for site, own in own_scorers[task].items()) + " |")
        for task, sites in tests.items():
            limit = scorers[task].contract.ood.target_false_refusal + FALSE_REFUSAL_MARGIN
            for threshold in ("pooled", "own"):
                pooled = {"images": 0, "refused": 0, "ood": 0}
                for site, items in sites.items():
                    scorer = scorers[task] if threshold == "pooled" else own_scorers[task][site]
                    counts = refusals(scorer, items)
                    print(_line(task, f"{site}'s own test, {threshold} threshold {scorer.contract.ood.threshold:.2f}",
                                counts, f"<= {limit:.0%}", counts["refused"] <= limit * counts["images"]))
                    pooled = {k: pooled[k] + counts[k] for k in pooled}
                print(_line(task, f"pooled own test, {threshold} thresholds", {**pooled, "other": "see sites"},
                            f"<= {limit:.0%}", pooled["refused"] <= limit * pooled["images"]))
        print("\nForeign images scored, not refused:" if accepted else "", *accepted, sep="\n  ")
        print("\n| model | disease | test ECE before | test ECE after |\n|---|---|---|---|")
        for task, scorer in scorers.items():
            calibration = scorer.contract.calibration
            for disease, fitted in calibration.diseases.items():
                print(f"| {task} | {disease} | {_ece(fitted.test_before)} | {_ece(fitted.test_after)} |")
            for disease, why in calibration.undefined.items():
                print(f"| {task} | {disease} | no map: {why} | |")
            for site, own in own_scorers[task].items():
                for disease, fitted in own.contract.calibration.diseases.items():
                    print(f"| {task}, {site}'s own map | {disease} | {_ece(fitted.test_before)} | {_ece(fitted.test_after)} |")


if __name__ == "__main__":
    main()
