"""The same picture kept twice: an 8-bit PNG or JPEG export of a DICOM, a copy with new UIDs filed under another
patient, a rescaled copy. Byte-identical files are ``preprocessing.duplicates``; these differ in every byte
and are found from the decoded pixels.

The decode workers compute each image's ``preprocessing.perceptual_hash`` signature on the tile they already
made (no second decode): 143 low DCT coefficients of its rank thumbnail. Here each coefficient becomes a bit,
set where it exceeds the site's median of that coefficient, so that each bit splits the site's images in
halves and what all films share (the anatomy) sets none; a site of fewer than ``MIN_SITE_IMAGES`` images has
no reliable median and each image is cut at its own (Zauner's rule). Two images match when at most
``MAX_DISTANCE`` of the 143 bits differ; the threshold is measured (``benchmarks/near_duplicates.py``,
docs/quarantine.md "Near-duplicates").

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

from itertools import combinations

import numpy as np
import pandas as pd

from preprocessing.perceptual_hash import signature_values
from preprocessing.quarantine import Reason

MAX_DISTANCE = 20  # bits of 143; docs/quarantine.md "Near-duplicates" has the measured distances
MIN_SITE_IMAGES = 64  # signatures needed for a site median of each coefficient
BANDS = 7


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


def quarantine_near_duplicates(splits: dict[str, pd.DataFrame], outcomes: dict[str, pd.DataFrame]) -> None:
    """Turn the outcomes of near-duplicate kept images into NEAR_DUPLICATE failures (in place), by the policy of
    the module docstring. Runs after the byte-identical pass, on what that pass kept."""
    kept = []
    for name, part in splits.items():
        frame = outcomes[name]
        ok = frame["ok"].to_numpy(dtype=bool) & frame["dct"].notna().to_numpy()
        kept.append(pd.DataFrame({
            "split": name,
            "row": np.flatnonzero(ok),
            "dct": frame.loc[ok, "dct"].to_numpy(),
            "patient_id": part.loc[ok, "patient_id"].astype(str).to_numpy(),
            "image_path": part.loc[ok, "image_path"].astype(str).to_numpy(),
            "source_row": part.loc[ok, "source_row"].astype(str).to_numpy(),
        }))
    files = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()
    if len(files) < 2:
        return
    pairs = matching_pairs(signature_bits(list(files["dct"])))
    # The same pair may be reached through several images; each quarantined image names the first match.
    named: dict[int, tuple[int, int]] = {}
    for i, j, distance in pairs:
        first, second = files.iloc[i], files.iloc[j]
        if first["patient_id"] != second["patient_id"] or first["split"] != second["split"]:
            named.setdefault(i, (j, distance))
            named.setdefault(j, (i, distance))
        elif i not in named:
            named.setdefault(j, (i, distance))  # one study or patient exported twice: the first stays
    for index, (other, distance) in named.items():
        this, that = files.iloc[index], files.iloc[other]
        leak = this["patient_id"] != that["patient_id"] or this["split"] != that["split"]
        why = ("under another patient or in another split: neither is kept" if leak
               else "of the same patient and split, which stays")
        outcomes[this["split"]].loc[this["row"], ["ok", "reason", "detail"]] = [
            False,
            Reason.NEAR_DUPLICATE.value,
            f"{this['image_path']} ({this['split']}) shows the same picture as {that['image_path']} "
            f"({that['source_row']}, {that['split']}, {distance} of 143 signature bits differ), {why}",
        ]
