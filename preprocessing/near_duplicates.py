"""The same picture kept twice: an 8-bit PNG or JPEG export of a DICOM, a copy with new UIDs filed under another
patient, a rescaled copy. Byte-identical files are ``preprocessing.duplicates``; these differ in every byte
and are found from the decoded pixels.

The decode workers compute each image's ``preprocessing.perceptual_hash`` signature on the tile they already
made (no second decode): 143 low DCT coefficients of its rank thumbnail. Here each coefficient becomes a bit,
set where it exceeds the site's median of that coefficient, so that each bit splits the site's images in
halves and what all films share (the anatomy) sets none; a site of fewer than ``MIN_SITE_IMAGES`` images has
no reliable median, each image is cut at its own (Zauner's rule) and every pair is a candidate. Elsewhere two
images are candidates when at most ``MAX_DISTANCE`` of the 143 bits differ. A candidate pair is the same
picture only when the images themselves agree: their staged tiles' band-passed rank thumbnails
(``perceptual_hash.structure``) correlate at ``MIN_SAME_PICTURE`` or more, which refutes distinct films the
bits confuse. Both thresholds are measured (``benchmarks/studies/near_duplicates.py``, docs/quarantine.md
"Near-duplicates").

Candidates come from multi-index hashing (Norouzi, Punjani and Fleet, "Fast Search in Hamming Space with
Multi-Index Hashing", CVPR 2012), not from every pair: the bits are cut into ``BANDS`` bands, and two
signatures at most ``MAX_DISTANCE`` apart differ in at most ``MAX_DISTANCE // BANDS`` bits of one band at
least (pigeonhole). Each band's values are sorted once and probed with every flip of up to that many bits,
so the work grows with the number of images times the probes, and no match within the threshold is missed.

Policy (docs/quarantine.md): a match across patients or splits is a leak, and neither copy can be trusted to
be the right one, so both are quarantined NEAR_DUPLICATE, each naming the other; within one patient and split
(the same study exported twice) the first in record order stays and the other is quarantined. The hashes
live in the staging log only: they never reach a shard, the QC summary or the centre.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import numpy as np
import pandas as pd

from preprocessing.perceptual_hash import same_picture_score, signature_values, structure
from preprocessing.quarantine import Reason

MAX_DISTANCE = 20  # bits of 143; docs/quarantine.md "Near-duplicates" has the measured distances
MIN_SITE_IMAGES = 64  # signatures needed for a site median of each coefficient
BANDS = 7
# Correlation of the two images' band-passed rank thumbnails (perceptual_hash.structure) from which a candidate
# is the same picture: 8-bit re-exports of the demo phantoms measured 0.980 and up, distinct phantoms that the
# hash paired 0.961 at most, at tile sizes 64 and 224 (benchmarks/studies/near_duplicates.py prints both distributions).
MIN_SAME_PICTURE = 0.97


def signature_bits(signatures: list[str]) -> np.ndarray:
    """(n, 143) bool: each coefficient above the site's median of it (the image's own below MIN_SITE_IMAGES)."""
    values = np.stack([signature_values(signature) for signature in signatures])
    axis = 0 if len(values) >= MIN_SITE_IMAGES else 1
    return values > np.median(values, axis=axis, keepdims=True)


def matching_pairs(bits: np.ndarray, max_distance: int = MAX_DISTANCE) -> np.ndarray:
    """Every pair (i < j) of rows of ``bits`` at most ``max_distance`` apart, with that distance: an (n, 3)
    array sorted by i then j."""
    radius = max_distance // BANDS
    candidates = []
    for band in np.array_split(np.arange(bits.shape[1]), BANDS):
        keys = bits[:, band].astype(np.int64) @ (1 << np.arange(len(band), dtype=np.int64))
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        for flips in _flip_masks(len(band), radius):
            probe = keys ^ flips
            left, right = np.searchsorted(ordered, probe, "left"), np.searchsorted(ordered, probe, "right")
            counts = right - left
            firsts = np.repeat(np.arange(len(keys)), counts)
            # The positions left[i] .. right[i] - 1 of every probe, concatenated.
            offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            seconds = order[np.repeat(left, counts) + offsets]
            keep = firsts < seconds
            candidates.append(np.stack([firsts[keep], seconds[keep]], axis=1))
    pairs = np.unique(np.concatenate(candidates), axis=0) if candidates else np.empty((0, 2), dtype=np.int64)
    distances = (bits[pairs[:, 0]] != bits[pairs[:, 1]]).sum(axis=1)
    close = distances <= max_distance
    return np.column_stack([pairs[close], distances[close]]).astype(np.int64)


def _flip_masks(width: int, radius: int) -> list[int]:
    """Every ``width``-bit mask with at most ``radius`` bits set."""
    return [sum(1 << bit for bit in chosen) for r in range(radius + 1) for chosen in combinations(range(width), r)]


def candidate_pairs(bits: np.ndarray) -> np.ndarray:
    """The pairs the images themselves are then compared on, (i, j, bits apart): those within MAX_DISTANCE bits,
    or every pair at a site too small for a median of its own (its bits, cut at each image's own median, are
    too coarse to rule a pair out: an 8-bit rescaled JPEG of a film came 24 bits from it)."""
    if len(bits) >= MIN_SITE_IMAGES:
        return matching_pairs(bits)
    first, second = np.triu_indices(len(bits), 1)
    return np.column_stack([first, second, (bits[first] != bits[second]).sum(axis=1)]).astype(np.int64)


def verified_pairs(
    pairs: np.ndarray, content: Callable[[int], np.ndarray | None]
) -> list[tuple[int, int, int, float | None]]:
    """The candidate ``pairs`` that show the same picture, with their correlation (``perceptual_hash.structure``).
    ``content(i)``: image i's tile without padding, None where its staged tile is gone (a split finalized by an
    interrupted run): such a pair is decided by the bits alone, as within MAX_DISTANCE."""
    structures: dict[int, np.ndarray | None] = {}

    def structure_of(index: int) -> np.ndarray | None:
        if index not in structures:
            pixels = content(index)
            structures[index] = None if pixels is None else structure(pixels)
        return structures[index]

    same = []
    for i, j, distance in pairs:
        first, second = structure_of(int(i)), structure_of(int(j))
        if first is None or second is None:
            if distance <= MAX_DISTANCE:
                same.append((int(i), int(j), int(distance), None))
            continue
        score = same_picture_score(first, second)
        if score >= MIN_SAME_PICTURE:
            same.append((int(i), int(j), int(distance), score))
    return same


def quarantine_near_duplicates(
    splits: dict[str, pd.DataFrame],
    outcomes: dict[str, pd.DataFrame],
    tile: Callable[[str, int], np.ndarray | None],
) -> None:
    """Turn the outcomes of near-duplicate kept images into NEAR_DUPLICATE failures (in place), by the policy of
    the module docstring. Runs after the byte-identical pass, on what that pass kept. ``tile(split, row)``: the
    record's staged tile (None once gone); its outcome's ``content`` box cuts the padding off."""
    kept = []
    for name, part in splits.items():
        frame = outcomes[name]
        ok = frame["ok"].to_numpy(dtype=bool) & frame["dct"].notna().to_numpy()
        kept.append(pd.DataFrame({
            "split": name,
            "row": np.flatnonzero(ok),
            "dct": frame.loc[ok, "dct"].to_numpy(),
            "content": frame.loc[ok, "content"].to_numpy(),
            "patient_id": part.loc[ok, "patient_id"].astype(str).to_numpy(),
            "image_path": part.loc[ok, "image_path"].astype(str).to_numpy(),
            "source_row": part.loc[ok, "source_row"].astype(str).to_numpy(),
        }))
    files = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()
    if len(files) < 2:
        return

    def content(index: int) -> np.ndarray | None:
        split, row, box = files.at[index, "split"], files.at[index, "row"], files.at[index, "content"]
        pixels = tile(split, row)
        if pixels is None or not isinstance(box, list):
            return None
        top, left, height, width = box
        return np.asarray(pixels[top:top + height, left:left + width])

    pairs = verified_pairs(candidate_pairs(signature_bits(list(files["dct"]))), content)
    # The same pair may be reached through several images; each quarantined image names the first match.
    named: dict[int, tuple[int, int, float | None]] = {}
    for i, j, distance, score in pairs:
        first, second = files.iloc[i], files.iloc[j]
        if first["patient_id"] != second["patient_id"] or first["split"] != second["split"]:
            named.setdefault(i, (j, distance, score))
            named.setdefault(j, (i, distance, score))
        elif i not in named:
            named.setdefault(j, (i, distance, score))  # one study or patient exported twice: the first stays
    for index, (other, distance, score) in named.items():
        this, that = files.iloc[index], files.iloc[other]
        leak = this["patient_id"] != that["patient_id"] or this["split"] != that["split"]
        why = ("under another patient or in another split: neither is kept" if leak
               else "of the same patient and split, which stays")
        outcomes[this["split"]].loc[this["row"], ["ok", "reason", "detail"]] = [
            False,
            Reason.NEAR_DUPLICATE.value,
            f"{this['image_path']} ({this['split']}) shows the same picture as {that['image_path']} "
            f"({that['source_row']}, {that['split']}, {distance} of 143 signature bits differ"
            f"{'' if score is None else f', structure correlation {score:.3f}'}), {why}",
        ]
