"""fedauc's benchmarks, one sub-package per family, each run from the repository's root with ``python -m``:

- ``claims``: the README's claims on melanoma phantoms through the real pipeline (``python -m benchmarks.claims``;
  the AUC-M schedule: ``python -m benchmarks.claims.stagewise``; claim (a) on a heterogeneous federation:
  ``python -m benchmarks.claims.window``), written into docs/claims.md.
- ``studies``: the quality studies behind a default or a threshold (``python -m benchmarks.studies.<name>``).
- ``throughput``: speed and memory of preprocessing, training, scoring and start-up
  (``python -m benchmarks.throughput.<name>``).
- ``scale``: a consortium of up to 64 hospitals (``python -m benchmarks.scale``).
- ``peers``: fedauc against Flower, NVIDIA FLARE and LibAUC (``python -m benchmarks.peers``); ``peers.systems``
  are the peers' runs, started by it in their own environments.
- ``year``: a year of a centre's records (``python -m benchmarks.year``; ``fedauc compare`` at that volume:
  ``python -m benchmarks.year.compare``).

``python -m`` puts the working directory first on the path, which matters here: Opacus installs a top-level
package of its own named ``benchmarks``, so run them from the repository's root (``make bench`` runs every entry
point). They are run by hand, not by the suite (tests/test_benchmark_imports.py checks what they import).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
