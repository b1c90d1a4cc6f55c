"""Resize a decoded image to a square uint8 tile, keeping its aspect ratio.

Choice: **pad, never crop.** The longer side is scaled to ``size`` and the shorter side is centred and
padded with black. Cropping to a square would cut off what sits at the image borders and decides labels:
the costophrenic angles at the bottom corners of a chest film (the first sign of a pleural effusion) and
the border of a lesion in a dermoscopy photo (irregular borders are a melanoma criterion). Black padding
matches the background of both modalities (air after MONOCHROME1 inversion, the dark vignette of a
dermatoscope), so it adds no bright edge a network could key on.

Interpolation: on float32 ("F" mode) planes, Pillow first averages k x k blocks (k the integer part of
the reduction factor, ``reducing_gap=1``; ``box_reduce`` lets a decoder do this step before converting to
numpy) and then applies its bilinear filter, whose support it widens by the remaining factor. Both steps
average, so downscaling a 3000-pixel film to 224 is antialiased (no moire from rib edges), a triangle filter never overshoots [0, 1] the way Lanczos can, and the block averaging
makes a 1024 -> 224 resize about 4x cheaper than the full-support filter (it was a third of the decode
time). Quantisation to 8 bits is the very last step, so the 16-bit precision of the decoded image reaches
the averaging.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

RESIZE_MODE = "pad"
INTERPOLATION = "box-reduce+bilinear"


@dataclass(frozen=True)
class Tile:
    pixels: np.ndarray  # uint8, (size, size) or (size, size, 3)
    content: tuple[int, int, int, int]  # (top, left, height, width) of the image inside the padding


def resize_to_square(image: np.ndarray, size: int) -> Tile:
    """Scale ``image`` (float32 in [0, 1], (H, W) or (H, W, 3)) so its longer side is ``size``; pad to square."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(f"expected an (H, W) or (H, W, 3) image, got shape {image.shape}")
    height, width = image.shape[:2]
    new_height, new_width = content_size(height, width, size)
    planes = [image] if image.ndim == 2 else [image[..., c] for c in range(3)]
    resized = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(plane, dtype=np.float32), mode="F").resize(
                (new_width, new_height), Image.Resampling.BILINEAR, reducing_gap=1.0
            )
        )
        for plane in planes
    ]
    content = resized[0] if image.ndim == 2 else np.stack(resized, axis=2)

    top = (size - new_height) // 2
    left = (size - new_width) // 2
    tile = np.zeros((size, size) + image.shape[2:], dtype=np.uint8)
    tile[top : top + new_height, left : left + new_width] = quantize(content)
    return Tile(tile, (top, left, new_height, new_width))


def content_size(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) of the image inside a ``size`` tile: the longer side becomes ``size``."""
    scale = size / max(height, width)
    return max(1, min(size, round(height * scale))), max(1, min(size, round(width * scale)))


def box_reduce(plane: Image.Image, size: int) -> Image.Image:
    """The block averaging ``resize_to_square`` starts with (Pillow's ``reducing_gap=1``: k x k blocks, k the
    integer part of the reduction factor), on one float ("F") plane whose sides are multiples of the same k.

    A decoder that holds a Pillow image applies it before converting to numpy, so the full-size float array
    is never made; ``resize_to_square`` then finds nothing left to average: the same tile up to float32 rounding.
    Other planes are left alone: Pillow weighs partial edge blocks by a fractional source box, and computes
    the tile's aspect from the original sides, neither of which a numpy array can carry.
    """
    new_height, new_width = content_size(plane.height, plane.width, size)
    factor_x, factor_y = plane.width // new_width or 1, plane.height // new_height or 1
    if factor_x == 1 or factor_x != factor_y or plane.width % factor_x or plane.height % factor_y:
        return plane
    return plane.reduce((factor_x, factor_y))


def quantize(image: np.ndarray) -> np.ndarray:
    """[0, 1] float to uint8 by rounding to the nearest of 256 levels."""
    return np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
