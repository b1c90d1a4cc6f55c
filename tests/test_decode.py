"""Decoding and resizing on real files written with pydicom and Pillow; expected values from first principles."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.sequence import Sequence
from pydicom.uid import (
    MPEG2MPML,
    BasicTextSRStorage,
    DigitalXRayImageStorageForPresentation,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)
from typer.testing import CliRunner

from pipelines.cli import app
from preprocessing.decode import ALLOWED_MODALITIES, DecodeError, decode_image, inspect_file
from preprocessing.quarantine import Reason
from preprocessing.resize import resize_to_square

CHEST = ALLOWED_MODALITIES["chest-xray"]


def _dataset(sop_class=DigitalXRayImageStorageForPresentation, modality="DX") -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID
    if modality is not None:
        ds.Modality = modality
    return ds


def write_dicom(path, pixels, photometric="MONOCHROME2", bits_stored=12, compress=None, modality="DX", **tags):
    ds = _dataset(modality=modality)
    ds.set_pixel_data(pixels, photometric, bits_stored)
    for keyword, value in tags.items():
        setattr(ds, keyword, value)
    if compress is not None:
        ds.compress(compress)
    ds.save_as(path, enforce_file_format=True)
    return path


def ramp(rows=70, columns=90, high=4095) -> np.ndarray:
    values = np.linspace(0, high, rows * columns).round().astype(np.uint16)
    return values.reshape(rows, columns)


def test_12_bit_monochrome2_is_min_max_scaled_within_bits_stored(tmp_path):
    stored = ramp() // 2 + 100  # 100 .. 2147: the image does not fill its 12 bits
    decoded = decode_image(write_dicom(tmp_path / "a.dcm", stored), allowed_modalities=CHEST)
    expected = (stored.astype(np.float64) - 100) / (2147 - 100)
    np.testing.assert_allclose(decoded.pixels, expected, atol=1e-6)
    assert decoded.pixels.dtype == np.float32
    assert (decoded.info.bits_stored, decoded.info.intensity, decoded.info.inverted) == (12, "minmax", False)
    assert (decoded.info.raw_min, decoded.info.raw_max) == (100.0, 2147.0)


def test_12_bit_keeps_precision_below_8_bits(tmp_path):
    # Neighbouring 12-bit values must stay distinct until the final quantisation.
    stored = np.array([[0, 1, 2, 4095]] * 64, dtype=np.uint16).repeat(16, axis=1)
    decoded = decode_image(write_dicom(tmp_path / "a.dcm", stored))
    assert len(np.unique(decoded.pixels)) == 4
    assert decoded.pixels[0, 16] == pytest.approx(1 / 4095, rel=1e-6)


def test_monochrome1_is_inverted(tmp_path):
    stored = ramp()
    decoded = decode_image(write_dicom(tmp_path / "m1.dcm", stored, photometric="MONOCHROME1"))
    np.testing.assert_allclose(decoded.pixels, 1.0 - stored / 4095.0, atol=1e-6)
    assert decoded.info.inverted and decoded.info.photometric == "MONOCHROME1"
    # High stored values are dark in MONOCHROME1: the brightest stored pixel becomes black.
    assert decoded.pixels.flat[-1] == 0.0 and decoded.pixels.flat[0] == 1.0


def test_rescale_and_window_follow_dicom_linear_formula(tmp_path):
    stored = ramp()
    slope, intercept, center, width = 2.0, -1024.0, 1500.0, 3001.0
    path = write_dicom(
        tmp_path / "w.dcm",
        stored,
        RescaleSlope=slope,
        RescaleIntercept=intercept,
        WindowCenter=center,
        WindowWidth=width,
    )
    decoded = decode_image(path)
    # PS3.3 C.11.2.1.2.1 (LINEAR), output range [0, 1]:
    hu = stored.astype(np.float64) * slope + intercept
    expected = np.clip((hu - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)
    np.testing.assert_allclose(decoded.pixels, expected, atol=1e-5)
    assert decoded.info.intensity == "window"
    assert (decoded.pixels == 0).any() and (decoded.pixels == 1).any()  # the window clips both ends


def test_voi_lut_sequence_is_applied_and_scaled_by_its_table(tmp_path):
    stored = ramp(high=255).astype(np.uint16)
    item = Dataset()
    item.add_new("LUTDescriptor", "US", [256, 0, 16])
    table = (np.arange(256) ** 2 // 64).astype(np.uint16)  # a non-linear (gamma-like) lookup table
    item.add_new("LUTData", "OW", table.astype("<u2").tobytes())
    path = write_dicom(tmp_path / "lut.dcm", stored, bits_stored=8, VOILUTSequence=Sequence([item]))
    decoded = decode_image(path)
    np.testing.assert_allclose(decoded.pixels, table[stored] / table.max(), atol=1e-6)
    assert decoded.info.intensity == "voi_lut"


@pytest.mark.parametrize("syntax", [RLELossless, JPEG2000Lossless], ids=["rle", "jpeg2000"])
def test_compressed_transfer_syntaxes_decode_losslessly(tmp_path, syntax):
    stored = ramp()
    plain = decode_image(write_dicom(tmp_path / "plain.dcm", stored))
    packed = decode_image(write_dicom(tmp_path / "packed.dcm", stored, compress=syntax))
    np.testing.assert_array_equal(packed.pixels, plain.pixels)
    assert packed.info.transfer_syntax == syntax.name


@pytest.mark.parametrize(
    "name",
    ["MR_small_jpeg_ls_lossless.dcm", "MR_small_RLE.dcm", "MR_small_jp2klossless.dcm", "MR_small_bigendian.dcm"],
)
def test_real_compressed_files_from_other_encoders_match_the_uncompressed_original(name):
    # Files written by other toolkits (shipped with pydicom): JPEG-LS needs pylibjpeg-libjpeg.
    reference = decode_image(get_testdata_file("MR_small.dcm"))
    decoded = decode_image(get_testdata_file(name))
    np.testing.assert_array_equal(decoded.pixels, reference.pixels)
    assert decoded.info.intensity == "window" and decoded.info.modality == "MR"
    with pytest.raises(DecodeError) as err:
        decode_image(get_testdata_file(name), allowed_modalities=CHEST)
    assert err.value.reason is Reason.WRONG_MODALITY


def _smooth_rgb(rows=64, columns=96) -> np.ndarray:
    y, x = np.mgrid[0:rows, 0:columns]
    return np.stack([x * 2, y * 3, np.full_like(x, 120)], axis=-1).astype(np.uint8)


def test_jpeg_ybr_full_422_dermoscopy_dicom_becomes_rgb(tmp_path):
    rgb = _smooth_rgb()
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=95)
    ds = _dataset(SecondaryCaptureImageStorage, modality="XC")
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.Rows, ds.Columns = rgb.shape[:2]
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "YBR_FULL_422", 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = encapsulate([buffer.getvalue()])
    ds["PixelData"].VR = "OB"
    ds.save_as(tmp_path / "derm.dcm", enforce_file_format=True)

    decoded = decode_image(tmp_path / "derm.dcm", allowed_modalities=ALLOWED_MODALITIES["melanoma"])
    assert decoded.pixels.shape == (64, 96, 3)
    # JPEG is lossy: RGB within a few levels; decoding as YCbCr without conversion would be off by ~100.
    assert np.abs(decoded.pixels * 255 - rgb).mean() < 2.0
    assert decoded.info.transfer_syntax == JPEGBaseline8Bit.name
    gray = decode_image(tmp_path / "derm.dcm", channels=1).pixels
    np.testing.assert_allclose(gray, decoded.pixels @ np.array([0.299, 0.587, 0.114]), atol=1e-5)


def test_transfer_syntax_without_a_decoder_is_unsupported(tmp_path):
    ds = _dataset()
    ds.file_meta.TransferSyntaxUID = MPEG2MPML  # video: no pixel data decoder exists for it
    ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = 64, 64, 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = encapsulate([b"\x00\x00\x01\xb3" + b"\x00" * 60])
    ds["PixelData"].VR = "OB"
    ds.save_as(tmp_path / "video.dcm", enforce_file_format=True)
    with pytest.raises(DecodeError) as err:
        decode_image(tmp_path / "video.dcm")
    assert err.value.reason is Reason.UNSUPPORTED_TRANSFER_SYNTAX and "MPEG2" in err.value.detail


def test_truncated_dicom_is_unreadable(tmp_path):
    path = write_dicom(tmp_path / "full.dcm", ramp())
    data = path.read_bytes()
    (tmp_path / "cut.dcm").write_bytes(data[: len(data) - 5000])
    with pytest.raises(DecodeError) as err:
        decode_image(tmp_path / "cut.dcm")
    assert err.value.reason is Reason.UNREADABLE_FILE and "cut.dcm" in err.value.detail


def test_garbage_is_unreadable(tmp_path):
    (tmp_path / "junk.dcm").write_bytes(b"this is not a dicom file at all" * 10)
    (tmp_path / "junk.bin").write_bytes(b"\x00\x01" * 100)
    for name in ("junk.dcm", "junk.bin"):
        with pytest.raises(DecodeError) as err:
            decode_image(tmp_path / name)
        assert err.value.reason is Reason.UNREADABLE_FILE


def test_structured_report_is_not_an_image(tmp_path):
    ds = _dataset(BasicTextSRStorage, modality="SR")
    ds.save_as(tmp_path / "sr.dcm", enforce_file_format=True)
    with pytest.raises(DecodeError) as err:
        decode_image(tmp_path / "sr.dcm")
    assert err.value.reason is Reason.NOT_AN_IMAGE and "Basic Text SR" in err.value.detail


def test_wrong_modality_and_absent_modality(tmp_path):
    ct = write_dicom(tmp_path / "ct.dcm", ramp(), modality="CT")
    with pytest.raises(DecodeError) as err:
        decode_image(ct, allowed_modalities=CHEST)
    assert err.value.reason is Reason.WRONG_MODALITY and "'CT'" in err.value.detail
    untagged = write_dicom(tmp_path / "none.dcm", ramp(), modality=None)
    assert decode_image(untagged, allowed_modalities=CHEST).info.modality is None


def test_missing_and_too_small(tmp_path):
    with pytest.raises(DecodeError) as err:
        decode_image(tmp_path / "absent.png")
    assert err.value.reason is Reason.MISSING_FILE
    Image.fromarray(np.zeros((40, 200), dtype=np.uint8)).save(tmp_path / "thin.png")
    with pytest.raises(DecodeError) as err:
        decode_image(tmp_path / "thin.png", min_size=64)
    assert err.value.reason is Reason.IMAGE_TOO_SMALL and "40x200" in err.value.detail


def test_png_8_and_16_bit_and_jpeg(tmp_path):
    eight = (ramp(high=255)).astype(np.uint8)
    Image.fromarray(eight).save(tmp_path / "8.png")
    np.testing.assert_array_equal(decode_image(tmp_path / "8.png").pixels, eight / np.float32(255))

    # PadChest: 12 bits stored in a 16-bit PNG; min-max, not /65535 (which would leave it at 1/16 brightness).
    sixteen = ramp(high=4000) + 50
    Image.fromarray(sixteen).save(tmp_path / "16.png")
    decoded = decode_image(tmp_path / "16.png")
    np.testing.assert_allclose(decoded.pixels, (sixteen - 50.0) / 4000.0, atol=1e-6)
    assert decoded.info.bits_stored == 16 and decoded.info.intensity == "minmax"

    rgb = _smooth_rgb()
    Image.fromarray(rgb).save(tmp_path / "lesion.jpg", quality=95)
    decoded = decode_image(tmp_path / "lesion.jpg", channels=3)
    assert decoded.info.format == "jpeg" and decoded.pixels.shape == (64, 96, 3)
    assert np.abs(decoded.pixels * 255 - rgb).mean() < 2.0
    assert decode_image(tmp_path / "8.png", channels=3).pixels.shape == (70, 90, 3)


def test_truncated_png_is_unreadable(tmp_path):
    Image.fromarray(ramp(high=255).astype(np.uint8)).save(tmp_path / "ok.png")
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError) as err:
        decode_image(tmp_path / "cut.png")
    assert err.value.reason is Reason.UNREADABLE_FILE


def test_resize_keeps_aspect_ratio_and_pads_centred():
    image = np.ones((100, 50), dtype=np.float32)
    tile = resize_to_square(image, 20)
    assert tile.pixels.shape == (20, 20) and tile.pixels.dtype == np.uint8
    assert tile.content == (0, 5, 20, 10)
    assert (tile.pixels[:, 5:15] == 255).all()
    assert (tile.pixels[:, :5] == 0).all() and (tile.pixels[:, 15:] == 0).all()

    wide = resize_to_square(np.full((30, 90, 3), 0.5, dtype=np.float32), 30)
    assert wide.pixels.shape == (30, 30, 3) and wide.content == (10, 0, 10, 30)
    assert (wide.pixels[10:20] == 128).all() and (wide.pixels[:10] == 0).all()


def test_resize_averages_when_downscaling():
    # A 1-pixel checkerboard averages to mid-gray when antialiased; point sampling would keep 0/255.
    board = (np.indices((64, 64)).sum(axis=0) % 2).astype(np.float32)
    tile = resize_to_square(board, 16)
    assert np.abs(tile.pixels.astype(int) - 128).max() <= 2


def test_inspect_reports_decoding_and_errors(tmp_path):
    path = write_dicom(tmp_path / "m1.dcm", ramp(), photometric="MONOCHROME1", compress=RLELossless)
    summary = inspect_file(path)
    assert summary["modality"] == "DX" and summary["photometric"] == "MONOCHROME1"
    assert summary["inverted"] is True and summary["bits_stored"] == 12
    assert summary["shape"] == [70, 90] and summary["dtype"] == "float32"
    assert (summary["min"], summary["max"], summary["error"]) == (0.0, 1.0, None)
    assert summary["transfer_syntax"] == RLELossless.name

    runner = CliRunner()
    result = runner.invoke(app, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == summary
    result = runner.invoke(app, ["inspect", str(tmp_path / "absent.dcm")])
    assert result.exit_code == 1
    assert "missing_file" in result.output
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0 and "MONOCHROME1" in result.output and "inverted" in result.output


def test_tiff_8_and_16_bit(tmp_path):
    Image.fromarray(ramp(high=255).astype(np.uint8)).save(tmp_path / "eight.tif")
    Image.fromarray(ramp(high=4095).astype(np.uint16)).save(tmp_path / "sixteen.tif", compression="tiff_lzw")
    eight = decode_image(tmp_path / "eight.tif")
    assert (eight.info.format, eight.info.intensity) == ("tiff", "fixed")
    np.testing.assert_allclose(eight.pixels, ramp(high=255) / 255.0, atol=1e-6)
    sixteen = decode_image(tmp_path / "sixteen.tif")
    assert (sixteen.info.format, sixteen.info.bits_stored, sixteen.info.intensity) == ("tiff", 16, "minmax")
    np.testing.assert_allclose(sixteen.pixels, ramp(high=4095) / 4095.0, atol=1e-6)
