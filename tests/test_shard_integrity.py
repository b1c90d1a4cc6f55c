"""Shards damaged after preprocessing (preprocessing/shard_integrity.py) are named before the first step:
a truncated or changed file, by its site, its path and the fix, in-process and at an NVIDIA FLARE site."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import federated
from common.errors import DataError
from federated.data import load_shard
from federated.flare.centre.job import FlareJobFailed, train_flare
from federated.sites import federation_config
from preprocessing.federation import load_federation
from preprocessing.shard_integrity import check_shard_files

pytestmark = pytest.mark.slow


@pytest.fixture()
def shards(melanoma_shards, tmp_path):
    root, federation = melanoma_shards
    shutil.copytree(root / "shards", tmp_path / "shards")
    return tmp_path / "shards", federation


def _info(site_dir):
    return json.loads((site_dir / "shard.json").read_text())


def test_the_writer_records_every_split_file_and_an_intact_shard_passes(shards):
    root, _ = shards
    info = _info(root / "vienna")
    assert set(info["files"]) == {f"{split}/{name}" for split in ("train", "valid", "test")
                                  for name in ("images.npy", "manifest.parquet")}
    check_shard_files(root / "vienna", info, full=True)


def test_a_truncated_image_file_is_named_in_process_and_at_a_flare_site(shards, tmp_path):
    root, federation = shards
    images = root / "barcelona" / "train" / "images.npy"
    size = images.stat().st_size
    with open(images, "r+b") as f:
        f.truncate(size - 100)
    fix = "re-run `fedauc preprocess <barcelona's site YAML>"
    with pytest.raises(DataError, match=rf"site 'barcelona': train/images.npy \(in {re.escape(str(images.parent.parent))}\) is truncated: {size - 100} bytes") as err:
        load_shard(root / "barcelona")
    assert fix in str(err.value)
    settings = dict(algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8, 16, 32]}, rounds=1,
                    local_steps=1, batch_size=8, progress=False, loader_workers=0, timeout_s=60, device="cpu",
                    checkpoint_dir=str(tmp_path / "checkpoints"))
    cfg = federation_config(load_federation(federation), root, settings)
    with pytest.raises(DataError, match=r"site 'barcelona': .* is truncated"):
        federated.train(cfg)
    with pytest.raises(FlareJobFailed, match=r"site 'barcelona'.*train/images.npy \(in <path at the site>\) is truncated") as err:
        train_flare(cfg, load_federation(federation), root, "sim", tmp_path / "sim", name="test-truncated")
    assert "mmap length" not in str(err.value)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_a_changed_file_is_named_by_its_size_header_or_hash(shards):
    root, _ = shards
    site = root / "new-york"
    manifest = site / "valid" / "manifest.parquet"
    original = manifest.read_bytes()
    manifest.write_bytes(original + b"x")
    with pytest.raises(DataError, match=rf"site 'new-york': valid/manifest.parquet \(in {re.escape(str(site))}\) was changed after preprocessing: "):
        load_shard(site)
    manifest.write_bytes(original)
    images = site / "test" / "images.npy"
    array = np.load(images)
    np.save(images, array[:-1])  # one image fewer: a well-formed file with the wrong shape
    with pytest.raises(DataError, match=rf"site 'new-york': {images.relative_to(site).as_posix()} \(in {re.escape(str(site))}\) holds uint8 \({len(array) - 1}, "):
        check_shard_files(site, _info(site))
    np.save(images, array ^ 1)  # same size and header, other pixels: only the full check sees it
    check_shard_files(site, _info(site))
    with pytest.raises(DataError, match=rf"site 'new-york': {images.relative_to(site).as_posix()} \(in {re.escape(str(site))}\) was changed after preprocessing: its content "
                                        r"no longer matches the SHA-256 in shard.json"):
        check_shard_files(site, _info(site), full=True)
