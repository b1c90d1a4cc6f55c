"""Acquisition profiles: what makes one hospital's images look unlike another's.

A chest profile is the X-ray chain and the file the hospital exports (``ChestProfile`` plus the file
settings below); a dermoscope profile is the clinic's device. Each public dataset has a default profile
modelled on what is known of its release (CheXpert: small JPEGs with burned-in text; NIH: 8-bit PNGs;
PadChest: 16-bit PNGs of 10 or 12 stored bits; VinDr: 12-16-bit DICOMs, some MONOCHROME1), and the
demo federation picks named profiles so that its sites differ the way real hospitals do.
"""

from __future__ import annotations

from dataclasses import dataclass

from preprocessing.synth.chest import ChestProfile
from preprocessing.synth.skin import DermoscopeProfile


@dataclass(frozen=True)
class ChestSite:
    xray: ChestProfile
    jpeg_quality: int = 90  # JPEG exports only
    monochrome1: float = 0.0  # DICOM exports: fraction of files stored inverted (MONOCHROME1)
    window: float = 0.5  # DICOM exports: fraction of files carrying WindowCenter/WindowWidth
    # DICOM exports: the Manufacturer tag's vendors with their share of the files, so that the model card's
    # manufacturer rows (federated/subgroups.py VENDORS) have something to compare; JPEG/PNG carry no tag.
    manufacturers: tuple[tuple[str, float], ...] = (("GE Healthcare", 1.0),)


@dataclass(frozen=True)
class SkinSite:
    device: DermoscopeProfile
    jpeg_quality: int = 92


CHEST_PROFILES: dict[str, ChestSite] = {
    # Stanford: portable-heavy ward films, soft contrast, burned-in side markers, small JPEG release.
    "stanford": ChestSite(ChestProfile(height=256, width=224, gamma=1.3, contrast=1.05, blur_px=0.9, noise=0.03,
                                       border=0.3, border_value=0.0, marker="R"), jpeg_quality=85),
    # Beth Israel: brighter, higher contrast, "PORTABLE" stamp, larger JPEGs.
    "bidmc": ChestSite(ChestProfile(height=256, width=256, gamma=0.85, contrast=1.25, brightness=0.04, blur_px=0.6,
                                    noise=0.02, border=0.2, border_value=1.0, marker="PORTABLE"), jpeg_quality=92),
    # NIH Clinical Center: 8-bit PNG, flat processing, no markers.
    "nih": ChestSite(ChestProfile(height=224, width=224, gamma=1.0, contrast=0.8, brightness=-0.05, blur_px=1.4,
                                  noise=0.025, heel_effect=0.08)),
    # San Juan: CR plates, strong unsharp look, low noise, white collimation borders.
    "san-juan": ChestSite(ChestProfile(height=288, width=256, gamma=0.8, contrast=1.5, blur_px=0.4, noise=0.015,
                                       border=0.5, border_value=1.0, marker="L")),
    # Hanoi (VinDr): DR detectors, high dynamic range, noisier, many MONOCHROME1 files.
    "hanoi": ChestSite(ChestProfile(height=256, width=256, gamma=1.5, contrast=0.95, blur_px=0.5, noise=0.05,
                                    heel_effect=0.02), monochrome1=0.35, window=0.6,
                   # VinDr pools two hospitals: two vendors, evenly, so that the demo's 160 test images give each
                   # vendor at least 10 Cardiomegaly positives and the card a vendor comparison.
                   manufacturers=(("DRTECH", 0.5), ("Philips Medical Systems", 0.5))),
}

SKIN_PROFILES: dict[str, SkinSite] = {
    # Vienna-like: contact polarised dermatoscope, round field, warm cast.
    "vienna": SkinSite(DermoscopeProfile(height=160, width=160, colour_cast=(1.06, 0.98, 0.88), vignette=0.5,
                                         circular_field=True, blur_px=0.6, noise=0.012)),
    # Barcelona-like: non-contact, rectangular field, cool cast, sharper.
    "barcelona": SkinSite(DermoscopeProfile(height=144, width=176, colour_cast=(0.92, 0.98, 1.08), vignette=0.2,
                                            blur_px=0.3, noise=0.02), jpeg_quality=88),
    # New York-like: bright, saturated, strong vignette, some blur.
    "new-york": SkinSite(DermoscopeProfile(height=160, width=160, colour_cast=(1.10, 1.02, 1.0), vignette=0.8,
                                           blur_px=0.9, noise=0.015), jpeg_quality=95),
}

# The profile each format uses unless told otherwise.
DEFAULT_PROFILE: dict[str, str] = {
    "chexpert": "stanford",
    "mimic-cxr-jpg": "bidmc",
    "nih-cxr14": "nih",
    "padchest": "san-juan",
    "vindr-cxr": "hanoi",
    "siim-isic-2020": "vienna",
}


def chest_profile(name: str) -> ChestSite:
    try:
        return CHEST_PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown chest profile {name!r}; expected one of {sorted(CHEST_PROFILES)}") from None


def skin_profile(name: str) -> SkinSite:
    try:
        return SKIN_PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown skin profile {name!r}; expected one of {sorted(SKIN_PROFILES)}") from None
