"""The shard format has one owner (preprocessing/shard_format.py): the writer's output reads back, readers
refuse other format versions with the command that fixes them, and no other module spells the file names."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import preprocessing.shards as shards
from common.errors import DataError
from federated.data import load_shard
from preprocessing import shard_format
from preprocessing.quarantine import empty_quarantine
from preprocessing.records import CHEST_XRAY_DISEASES, RECORD_COLUMNS
from preprocessing.tiles import TransformSettings

REPO = Path(__file__).resolve().parents[1]
TRANSFORM = TransformSettings(task="chest-xray", image_size=16, min_image_size=8)


def _records(root: Path) -> pd.DataFrame:
    splits = ["train", "train", "train", "test"]
    for k in range(len(splits)):
        if not (root / f"{k}.png").exists():  # rewriting would change the files' mtime, and so the content hash
            # Each its own picture: one gray level with a bright corner at another brightness is the same picture
            # (a near_duplicate), and a constant image is quarantined (constant_image).
            pixels = np.random.default_rng(k).integers(0, 256, (20, 24)).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"{k}.png")
    records = pd.DataFrame({
        "record_id": [f"r{k}" for k in range(len(splits))], "source_row": [f"labels.csv:{k + 2}" for k in range(4)],
        "patient_id": [f"p{k}" for k in range(4)], "study_id": [f"s{k}" for k in range(4)],
        "image_path": [f"{k}.png" for k in range(4)], "view": "PA", "sex": "F", "age": 60.0, "split": splits,
    })
    for c, disease in enumerate(CHEST_XRAY_DISEASES):
        records[disease] = np.asarray([1.0, 0.0, np.nan, float(c % 2)], dtype=np.float32)
    assert list(records.columns[: len(RECORD_COLUMNS)]) == list(RECORD_COLUMNS)
    return records


def _write(tmp_path: Path) -> shards.ShardSummary:
    root = tmp_path / "data"
    root.mkdir(exist_ok=True)
    records = _records(root)
    digest = shards.content_hash(records, [], root, {"task": "chest-xray"}, TRANSFORM)
    return shards.write_site_shards(records, empty_quarantine(), site="hosp", data_root=root, out_dir=tmp_path / "out",
                                    transform=TRANSFORM, content_hash=digest, input_rows=4, workers=0, progress=False)


def _set_version(site_dir: Path, version) -> None:
    path = site_dir / shard_format.SHARD_FILE
    info = json.loads(path.read_text())
    if version is None:
        del info["format_version"]
    else:
        info["format_version"] = version
    path.write_text(json.dumps(info))


def test_the_writers_shard_reads_back_with_the_formats_dtypes(tmp_path):
    summary = _write(tmp_path)
    info = shard_format.read_shard_info(summary.site_dir)
    assert info["format_version"] == shard_format.FORMAT_VERSION
    assert shard_format.shard_content_hash(summary.site_dir) == summary.content_hash
    data = load_shard(summary.site_dir)
    assert (data.name, data.diseases, sorted(data.splits)) == ("hosp", CHEST_XRAY_DISEASES, ["test", "train"])
    assert data.train.images.dtype == shard_format.IMAGE_DTYPE and data.train.images.shape == (3, 16, 16)
    assert data.train.labels.dtype == shard_format.LABEL_DTYPE
    np.testing.assert_array_equal(data.train.labels[:, 0], [1.0, 0.0, np.nan])
    assert shard_format.read_split(summary.site_dir, "valid", CHEST_XRAY_DISEASES) is None


@pytest.mark.parametrize("version,written", [(0, "format v0"), (None, "no format version"),
                                             (shard_format.FORMAT_VERSION + 1, f"format v{shard_format.FORMAT_VERSION + 1}")])
def test_a_shard_of_another_format_version_is_refused_with_the_fix(tmp_path, version, written):
    site_dir = _write(tmp_path).site_dir
    _set_version(site_dir, version)
    with pytest.raises(DataError) as err:
        load_shard(site_dir)
    assert str(err.value).startswith(f"shards at {site_dir} were written by {written}, "
                                     f"this fedauc reads v{shard_format.FORMAT_VERSION}")
    assert err.value.fix.endswith(f"re-run `fedauc preprocess <the site's yaml> --out {site_dir.parent}` to write the "
                                  "site's shards again")
    if version == shard_format.FORMAT_VERSION + 1:
        assert err.value.fix.startswith("install the fedauc that wrote them")
    with pytest.raises(DataError, match="were written by"):
        shard_format.shard_content_hash(site_dir)


def test_a_new_format_version_rewrites_old_shards_instead_of_reusing_them(tmp_path, monkeypatch):
    first = _write(tmp_path)
    assert _write(tmp_path).reused
    monkeypatch.setattr(shards, "FORMAT_VERSION", shard_format.FORMAT_VERSION + 1)
    second = _write(tmp_path)
    assert not second.reused and second.content_hash != first.content_hash
    assert shard_format.load_shard_info(second.site_dir)["format_version"] == shard_format.FORMAT_VERSION + 1


def test_unfinished_or_unreadable_shards_are_data_errors_naming_the_file(tmp_path):
    with pytest.raises(DataError, match=r"not a finished site shard \(no shard.json"):
        load_shard(tmp_path)
    (tmp_path / shard_format.SHARD_FILE).write_text("{not json")
    with pytest.raises(DataError, match=r"shard.json: not valid JSON"):
        shard_format.read_shard_info(tmp_path)
    (tmp_path / shard_format.SHARD_FILE).write_text(json.dumps({"format_version": shard_format.FORMAT_VERSION,
                                                                "diseases": []}))
    with pytest.raises(DataError, match="field 'diseases' must be a non-empty list"):
        shard_format.read_shard_info(tmp_path)


def test_a_split_with_a_missing_partner_file_is_named(tmp_path):
    site_dir = _write(tmp_path).site_dir
    shard_format.images_path(site_dir, "test").unlink()
    with pytest.raises(DataError, match=r"test/images.npy: missing while the other file of split 'test' exists"):
        load_shard(site_dir)


def _python_files():
    for path in REPO.rglob("*.py"):
        relative = path.relative_to(REPO)
        if relative.parts[0] in {".venv", "tests"} or relative == Path("preprocessing/shard_format.py"):
            continue
        if any(part.startswith(".") for part in relative.parts):
            continue
        yield relative, path


def test_no_module_but_shard_format_spells_the_shard_file_names():
    names = {shard_format.SHARD_FILE, shard_format.IMAGES_FILE, shard_format.MANIFEST_FILE,
             shard_format.QUARANTINE_FILE, shard_format.IMAGE_STATS_FILE}
    offenders = []
    for relative, path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
            if text and (text in names or any(text.endswith("/" + name) for name in names)):
                offenders.append(f"{relative}:{node.lineno}: {text!r}")
    assert not offenders, "use preprocessing.shard_format instead of:\n" + "\n".join(offenders)
