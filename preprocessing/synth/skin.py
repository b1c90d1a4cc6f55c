"""Dermoscopy phantoms: skin, hair and a pigmented lesion, seen through one clinic's dermatoscope.

The lesion follows the ABCD rule dermatologists use (Stolz et al., 1994): Asymmetry, Border
irregularity, Colour variety and Dermoscopic structures (here the blue-white veil). ``LesionTraits``
are drawn from distributions whose means move with malignancy but overlap, so that an atypical nevus
can look worse than a thin early melanoma, as in real dermoscopy. ``DermoscopeProfile`` is the clinic:
colour cast, vignette, circular field of view, blur, noise and JPEG-like softness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.ndimage import gaussian_filter

from preprocessing.synth.chest import _sigmoid, _smooth_noise


@dataclass(frozen=True)
class DermoscopeProfile:
    """One clinic's device. Every field is a property of the clinic, not of the patient."""

    height: int = 192
    width: int = 192
    colour_cast: tuple[float, float, float] = (1.0, 1.0, 1.0)  # per-channel gain
    vignette: float = 0.3  # darkening of the corners
    circular_field: bool = False  # contact dermatoscopes show a black disc border
    blur_px: float = 0.5
    noise: float = 0.015


@dataclass(frozen=True)
class LesionTraits:
    radius: float  # mean radius, fraction of the half image
    asymmetry: float  # elongation and off-centre lobes
    border: float  # irregularity of the outline (higher harmonics) and how ragged it is
    colours: int  # distinct colour regions, 1-4
    veil: float  # blue-white veil coverage, 0 for none
    darkness: float
    atypical_palette: bool  # extra colours drawn from black, red and blue-grey rather than browns


# Pigment colours in linear RGB: light brown, dark brown, black, red, blue-grey.
_PIGMENTS = np.array(
    [[0.62, 0.42, 0.28], [0.38, 0.22, 0.13], [0.12, 0.08, 0.07], [0.70, 0.30, 0.28], [0.42, 0.48, 0.60]],
    dtype=np.float32,
)


def sample_traits(malignant: bool, rng: np.random.Generator) -> LesionTraits:
    """ABCD traits, shifted towards atypia for melanomas, with wide overlap between the classes."""
    shift = 1.0 if malignant else 0.0
    return LesionTraits(
        radius=float(np.clip(rng.normal(0.34 + 0.08 * shift, 0.10), 0.12, 0.75)),
        asymmetry=float(np.clip(rng.normal(0.10 + 0.10 * shift, 0.08), 0.0, 0.45)),
        border=float(np.clip(rng.normal(0.07 + 0.07 * shift, 0.05), 0.0, 0.3)),
        colours=int(np.clip(rng.poisson(1.1 + 1.2 * shift) + 1, 1, 4)),
        veil=float(rng.uniform(0.15, 0.5)) if rng.random() < 0.08 + 0.35 * shift else 0.0,
        darkness=float(np.clip(rng.normal(0.5 + 0.15 * shift, 0.18), 0.1, 1.0)),
        atypical_palette=bool(rng.random() < 0.15 + 0.55 * shift),
    )


def render_skin(traits: LesionTraits, profile: DermoscopeProfile, rng: np.random.Generator) -> np.ndarray:
    """One dermoscopy image, uint8 (height, width, 3)."""
    height, width = profile.height, profile.width
    ys = np.linspace(-1.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(-width / height, width / height, width, dtype=np.float32)[None, :]
    shape = (height, width)

    # Skin: a patient tone (Fitzpatrick I-IV) with mottled erythema and fine texture.
    tone = float(rng.uniform(0.0, 1.0))
    skin_rgb = np.array([0.92 - 0.25 * tone, 0.74 - 0.28 * tone, 0.64 - 0.28 * tone], dtype=np.float32)
    mottle = 0.04 * _smooth_noise(rng, shape, 6) + 0.02 * gaussian_filter(rng.standard_normal(shape, dtype=np.float32), 1.0)
    image = skin_rgb[None, None, :] * (1.0 + mottle[..., None])
    image[..., 1:] -= 0.03 * np.clip(_smooth_noise(rng, shape, 4), 0, None)[..., None]  # redness

    # Lesion outline: a polar radius with low harmonics (asymmetry) and high ones (ragged border).
    cx, cy = (float(v) for v in rng.normal(0.0, 0.12, size=2))
    angle = np.arctan2(ys - cy, xs - cx)
    distance = np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2)
    outline = np.ones_like(angle)
    for k, amplitude in ((1, traits.asymmetry), (2, traits.asymmetry), (3, traits.border), (5, traits.border), (9, traits.border / 2)):
        outline += amplitude * rng.uniform(0.3, 1.0) * np.cos(k * angle + rng.uniform(0, 2 * np.pi))
    relative = distance / (traits.radius * outline)
    sharpness = 0.06 + 0.10 * rng.random() + 0.1 * traits.border  # malignant borders end more abruptly or fray
    lesion = _sigmoid((1.0 - relative) / sharpness)

    # Pigment: one base colour, then extra colour regions carved by low-frequency noise.
    base = _PIGMENTS[0] * (1 - traits.darkness) + _PIGMENTS[1] * traits.darkness
    pigment = np.broadcast_to(base, (*shape, 3)).copy()
    # Red and blue-grey regions are rarer in nevi, but not absent (irritated or regressing nevi).
    palette = np.array([1, 2, 3, 4]) if traits.atypical_palette else np.array([0, 1, 2])
    extra = rng.choice(palette, size=min(traits.colours - 1, len(palette)), replace=False)
    for colour in extra:
        region = _sigmoid((_smooth_noise(rng, shape, 5) - 0.45) / 0.08)[..., None]
        pigment = pigment * (1 - region) + _PIGMENTS[colour] * region
    # Pigment network: a faint reticular grid inside the lesion.
    network = np.abs(np.cos(xs * rng.uniform(50, 70) + 2 * _smooth_noise(rng, shape, 8)) * np.cos(ys * rng.uniform(50, 70)))
    pigment = pigment * (1.0 - 0.08 * network[..., None])
    if traits.veil:
        veil = _sigmoid((_smooth_noise(rng, shape, 4) - (1 - 2 * traits.veil)) / 0.1)[..., None] * 0.8
        pigment = pigment * (1 - veil) + np.array([0.62, 0.70, 0.82], dtype=np.float32) * veil
    image = image * (1 - lesion[..., None]) + pigment * lesion[..., None]

    image = _hair(image, rng, xs, ys)
    image = gaussian_filter(image, (profile.blur_px, profile.blur_px, 0)) if profile.blur_px else image
    radius = np.sqrt(xs**2 + ys**2)
    image = image * (1.0 - profile.vignette * np.clip(radius - 0.4, 0, None) ** 2)[..., None]
    image = image * np.asarray(profile.colour_cast, dtype=np.float32)
    image = image + profile.noise * rng.standard_normal(image.shape, dtype=np.float32)
    if profile.circular_field:
        image = image * _sigmoid((0.98 - radius) / 0.01)[..., None]
    return (np.clip(image, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


def _hair(image: np.ndarray, rng: np.random.Generator, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Dark, thin, gently curved hairs; their number varies from none to a dense patch."""
    count = int(rng.choice((0, 0, 0, 1, 2, 4, 8)))
    height = image.shape[0]
    for _ in range(count):
        theta = rng.uniform(0, np.pi)
        offset, bend, phase = rng.uniform(-1, 1), rng.uniform(-0.3, 0.3), rng.uniform(0, 2 * np.pi)
        along = xs * np.cos(theta) + ys * np.sin(theta)
        across = -xs * np.sin(theta) + ys * np.cos(theta) - offset - bend * np.sin(2 * along + phase)
        strand = _sigmoid((2.0 / height - np.abs(across)) / (0.7 / height)) * (np.abs(along - rng.uniform(-0.8, 0.8)) < rng.uniform(0.2, 0.7))
        image = image * (1 - 0.75 * strand[..., None])
    return image
