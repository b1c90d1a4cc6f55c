"""LocalSGDAM: local stochastic gradient descent ascent with momentum (Sharma, Panda, Joshi, Varshney,
ICML 2022), on the AUC square min-max (1.1). docs/algorithms.md section 6.

LocalSCGDAM with rho = 0: g is the identity and h = x, so the outer point is x itself and
    x <- x - lr u;  y <- y + dual_lr v
    u <- (1 - beta_x) u + beta_x grad_x f(x, y; xi);  v <- (1 - beta_y) v + beta_y grad_y f(x, y; xi)
every I steps averaging x (with BN running statistics), y, u, v. No h is stored or sent, and the forward
at x updates the BN running statistics.
"""

from __future__ import annotations

from federated.algorithms.base import Site
from federated.algorithms.localscgdam import LocalSCGDAM, LocalSGDAMParams
from federated.data import Batch
from federated.registry import register


@register
class LocalSGDAM(LocalSCGDAM):
    name = "localsgdam"
    Params = LocalSGDAMParams

    def tracked_kinds(self) -> tuple[str, ...]:
        return ("u",)

    def outer_point(self, site: Site, batch: Batch, first: bool):
        ab = [site.state[k].detach().requires_grad_() for k in ("a", "b")]
        return self.params(site) + ab, lambda z_w: z_w

    def forward_at(self, site: Site, weights, batch: Batch):
        return self.logits(site, batch)  # the model's own forward at x: updates BN running statistics
