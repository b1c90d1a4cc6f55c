"""Which files a generic layout decodes, as docs/datasets.md section 9 states it: by what a file holds, never by
the layout or the file's extension (so generic-csv decodes DICOM too), a preamble-less DICOM only under a DICOM
name, and everything else quarantined with its reason. One hospital export of every kind, through the real
adapter, decoder and shard writer."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from PIL import Image
from test_decode import write_dicom

from preprocessing.decode import inspect_file
from preprocessing.quarantine import Reason
from preprocessing.scan import scan_site
from preprocessing.shards import shard_site
from preprocessing.sites import SiteConfig


def picture(seed: int) -> np.ndarray:
    """A 12-bit image of its own: each file's content differs, so none is a duplicate of another."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 4096, (64, 80), dtype=np.uint16)
    pixels[8 + seed % 20: 30 + seed % 20, 10:40] = 4000
    return pixels


def eight_bit(seed: int) -> Image.Image:
    return Image.fromarray((picture(seed) >> 4).astype(np.uint8))


def pillow_bytes(seed: int, file_format: str) -> bytes:
    buffer = io.BytesIO()
    eight_bit(seed).save(buffer, format=file_format)
    return buffer.getvalue()


def write_export(folder) -> dict[str, str]:
    """The export's files; returns what each is, by the name the labels CSV gives it."""
    folder.mkdir()
    write_dicom(folder / "a.dcm", picture(1), modality="CR")
    write_dicom(folder / "b.img", picture(2), modality="CR")  # a DICOM file under another extension
    (folder / "c.dcm").write_bytes(pillow_bytes(3, "PNG"))  # a PNG that calls itself DICOM
    (folder / "d.png").write_bytes(pillow_bytes(4, "PNG"))
    (folder / "e.jpg").write_bytes(pillow_bytes(5, "JPEG"))
    (folder / "f.tif").write_bytes(pillow_bytes(6, "TIFF"))
    part10 = write_dicom(folder / "g-source.dcm", picture(7), modality="CR").read_bytes()
    (folder / "g-source.dcm").unlink()
    (folder / "g.dcm").write_bytes(part10[132:])  # no preamble, no DICM: a DICOM name makes it one
    (folder / "h.raw").write_bytes(part10[132:])  # the same without a DICOM name: nothing says what it is
    (folder / "i.gif").write_bytes(pillow_bytes(9, "GIF"))
    (folder / "j.dcm").write_bytes(write_dicom(folder / "j.dcm", picture(10), modality="CR").read_bytes()[:600])
    write_dicom(folder / "k.dcm", picture(11), modality="CT")
    return {"a.dcm": "dicom", "b.img": "dicom", "c.dcm": "png", "d.png": "png", "e.jpg": "jpeg", "f.tif": "tiff",
            "g.dcm": "dicom"}


def test_generic_csv_decodes_each_file_by_its_content(tmp_path):
    decoded_as = write_export(tmp_path / "export")
    names = sorted(p.name for p in (tmp_path / "export").iterdir())
    rows = [f"{name},P{i},{i % 2}" for i, name in enumerate(names)]
    (tmp_path / "labels.csv").write_text("file,mrn,cardio\n" + "\n".join(rows) + "\n")
    config = SiteConfig.model_validate({
        "name": "clinic", "format": "generic-csv", "root": tmp_path, "task": "chest-xray", "image_size": 32,
        "min_image_size": 16, "split": {"seed": 0, "valid": 0.2, "test": 0.2},
        "options": {"labels_csv": "labels.csv", "path_column": "file", "image_dir": "export",
                    "patient_column": "mrn", "default_view": "PA",
                    "label_columns": {"Cardiomegaly": "cardio"}}})
    summary = shard_site(config, scan_site(config), tmp_path / "shards", workers=0, progress=False)

    site_dir = tmp_path / "shards" / "clinic"
    kept = pd.concat([pd.read_parquet(p) for p in site_dir.glob("*/manifest.parquet")])["image_path"]
    assert sorted(kept) == sorted(f"export/{name}" for name in decoded_as)
    quarantine = pd.read_parquet(site_dir / "quarantine.parquet").set_index("image_path")
    assert quarantine["reason"].to_dict() == {
        "export/h.raw": Reason.UNREADABLE_FILE.value, "export/i.gif": Reason.UNREADABLE_FILE.value,
        "export/j.dcm": Reason.UNREADABLE_FILE.value, "export/k.dcm": Reason.WRONG_MODALITY.value}
    assert "not a DICOM, PNG, JPEG or TIFF file (starts with b'\\x02\\x00" in quarantine.loc["export/h.raw", "detail"]
    assert (summary.input_rows, summary.kept, summary.quarantined) == (11, 7, 4)
    # What `fedauc inspect` reports: the decoder the content chose, whatever the name says.
    assert {name: inspect_file(tmp_path / "export" / name)["format"] for name in decoded_as} == decoded_as
