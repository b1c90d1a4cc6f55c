"""The README's picture of the phantoms: one row per hospital, one column per disease, then the clinics.

Run: ``.venv/bin/python -m preprocessing.synth.grid docs/phantoms.png``. Every image is drawn with the
same patient seed along a row, so the columns differ only by the disease sign (severity 0.8), and with
the same seed down a column, so the rows differ only by the hospital's acquisition.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from preprocessing.records import CHEST_XRAY_DISEASES
from preprocessing.synth.chest import ChestFindings, acquire, render_chest, upsample
from preprocessing.synth.profiles import CHEST_PROFILES, SKIN_PROFILES
from preprocessing.synth.skin import render_skin, sample_traits

SEVERITY = 0.8


def phantom_grid(path: str | Path, seed: int = 3) -> Path:
    columns = ("No finding", *CHEST_XRAY_DISEASES)
    chest_rows = list(CHEST_PROFILES)
    skin_rows = list(SKIN_PROFILES)
    figure, axes = plt.subplots(len(chest_rows) + len(skin_rows), len(columns),
                                figsize=(1.9 * len(columns), 1.9 * (len(chest_rows) + len(skin_rows))))
    for r, name in enumerate(chest_rows):
        xray = CHEST_PROFILES[name].xray
        for c, disease in enumerate(columns):
            findings = ChestFindings(severity={} if c == 0 else {disease: SEVERITY})
            anatomy = np.random.default_rng([seed, 0])
            density = render_chest(findings, anatomy, max(96, xray.height // 2), max(96, xray.width // 2))
            image = acquire(upsample(density, xray.height, xray.width), xray, np.random.default_rng([seed, 1]))
            axes[r, c].imshow(image, cmap="gray", vmin=0, vmax=1)
            if r == 0:
                axes[r, c].set_title(disease, fontsize=9)
        axes[r, 0].set_ylabel(name, fontsize=9)
    skin_titles = ("benign", "benign", "benign", "melanoma", "melanoma", "melanoma")
    for r, name in enumerate(skin_rows, start=len(chest_rows)):
        for c in range(len(columns)):
            malignant = skin_titles[c % len(skin_titles)] == "melanoma"
            rng = np.random.default_rng([seed, 2, c])
            axes[r, c].imshow(render_skin(sample_traits(malignant, rng), SKIN_PROFILES[name].device, rng))
            if r == len(chest_rows):
                axes[r, c].set_xlabel(skin_titles[c], fontsize=9)
                axes[r, c].xaxis.set_label_position("top")
        axes[r, 0].set_ylabel(name, fontsize=9)
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


if __name__ == "__main__":
    print(phantom_grid(sys.argv[1] if len(sys.argv) > 1 else "docs/phantoms.png"))
