"""What the AUC min-max algorithms with x = (w, a, b) and y = alpha share (docs/algorithms.md sections 1.1, 6 and 8):
LocalSCGDAM / LocalSGDAM and FedSGDA+ / FedSGDA-M.

``AUCMinimax``: the primal block x as names and tensors, per-site copies of it in ``site.state``
(``<kind>.<name>``), and a forward pass at other network weights (batch statistics, BatchNorm buffers
untouched). ``FedSGDA``: the gradients of the AUC square loss at any (x, y) point that FedSGDA+ and
FedSGDA-M both take (Wu et al., NeurIPS 2023), with the rate they share.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from federated.algorithms.base import Algorithm, Site
from federated.data import Batch
from models.compositional import functional_forward
from models.objectives import auc_square_loss


class AUCMinimax(Algorithm):
    def x_names(self, site: Site) -> list[str]:
        return [f"w.{n}" for n in site.parameter_names()] + ["a", "b"]

    def x(self, site: Site) -> list[torch.Tensor]:
        return self.params(site) + [site.state["a"], site.state["b"]]

    def group(self, site: Site, kind: str, names: list[str] | None = None) -> list[torch.Tensor]:
        """The site's ``kind`` copies of ``names`` (default: of x)."""
        return [site.state[f"{kind}.{n}"] for n in (self.x_names(site) if names is None else names)]

    def forward_at(self, site: Site, weights: list[torch.Tensor], batch: Batch) -> torch.Tensor:
        """Logits (B, C) of the network run with ``weights`` in place of its parameters."""
        with self.autocast():
            logits = functional_forward(site.model, dict(zip(site.parameter_names(), weights)), batch.x)
        return logits.float().reshape(len(batch.x), -1)


class FedSGDAParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # c (FedSGDA-M: c * eta): alpha's ascent step; default from FedSGDA-M's sweep (docs/sweeps.md)
    dual_lr: float = Field(default=0.01, gt=0)


class FedSGDA(AUCMinimax):
    """The AUC square min-max (1.1) as FedSGDA+ and FedSGDA-M evaluate it."""

    dp_refusal = ("its gradients are taken at extrapolated points through a functional forward that the per-sample "
                  "clipping does not cover yet")

    def gradients_at(self, site: Site, batch: Batch, weights: list[torch.Tensor] | None, ab_alpha):
        """(loss, grad_w, grad_a, grad_b, grad_alpha) of f on ``batch`` at the network ``weights`` (None = the
        model's own, whose forward updates BN running statistics; otherwise batch statistics, buffers untouched)."""
        a, b, alpha = (t.detach().requires_grad_() for t in ab_alpha)
        if weights is None:
            weights, logits = self.params(site), self.logits(site, batch)
        else:
            weights = [t.detach().requires_grad_() for t in weights]
            logits = self.forward_at(site, weights, batch)
        loss = auc_square_loss(torch.sigmoid(logits), batch.y, a, b, alpha, site.prior, mask=batch.mask)
        grads = torch.autograd.grad(loss, weights + [a, b, alpha], allow_unused=True, materialize_grads=True)
        return loss.detach(), list(grads[:-3]), grads[-3], grads[-2], grads[-1]
