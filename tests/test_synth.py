"""Synthetic hospitals: determinism, real layouts ingested by the real adapters, labels, corruption."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from preprocessing.decode import ALLOWED_MODALITIES, decode_image
from preprocessing.federation import load_federation
from preprocessing.records import VIEWS
from preprocessing.scan import scan_site
from preprocessing.shards import shard_site
from preprocessing.sites import SiteConfigError, load_site
from preprocessing.synth import FORMATS, generate_federation, generate_site
from preprocessing.synth.chest import ChestFindings, render_chest
from preprocessing.synth.federation import site_data_dir
from preprocessing.synth.skin_sources import sample_siim

TASK = {fmt: "melanoma" if fmt == "siim-isic-2020" else "chest-xray" for fmt in FORMATS}


def _tree_digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _site(tmp_path, fmt, root, views=VIEWS, **extra):
    path = tmp_path / f"{fmt}.yaml"
    path.write_text(yaml.safe_dump({"name": fmt, "format": fmt, "root": str(root), "task": TASK[fmt],
                                    "views": list(views), "image_size": 64, **extra}))
    return load_site(path)


def test_same_seed_same_bytes_whatever_the_workers_and_another_seed_differs(tmp_path, public_metadata):
    one = generate_site("vindr-cxr", tmp_path / "a", n=12, seed=3, workers=0, progress=False)
    two = generate_site("vindr-cxr", tmp_path / "b", n=12, seed=3, workers=2, progress=False)
    other = generate_site("vindr-cxr", tmp_path / "c", n=12, seed=4, workers=0, progress=False)
    digest = _tree_digest(one.root)
    assert len(digest) == 13  # train.csv + 12 DICOMs
    assert digest == _tree_digest(two.root)
    assert _tree_digest(other.root) != digest


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_ingests_through_its_adapter_with_nothing_quarantined(tmp_path, public_metadata, fmt):
    result = generate_site(fmt, tmp_path / fmt, n=30, seed=1, workers=0, progress=False)
    config = _site(tmp_path, fmt, result.root)
    scanned = scan_site(config)
    assert scanned.input_rows == len(scanned.records) and len(scanned.quarantine) == 0
    if fmt != "vindr-cxr":  # VinDr's input row is an image, the CSV has one row per radiologist finding
        assert len(scanned.records) == 30
    for relative in scanned.records["image_path"]:
        decoded = decode_image(result.root / relative, channels=3 if TASK[fmt] == "melanoma" else 1,
                               allowed_modalities=ALLOWED_MODALITIES[TASK[fmt]])
        assert decoded.pixels.std() > 0.02  # an image, not a blank


def test_file_types_and_photometric_variety_match_the_releases(tmp_path, public_metadata):
    import pydicom
    from PIL import Image

    from federated.subgroups import vendor

    vindr = generate_site("vindr-cxr", tmp_path / "v", n=40, seed=0, workers=0, progress=False)
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in sorted((vindr.root / "train").glob("*.dicom"))]
    assert {h.PhotometricInterpretation for h in headers} == {"MONOCHROME1", "MONOCHROME2"}
    assert {int(h.BitsStored) for h in headers} <= {12, 14, 16} and all(h.Modality == "DX" for h in headers)
    # Two vendors the model card names (not "other"), so the demo's card compares manufacturers.
    assert {vendor(h.Manufacturer) for h in headers} == {"DRTECH", "Philips"}
    padchest = generate_site("padchest", tmp_path / "p", n=10, seed=0, workers=0, progress=False)
    png = next(padchest.root.rglob("*.png"))
    assert Image.open(png).mode.startswith("I;16")
    siim = generate_site("siim-isic-2020", tmp_path / "s", n=5, seed=0, workers=0, progress=False)
    ds = pydicom.dcmread(next((siim.root / "train").glob("*.dcm")))
    assert (ds.PhotometricInterpretation, ds.SamplesPerPixel, ds.Modality) == ("YBR_FULL_422", 3, "XC")
    assert ds.file_meta.TransferSyntaxUID == pydicom.uid.JPEGBaseline8Bit


def test_written_rows_are_real_public_rows_of_whole_patients(tmp_path, public_metadata):
    result = generate_site("nih-cxr14", tmp_path / "nih", n=300, seed=2, workers=0, progress=False)
    written = pd.read_csv(result.root / "Data_Entry_2017_v2020.csv", dtype=str, keep_default_na=False)
    source = pd.read_csv(public_metadata / "Data_Entry_2017_v2020.csv.gz", dtype=str, keep_default_na=False)
    merged = written.merge(source, how="left", indicator=True)
    assert (merged["_merge"] == "both").all()  # every written row is a real row, unchanged
    # Whole patients: every patient but the last sampled one has all of its real images.
    counts_written = written.groupby("Patient ID").size()
    counts_source = source[source["Patient ID"].isin(counts_written.index)].groupby("Patient ID").size()
    assert (counts_written != counts_source.reindex(counts_written.index)).sum() <= 1
    assert counts_written.max() > 1  # patients with several studies


def test_site_label_prevalence_matches_the_sampled_metadata(tmp_path, public_metadata):
    result = generate_site("chexpert", tmp_path / "chexpert", n=400, seed=5, workers=0, progress=False)
    config = _site(tmp_path, "chexpert", result.root, uncertain_policy=dict.fromkeys(("Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"), "ones"))
    records = scan_site(config).records
    train = pd.read_csv(result.root / "train.csv", dtype=str, keep_default_na=False)
    valid = pd.read_csv(result.root / "valid.csv", dtype=str, keep_default_na=False)
    for disease in ("Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"):
        from_csv = np.concatenate([train[disease].isin(["1.0", "-1.0"]), valid[disease] == "1.0"]).mean()
        assert records[disease].mean() == pytest.approx(from_csv)
    # Against the whole public table: whole-patient sampling keeps the prevalence within sampling error.
    source = pd.read_csv(public_metadata / "chexpert_train.csv.gz", usecols=["Pleural Effusion"], dtype=str,
                         keep_default_na=False)
    expected = (source["Pleural Effusion"] == "1.0").mean()
    observed = (train["Pleural Effusion"] == "1.0").mean()
    assert abs(observed - expected) < 4 * np.sqrt(expected * (1 - expected) / len(train)) * 2  # x2: patient clusters


def test_siim_prevalence_is_about_two_percent_with_sixteen_images_per_patient():
    table = sample_siim(20000, np.random.default_rng(0)).tables["train.csv"]
    assert table["target"].astype(int).mean() == pytest.approx(0.018, abs=0.003)
    assert table.groupby("patient_id").size().mean() == pytest.approx(16, rel=0.1)
    assert (table.loc[table["target"] == "1", "diagnosis"] == "melanoma").all()


@pytest.mark.parametrize("disease", ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"])
def test_a_disease_sign_adds_density_where_the_disease_lives(disease):
    healthy = render_chest(ChestFindings(), np.random.default_rng(7), 128, 128)
    sick = render_chest(ChestFindings(severity={disease: 0.8}), np.random.default_rng(7), 128, 128)
    difference = sick - healthy
    assert difference.sum() > 5.0  # a visible sign: more attenuation
    # Signs add density; what is lost (ribs under a raised hemidiaphragm in atelectasis) is marginal.
    assert -difference.clip(max=0).sum() < 0.1 * difference.clip(min=0).sum()
    milder = render_chest(ChestFindings(severity={disease: 0.2}), np.random.default_rng(7), 128, 128) - healthy
    assert milder.sum() < difference.sum()


def test_corrupted_files_are_quarantined_with_their_reasons(tmp_path, public_metadata):
    result = generate_site("nih-cxr14", tmp_path / "nih", n=60, seed=0, corrupt=0.1, workers=0, progress=False)
    assert len(result.corrupted) == 6
    again = generate_site("nih-cxr14", tmp_path / "nih2", n=60, seed=0, corrupt=0.1, workers=0, progress=False)
    pd.testing.assert_frame_equal(result.corrupted, again.corrupted)  # the same files, deterministically
    config = _site(tmp_path, "nih-cxr14", result.root)
    scanned = scan_site(config)
    summary = shard_site(config, scanned, tmp_path / "shards", workers=0, progress=False)
    quarantine = pd.read_parquet(summary.site_dir / "quarantine.parquet")
    # By file name: the NIH adapter cannot tell which images_0NN folder a deleted file was in.
    got = dict(zip(quarantine["record_id"], quarantine["reason"]))
    expected = dict(zip(result.corrupted["image_path"].str.rsplit("/", n=1).str[-1], result.corrupted["expected_reason"]))
    assert got == expected and set(expected.values()) == {"unreadable_file", "missing_file"}
    assert summary.kept == 54


def test_demo_federations_load_and_their_sites_are_where_the_yamls_point(tmp_path):
    chest = load_federation("sites/demo/chest.yaml")
    assert chest.task == "chest-xray" and [s.format for s in chest.sites] == ["chexpert", "nih-cxr14", "padchest", "vindr-cxr"]
    melanoma = load_federation("sites/demo/melanoma.yaml")
    assert len(melanoma.sites) == 3 and {s.format for s in melanoma.sites} == {"siim-isic-2020"}
    stanford = chest.sites[0]
    assert site_data_dir(stanford.root, "chexpert") == stanford.root.parent


def test_generate_federation_scales_and_writes_ingestible_sites(tmp_path, public_metadata):
    results = generate_federation("sites/demo/melanoma.yaml", tmp_path / "out", scale=0.01, seed=0, workers=0,
                                  progress=False)
    assert sorted(results) == ["barcelona", "new-york", "vienna"]
    federation = load_federation("sites/demo/melanoma.yaml")
    for site in federation.sites:
        config = site.model_copy(update={"root": results[site.name].root})
        scanned = scan_site(config)
        assert len(scanned.records) == 18 and len(scanned.quarantine) == 0
    assert next((tmp_path / "out" / "vienna" / "train").glob("*.dcm"))
    assert next((tmp_path / "out" / "barcelona" / "jpeg" / "train").glob("*.jpg"))
    # The federation's size: [104, 128] replaces the Barcelona profile's 144x176.
    with Image.open(next((tmp_path / "out" / "barcelona" / "jpeg" / "train").glob("*.jpg"))) as image:
        assert image.size == (128, 104)


def test_federation_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "fed.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "task": "melanoma", "sites": [
        {"config": "../../work/none.yaml"}, {"config": str(tmp_path / "n.yaml")}]}))
    (tmp_path / "n.yaml").write_text(yaml.safe_dump({"name": "n", "format": "nih-cxr14", "root": ".", "task": "chest-xray"}))
    with pytest.raises(SiteConfigError) as err:
        load_federation(bad)
    message = str(err.value)
    assert "site file not found" in message and "is a chest-xray site, the federation is melanoma" in message


def test_generate_site_refuses_to_mix_hospitals(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("someone's data")
    with pytest.raises(FileExistsError, match="not empty"):
        generate_site("siim-isic-2020", tmp_path / "x", n=3, progress=False)
    with pytest.raises(ValueError, match="unknown format"):
        generate_site("dicomdir", tmp_path / "y", n=3, progress=False)


@pytest.mark.parametrize("fmt", ["chexpert", "mimic-cxr-jpg", "nih-cxr14", "padchest", "vindr-cxr"])
def test_fallback_label_model_writes_the_same_columns_and_ingests(tmp_path, public_metadata, fmt):
    real = generate_site(fmt, tmp_path / "real", n=8, seed=0, workers=0, progress=False)
    fallback = generate_site(fmt, tmp_path / "fallback", n=40, seed=0, workers=0, progress=False, metadata="fallback")
    assert real.real_metadata and not fallback.real_metadata
    for csv in sorted(real.root.glob("*.csv")):
        real_header = pd.read_csv(csv, nrows=0).columns.tolist()
        assert pd.read_csv(fallback.root / csv.name, nrows=0).columns.tolist() == real_header
    scanned = scan_site(_site(tmp_path, fmt, fallback.root))
    assert len(scanned.quarantine) == 0 and len(scanned.records) > 0
    positives = scanned.records[["Cardiomegaly", "Consolidation", "Pleural Effusion"]].sum()
    assert positives.sum() > 0  # the latent model produces findings, not an all-normal hospital
