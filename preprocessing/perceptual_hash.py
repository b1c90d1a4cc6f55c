"""A perceptual signature of a decoded image, for finding the same picture in other bytes
(``preprocessing.near_duplicates``). The decode workers compute it on the tile they already made, so it
imports only numpy and Pillow (no pandas, no scipy: a worker pays each import once per process).

The signature follows the DCT hash of Zauner (2010), "Implementation and Benchmarking of Perceptual Image
Hash Functions": the image (the tile's padding cut off, colour as its mean) is area-averaged to 32 x 32 and
its 2-D DCT-II taken (orthonormal). Two changes to that recipe, both measured (``benchmarks/studies/near_duplicates.py``):
the 32 x 32 means are replaced by their ranks (ties share their mean rank) before the DCT, so any increasing
intensity map (another window, a gamma, an 8-bit export's rescaling) leaves it alone; and the 12 x 12 lowest
frequencies but the DC are kept as numbers (143), not yet bits. Zauner sets a bit where one of the 8 x 8
lowest exceeds the image's own median; on chest films most of those bits are the anatomy every film shares,
and distinct phantoms came within 4 bits of 64 where an 8-bit JPEG export of one film was up to 8 away.
``preprocessing.near_duplicates`` makes the bits against the site's own median of each coefficient instead.
A picture with too little structure to tell apart (a near-constant image, whose ranks are mostly ties) gets
no signature and is never matched.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

HASH_SIDE = 32  # Zauner's downsample
LOW = 12  # the LOW x LOW lowest frequencies are kept, the DC (a rank image's constant mean) left out
# Gray levels (of 255): a 32 x 32 thumbnail with less standard deviation than this gets no signature.
MIN_STRUCTURE = 2.0


def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix C: C @ x is the DCT of a length-n vector x."""
    k, i = np.arange(n)[:, None], np.arange(n)[None, :]
    matrix = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    matrix[0] /= np.sqrt(2.0)
    return matrix


_DCT = _dct_matrix(HASH_SIDE)


def mean_ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank from 0 among ``values`` (flattened), equal values sharing their mean rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts) - 1.0
    return (last - (counts - 1) / 2.0)[inverse.ravel()].reshape(values.shape)


def dct_signature(content: np.ndarray) -> str | None:
    """The 143 low DCT coefficients of an image's rank thumbnail (uint8, (H, W) or (H, W, 3), no padding) as the
    hex of their float16 bytes; None for a picture with too little structure to tell apart."""
    gray = content.astype(np.float32) if content.ndim == 2 else content.astype(np.float32).mean(axis=2)
    thumbnail = np.asarray(Image.fromarray(gray, mode="F").resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BOX))
    if float(thumbnail.std()) < MIN_STRUCTURE:
        return None
    coefficients = _DCT @ mean_ranks(thumbnail) @ _DCT.T
    return coefficients[:LOW, :LOW].ravel()[1:].astype(np.float16).tobytes().hex()


def signature_values(signature: str) -> np.ndarray:
    """The coefficients of a ``dct_signature``, float32."""
    return np.frombuffer(bytes.fromhex(signature), dtype=np.float16).astype(np.float32)


STRUCTURE_SIDE = 64  # the demo's tile size: the verification sees what a 64-pixel tile holds


def _box_mean(image: np.ndarray, width: int) -> np.ndarray:
    """Each pixel's mean over the ``width`` x ``width`` box around it, edges repeated."""
    padded = np.pad(image, width // 2, mode="edge")
    rows, cols = image.shape
    return sum(padded[i:i + rows, j:j + cols] for i in range(width) for j in range(width)) / width**2


# Gray levels (of 255): a pixel of the 64 x 64 thumbnail whose 3 x 3 neighbourhood varies less than this is flat
# (air, a collimator's black, a window's clipped white) and left out of the comparison where either image is flat.
FLAT = 1.0
MIN_TEXTURED_SHARE = 0.25  # below this share of textured pixels a pair is compared on every pixel


def structure(content: np.ndarray) -> np.ndarray | None:
    """What ``same_picture_score`` compares, a (2, 4096) float32 array: the image (uint8, no padding, colour as
    its mean) area-resized to 64 x 64, its values replaced by their ranks (any increasing intensity map leaves
    them alone) and band-passed (a 3-pixel box mean less a 9-pixel one: a difference of box filters after the
    difference of Gaussians of Marr and Hildreth, 1980); and each pixel's local spread in gray levels. None where
    nothing is left to compare.

    The band is where two films differ: below it every chest film shows the same anatomy (distinct phantoms
    correlate up to 0.99 on their rank thumbnails), above it a JPEG or a 1/4 rescale has destroyed the detail.
    The spread marks flat regions, where ranks turn an export's faint JPEG noise into large rank noise that the
    original, all ties there, does not have."""
    gray = content.astype(np.float32) if content.ndim == 2 else content.astype(np.float32).mean(axis=2)
    side = (STRUCTURE_SIDE, STRUCTURE_SIDE)
    thumbnail = np.asarray(Image.fromarray(gray, mode="F").resize(side, Image.Resampling.BOX), dtype=np.float64)
    ranks = mean_ranks(thumbnail)
    band = (_box_mean(ranks, 3) - _box_mean(ranks, 9)).ravel()
    spread = np.sqrt(np.maximum(_box_mean(thumbnail**2, 3) - _box_mean(thumbnail, 3) ** 2, 0.0)).ravel()
    return None if float(band.std()) < 1e-6 else np.stack([band, spread]).astype(np.float32)


def same_picture_score(first: np.ndarray, second: np.ndarray) -> float:
    """The correlation, in [-1, 1], of two ``structure`` bands over the pixels textured in both (every pixel when
    fewer than MIN_TEXTURED_SHARE are): 1 for the same picture in other bytes."""
    textured = (first[1] >= FLAT) & (second[1] >= FLAT)
    if textured.mean() < MIN_TEXTURED_SHARE:
        textured[:] = True
    a, b = first[0][textured], second[0][textured]
    a, b = a - a.mean(), b - b.mean()
    norms = float(np.sqrt((a @ a) * (b @ b)))
    return 0.0 if norms == 0.0 else float(a @ b) / norms
