"""Checks of tensor values (labels in {0, 1}, a prior inside (0, 1), positive u) that the losses of
models/objectives/ make, and the scope in which a caller whose inputs hold them by construction skips them.

Why skip them: each check reads a reduction of a device tensor back to the host (``bool(tensor)``), and on a
GPU such a read waits for every queued kernel. The engine's local steps run without them (federated/network.py,
``local_steps``): their labels come from ``SiteLoader`` (0 or 1, a mask for the missing ones) and their prior
is kept inside (0, 1) by the engine, so a step issues no host sync and the CPU queues the next step's kernels
(or CUDA-graph replay) while the GPU runs this one. Any other caller keeps the checks.
"""

from __future__ import annotations

import contextlib
import threading

_state = threading.local()


def enabled() -> bool:
    """Whether the losses check their inputs' values here (everywhere but inside ``skipped()``)."""
    return not getattr(_state, "skipped", False)


@contextlib.contextmanager
def skipped():
    """Skip the value checks in this thread while the block runs (nests; restores the previous setting)."""
    previous = getattr(_state, "skipped", False)
    _state.skipped = True
    try:
        yield
    finally:
        _state.skipped = previous
