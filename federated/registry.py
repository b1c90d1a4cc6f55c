"""Algorithms by name. An algorithm module registers its class with ``@register``."""

from __future__ import annotations

import difflib
import importlib
import pkgutil

from common.errors import ConfigError

_ALGORITHMS: dict[str, type] = {}


def register(cls):
    name = cls.name
    if name in _ALGORITHMS and _ALGORITHMS[name] is not cls:
        raise ValueError(f"algorithm name {name!r} registered twice ({_ALGORITHMS[name]} and {cls})")
    _ALGORITHMS[name] = cls
    return cls


def _load_all() -> None:
    import federated.algorithms as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{mod.name}")


def get_algorithm(name: str) -> type:
    _load_all()
    try:
        return _ALGORITHMS[name]
    except KeyError:
        close = difflib.get_close_matches(name, _ALGORITHMS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown algorithm {name!r}", fix=f"{hint}registered: {', '.join(sorted(_ALGORITHMS))}") from None


def algorithm_names() -> list[str]:
    _load_all()
    return sorted(_ALGORITHMS)
