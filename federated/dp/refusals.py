"""What the DP analysis does not cover, refused in one line before a job starts (docs/privacy.md section 4): an
algorithm whose class declares no DP method, guaranteed positives in every batch, a network with BatchNorm.

It asks the algorithms what they declare (``Algorithm.dp_method``), so it stands above them, beside the engine's
DP hooks; the settings and the configuration, below the algorithms, never import it."""

from __future__ import annotations

from torch import nn

from federated.privacy.policy import DPConfig, PrivacyRefused
from federated.registry import algorithm_names, get_algorithm


def dp_methods() -> dict[str, str]:
    """The algorithms DP may train and how (``Algorithm.dp_method``, declared on each class): those whose local step
    is a sum of per-sample terms once the global state is fixed, privatized by per-sample clipping and Gaussian
    noise (federated/dp/sgd.py). DP-SGD for the cross-entropy family; DP-SGDA for the AUC-margin family,
    where (w, a, b) and alpha are one clipped vector per sample."""
    return {name: get_algorithm(name).dp() for name in algorithm_names() if get_algorithm(name).dp()}


def check_dp_job(algorithm: str, dp: DPConfig | dict | None, guarantee_positives: bool) -> None:
    """Refuse, in one line, a DP job (``dp``: its settings, None or {} without DP) that the DP analysis does not
    cover."""
    if not dp:
        return
    cls = get_algorithm(algorithm)
    if cls.dp() is None:
        raise PrivacyRefused(f"algorithm {algorithm!r} is refused under DP: {cls.dp_refusal}; under DP use one of "
                             f"{', '.join(sorted(dp_methods()))}")
    if guarantee_positives:
        raise PrivacyRefused("guarantee_positives is refused under DP: it puts chosen positives in every batch, "
                             "and the accountant assumes Poisson sampling (each record in a batch with probability q)")


def batch_norm_layers(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def check_network(network: str, model: nn.Module) -> None:
    """BatchNorm mixes the records of a batch (and its running statistics are released unclipped): refused."""
    layers = batch_norm_layers(model)
    if layers:
        raise PrivacyRefused(f"network {network!r} is refused under DP: its BatchNorm layers ({layers[0]}, ... "
                             f"{len(layers)} in all) mix the records of a batch, so per-sample clipping bounds no "
                             "one record's influence; use a GroupNorm network (--network small_resnet_gn or "
                             "densenet121_gn) or --network linear")
