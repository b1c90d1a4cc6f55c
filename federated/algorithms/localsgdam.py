"""LocalSGDAM: local stochastic gradient descent ascent with momentum (Sharma, Panda, Joshi, Varshney,
ICML 2022), on the AUC square min-max (1.1). docs/algorithms.md section 6.

LocalSCGDAM with rho = 0: g is the identity and h = x, so the outer point is x itself and
    x <- x - lr u;  y <- y + dual_lr v
    u <- (1 - beta_x) u + beta_x grad_x f(x, y; xi);  v <- (1 - beta_y) v + beta_y grad_y f(x, y; xi)
every I steps averaging x (with BN running statistics), y, u, v. No h is stored or sent, and the forward
at x updates the BN running statistics.
"""

from __future__ import annotations

import torch

from federated.algorithms.base import Site
from federated.algorithms.localscgdam import LocalSCGDAM, LocalSGDAMParams
from federated.data import Batch
from federated.registry import register
from models.objectives import auc_square_loss, auc_square_terms


@register
class LocalSGDAM(LocalSCGDAM):
    name = "localsgdam"
    dp_method = "DP-SGDA"
    dp_extra_steps = 1  # its initial estimate draws its own minibatch (docs/algorithms.md section 6)
    Params = LocalSGDAMParams

    def tracked_kinds(self) -> tuple[str, ...]:
        return ("u",)

    def sample_loss(self, site, logits, y, mask, extras):
        a, b, alpha = extras
        s = torch.sigmoid(logits)
        return auc_square_terms(s, y * mask, (1 - y) * mask, a, b, alpha, site.prior).sum() / len(s)

    def estimate(self, site: Site, batch: Batch, first: bool) -> torch.Tensor:
        """LocalSCGDAM's estimate with h = x: the gradients at (x, y) straight into the momenta (under DP, those of
        (w, a, b, alpha) clipped together per record: DP-SGDA). The model's own forward updates BN statistics."""
        st = site.state
        a, b, alpha = (st[k].detach().requires_grad_() for k in ("a", "b", "alpha"))
        loss, z = self.differentiate(site, batch, lambda: auc_square_loss(
            torch.sigmoid(self.logits(site, batch)), batch.y, a, b, alpha, site.prior, mask=batch.mask), [a, b, alpha])
        with torch.no_grad():
            torch._foreach_lerp_(self.group(site, "u"), z[:-1], 1.0 if first else self.p.beta_x)
            st["v"].lerp_(z[-1], 1.0 if first else self.p.beta_y)
        return loss
