"""Training health, checked where it goes wrong: every site's loss and what every site sends, every round
(docs/algorithms.md section 14).

Each round a site measures, on its own device and without a host synchronisation, the norm of its update
(what it sends minus the global value it started the round from) to the model and to each MEAN state
tensor the algorithm declares: one float64 norm per tensor (``torch._foreach_norm``), summed per group.
A NaN or an infinity anywhere in what a site sends makes its group norm non-finite, so one ``isfinite``
over the G group norms checks everything it sends. The numbers ride in the round's existing per-site
gather (federated/engine.py), which already waits for the round, so the check adds no host sync, and every
transport (in-process, torchrun, NVIDIA FLARE) sees every site's numbers: aggregate numbers, nothing per image.

With every site's row on the host, :meth:`HealthMonitor.check` stops the training at that round with a
:class:`TrainingDiverged` naming the site, the round and what went wrong, before the round is evaluated or
checkpointed, so the last good round's checkpoint stays for ``fedauc train --resume --lr <lower>``:

* a non-finite training loss or update (NaN, infinity);
* a round's mean loss whose magnitude grew past ``divergence_factor`` times the site's first loss (its
  first local step of the run, before any update could spoil it; floored at ``LOSS_FLOOR``: a first loss
  near zero must not make every later one a divergence).

A site whose update to the model has a norm over ``outlier_factor`` times the median of the other sites'
is named in a warning (``outliers``): a broken export or a wrong label mapping at one hospital, which a robust aggregation
(federated/aggregation.py) keeps out of the global model.
"""

from __future__ import annotations

import logging
import math

import torch

from common.errors import FedaucError
from federated.state import MODEL_PREFIX, Comm

LOSS_FLOOR = 0.01  # the smallest first-round loss magnitude the divergence factor multiplies
MODEL_GROUP = "model"

log = logging.getLogger("fedauc.health")


class TrainingDiverged(FedaucError, RuntimeError):
    """A site's loss or update went non-finite or exploded; the training stopped at that round."""


def update_groups(spec: dict[str, Comm], tensors: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """The groups whose update norms are recorded: the network's MEAN tensors as ``model``, then the
    algorithm's floating-point MEAN state by the name before the first dot (SCAFFOLD's ``c.<parameter>``
    tensors are one group ``c``)."""
    groups: dict[str, list[str]] = {MODEL_GROUP: []}
    for name, kind in spec.items():
        if kind is not Comm.MEAN or not tensors[name].is_floating_point():
            continue
        groups.setdefault(MODEL_GROUP if name.startswith(MODEL_PREFIX) else name.split(".")[0], []).append(name)
    return {g: names for g, names in groups.items() if names}


class SiteUpdate:
    """One site's reference values (the global state its round started from) and its update norms."""

    def __init__(self, tensors: dict[str, torch.Tensor], groups: dict[str, list[str]]):
        self.names = [n for names in groups.values() for n in names]
        self.reference = [torch.empty_like(tensors[n]) for n in self.names]
        # Which group each tensor's norm adds to (index_add_ over the per-tensor norms: one kernel).
        self.group_of = torch.tensor([g for g, names in enumerate(groups.values()) for _ in names],
                                     device=self.reference[0].device)
        self.num_groups = len(groups)

    def norms(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """||sent - reference|| per group (float64, on the device). The reference buffers hold the difference
        afterwards (no allocation per round): :meth:`restart` comes before the next call."""
        current = [tensors[n] for n in self.names]
        torch._foreach_sub_(self.reference, current)
        per_tensor = torch.stack(torch._foreach_norm(self.reference, 2, dtype=torch.float64))
        squares = torch.zeros(self.num_groups, dtype=torch.float64, device=per_tensor.device)
        return squares.index_add_(0, self.group_of, per_tensor.square()).sqrt()

    def restart(self, tensors: dict[str, torch.Tensor]) -> None:
        """The values a round starts from (the global state after the previous round) become the reference."""
        torch._foreach_copy_(self.reference, [tensors[n] for n in self.names])


def site_row(index: int, sent: int, received: int, losses: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """A site's row of the round's per-site gather, on the device of its losses: index, bytes sent and
    received, the round's mean loss and its first step's (``losses``), then the update norms per group."""
    head = torch.tensor([float(index), sent, received], dtype=torch.float64, device=losses.device)
    return torch.cat([head, losses.detach().double(), norms.to(losses.device)])[None]


def relative_to_others(values: list[float]) -> list[float]:
    """Each site's value over the median of the other sites' (NaN where undefined: one site, a zero median).
    One sort for all sites (K log K, not a sort per site): leaving one value out of the sorted list shifts
    the others' middle by at most one place."""
    n = len(values)
    if n < 2:
        return [math.nan] * n
    order = sorted(range(n), key=lambda k: values[k])
    ordered = [values[k] for k in order]
    rank = {k: r for r, k in enumerate(order)}
    out = []
    for k, v in enumerate(values):
        def at(i: int, skip: int = rank[k]) -> float:  # the i-th smallest of the others
            return ordered[i + (i >= skip)]
        mid = (n - 1) // 2
        median = at(mid) if (n - 1) % 2 else 0.5 * (at(mid - 1) + at(mid))
        out.append(v / median if median > 0 and math.isfinite(median) else math.nan)
    return out


def lower_lr_fix(lr: float, sites: str) -> str:
    return (f"lower the learning rate (--lr, now {lr:g}) and continue from the last good round with "
            f"`fedauc train ... --resume --lr <lower>`; if it recurs at {sites} only, check that site's data")


def _names(sites: list[str], indices: list[int]) -> str:
    return ", ".join(repr(sites[k]) for k in indices)


class HealthMonitor:
    """Checks every round's per-site losses and update norms (all sites, in site order) on the host."""

    def __init__(self, site_names: list[str], groups: list[str], config):
        self.site_names = site_names
        self.groups = groups
        self.lr = config.lr
        self.divergence_factor = config.divergence_factor
        self.outlier_factor = config.outlier_factor
        self.first_losses: list[float] | None = None
        self.withheld = config.dp is not None

    def resume(self, history: list[dict]) -> None:
        """Take the first losses of a resumed run from its history."""
        for record in history:
            if "loss_reference" in record:
                self.first_losses = list(record["loss_reference"])

    def _fix(self, sites: list[int]) -> str:
        return lower_lr_fix(self.lr, _names(self.site_names, sites))

    def check(self, round_index: int, per_site: torch.Tensor) -> dict:
        """``per_site``: every site's :func:`site_row`, in site order. Raise ``TrainingDiverged`` for a
        non-finite or exploding site; else the round's health record: ``site_losses``, ``update_norm`` and
        ``update_norm_rel`` (group -> per site), ``outliers`` and, in the round that sets it,
        ``loss_reference`` (each site's first loss)."""
        losses, first_step_losses = per_site[:, 3].tolist(), per_site[:, 4].tolist()
        norms = per_site[:, 5:].tolist()
        where = f"round {round_index}"
        # Under differential privacy the sites withhold their losses and update norms (NaN) and check them
        # themselves (federated/dp/site.py withhold).
        withheld = self.withheld
        bad = [] if withheld else [k for k, v in enumerate(losses) if not math.isfinite(v)]
        if bad:
            raise TrainingDiverged(f"site(s) {_names(self.site_names, bad)}, {where}: the training loss is "
                                   f"{losses[bad[0]]} (the training diverged)", fix=self._fix(bad))
        for g, group in enumerate([] if withheld else self.groups):
            bad = [k for k, row in enumerate(norms) if not math.isfinite(row[g])]
            if bad:
                what = "the model" if group == MODEL_GROUP else f"the algorithm's state {group!r}"
                raise TrainingDiverged(f"site(s) {_names(self.site_names, bad)}, {where}: its update to {what} is "
                                       "not finite (NaN or infinite)", fix=self._fix(bad))
        health: dict = {}
        if withheld:
            losses = [math.nan] * len(losses)
        elif self.first_losses is None:
            self.first_losses = health["loss_reference"] = list(first_step_losses)
        limits = [] if withheld else [self.divergence_factor * max(abs(first), LOSS_FLOOR) for first in self.first_losses]
        bad = [k for k, (v, limit) in enumerate(zip(losses, limits)) if abs(v) > limit]
        if bad:
            k = bad[0]
            raise TrainingDiverged(f"site(s) {_names(self.site_names, bad)}, {where}: the training loss {losses[k]:.4g} "
                                   f"grew past {self.divergence_factor:g}x its first "
                                   f"{self.first_losses[k]:.4g} (the training diverged)", fix=self._fix(bad))
        absolute = {group: [row[g] for row in norms] for g, group in enumerate(self.groups)}
        relative = {group: relative_to_others(values) for group, values in absolute.items()}
        # Warnings look at the model only: a broken site shows there, while a small state group (CODA+'s
        # a, b, alpha: C numbers) swings by tens of times between honest sites from round to round.
        outliers = [f"{where}: site {self.site_names[k]!r} sent an update to the model {rel:.3g}x the other "
                    f"sites' median (over {self.outlier_factor:g}x): check its data (labels, export); "
                    "--aggregation median keeps such a site out of the global model"
                    for k, rel in enumerate(relative[MODEL_GROUP]) if math.isfinite(rel) and rel > self.outlier_factor]
        return {**health, "site_losses": list(losses), "update_norm": absolute, "update_norm_rel": relative,
                "outliers": outliers}


def as_diverged(err: Exception, lr: float) -> Exception:
    """A site's ``TrainingDiverged`` as another process reports it (an NVIDIA FLARE job's failure reason, its
    first line): the same error at the centre, so it ends the same way; any other error unchanged."""
    mark = f"{TrainingDiverged.__name__}: "
    text = str(err)
    if mark not in text:
        return err
    return TrainingDiverged(text.split(mark, 1)[1].splitlines()[0], fix=lower_lr_fix(lr, "one site"))


def warn_outliers(record: dict) -> None:
    """Log a round's outlying sites (the centre calls this with every round's record)."""
    for message in record.get("outliers", ()):
        log.warning(message)
