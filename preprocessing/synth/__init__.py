"""Synthetic hospitals written in the real dataset formats: the demo, the tests and the benchmarks run
the real pipeline on them end to end (``docs/phantoms.png`` shows what they look like).

- ``generate_site(format, out, n, seed)``: one hospital in a real layout (``fedauc synth --format``).
- ``generate_federation(federation_yaml, out_root, scale, seed)``: every site of a federation YAML.
- ``chest`` and ``skin``: the phantoms; ``profiles``: the hospitals' acquisition; ``sources``: records
  sampled from the real public metadata; ``files``: JPEG / PNG / DICOM writers.
"""

from preprocessing.synth.federation import generate_federation
from preprocessing.synth.generate import FORMATS, SynthResult, corrupt_files, generate_site

__all__ = ["FORMATS", "SynthResult", "corrupt_files", "generate_federation", "generate_site"]
