"""Federated training: ``federated.train(TrainConfig(...)) -> TrainResult``. See federated/README.md.

The names below load on first use (PEP 562): importing a light submodule (``federated.settings``,
``federated.registry``) must not load the engine and torch, which the command line's start-up would pay for."""

from importlib import import_module

_EXPORTS = {"Comm": "federated.state", "ShardSite": "federated.config", "SyntheticSite": "federated.config",
            "TensorSite": "federated.config", "TrainConfig": "federated.config", "TrainResult": "federated.engine",
            "algorithm_names": "federated.registry", "get_algorithm": "federated.registry",
            "register": "federated.registry", "train": "federated.training"}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'federated' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


__all__ = sorted(_EXPORTS)
