"""LocalSCGDAM: local stochastic compositional gradient descent ascent with momentum (Zhang, Zhang, Yang,
Souvenir, Gao: "Federated Compositional Deep AUC Maximization", NeurIPS 2023), on the compositional AUC
objective. docs/algorithms.md sections 1.3, 6 and 11.

min over x = (w, a, b), max over y = alpha of f(g(x), y): the inner g(x) = (w - rho grad_w CE(w), a, b) is one
cross-entropy step, the outer f the AUC square loss (1.1, global prior) of the network run with weights g_w.
Per site, with the effective rates of the paper's eta-scaled steps (gamma_x eta = the engine's lr,
gamma_y eta = ``dual_lr``, beta_x eta, beta_y eta, alpha_h eta = ``h_rate``) and minibatch xi = zeta:
    initialisation (its own minibatch xi0, before round 0; not one of the I local steps):
        h = g(x0; xi0);  u = J_g(x0; xi0)^T grad_h f(h, y0);  v = grad_y f(h, y0)
    local step t = 0, 1, ...:
        x <- x - gamma_x eta u;   y <- y + gamma_y eta v               (the previous step's momenta)
        h <- (1 - alpha_h eta) h + alpha_h eta g(x; xi)
        z = grad_h f(h, y; xi)                                         (network forwarded with weights h_w)
        u <- (1 - beta_x eta) u + beta_x eta J_g(x; xi)^T z
        v <- (1 - beta_y eta) v + beta_y eta grad_y f(h, y; xi)
    every I (= p) steps: average x (with BN running statistics), y, h, u, v over sites.
As in the paper's algorithm, every round, the first included, makes I updates of x before it communicates.
J_g^T z on the w block is z_w - rho H_CE(w; xi) z_w. ``jacobian="exact"`` gets it by backpropagating
z through g_w built with create_graph (one double backward, the Hessian-vector product), which works
through BatchNorm; ``"first_order"`` takes J_g = I (what LibAUC's centralized PDSCA effectively does).
BatchNorm: the running statistics belong to x and are updated by g's forward at x; the forward at h uses
batch statistics and leaves them alone. No author code exists: the defaults of the rates come from the
sweep recorded in docs/sweeps.md.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from federated.algorithms.base import Site
from federated.algorithms.minimax import AUCMinimax
from federated.data import Batch
from federated.registry import register
from federated.state import Comm
from models.compositional import inner_ce_step
from models.objectives import auc_square_loss


# Defaults from the sweep in docs/sweeps.md (engine lr = gamma_x eta: 0.03 there).
class LocalSGDAMParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dual_lr: float = Field(default=0.01, gt=0)  # gamma_y eta: alpha's ascent step
    beta_x: float = Field(default=0.5, gt=0, le=1)  # beta_x eta: weight on the new primal gradient; 1 = no momentum
    beta_y: float = Field(default=0.5, gt=0, le=1)  # beta_y eta: the same for the dual gradient


class LocalSCGDAMParams(LocalSGDAMParams):
    rho: float = Field(default=0.05, ge=0)  # inner CE step size; 0 makes g the identity, >= 0.2 hurt in the sweep
    h_rate: float = Field(default=0.1, gt=0, le=1)  # alpha_h eta: weight of the new g(x) in h; 1 = h = g(x; xi)
    jacobian: Literal["exact", "first_order"] = "exact"


@register
class LocalSCGDAM(AUCMinimax):
    name = "localscgdam"
    dp_refusal = ("its compositional estimator carries per-site moving averages of data-dependent values across "
                  "steps; no DP analysis of it is implemented")
    Params = LocalSCGDAMParams

    # --- state: x = (model, a, b), y = alpha, and the tracked h, u (like x) and v (like y) ----------
    def tracked_kinds(self) -> tuple[str, ...]:
        return ("h", "u")

    def state_spec(self, site: Site):
        spec = {"a": Comm.MEAN, "b": Comm.MEAN, "alpha": Comm.MEAN, "v": Comm.MEAN}
        return spec | {f"{k}.{n}": Comm.MEAN for k in self.tracked_kinds() for n in self.x_names(site)}

    def init_site_state(self, site: Site):
        C, dev = self.fed.num_classes, self.fed.device
        site.state = {k: torch.zeros(C, device=dev) for k in ("a", "b", "alpha", "v")}
        for k in self.tracked_kinds():
            site.state.update({f"{k}.{n}": torch.zeros_like(t) for n, t in zip(self.x_names(site), self.x(site))})
        # The paper's initialisation draws its own minibatch xi0 and is not one of the first round's I
        # local steps (docs/algorithms.md section 6). A resumed run restores the loader, model and state
        # saved at its checkpoint over what this computes.
        for batch in site.loader.batches(1):
            self.estimate(site, batch, first=True)
        return site.state

    # --- the inner function ---------------------------------------------------------------------
    def outer_point(self, site: Site, batch: Batch, first: bool):
        """Update h with g(x; xi) and return (h as leaves of a fresh graph, J_g(x; xi)^T as a function)."""
        exact = self.p.jacobian == "exact" and self.p.rho > 0
        with self.autocast():
            g_w = inner_ce_step(site.model, batch.x, batch.y, self.p.rho, batch.mask, create_graph=exact,
                                update_buffers=True)
        g = [t.detach() for t in g_w.values()] + [site.state["a"], site.state["b"]]
        h = self.group(site, "h")
        torch._foreach_lerp_(h, g, 1.0 if first else self.p.h_rate)

        def jacobian_t(z_w: list[torch.Tensor]) -> list[torch.Tensor]:
            if not exact:
                return z_w
            params = self.params(site)
            return list(torch.autograd.grad(list(g_w.values()), params, grad_outputs=z_w))

        return [t.detach().requires_grad_() for t in h], jacobian_t

    # --- one local step -------------------------------------------------------------------------
    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        st = site.state
        with torch.no_grad():
            torch._foreach_add_(self.x(site), self.group(site, "u"), alpha=-self.fed.lr)
            st["alpha"].add_(st["v"], alpha=self.p.dual_lr)
        return self.estimate(site, batch, first=False)

    def estimate(self, site: Site, batch: Batch, first: bool) -> torch.Tensor:
        """Move h, u and v towards their fresh estimates on ``batch`` at the current (x, y) (``first``: set
        them to those estimates, the initialisation); returns the loss f(h, y)."""
        st = site.state
        h, jacobian_t = self.outer_point(site, batch, first)
        alpha = st["alpha"].detach().requires_grad_()
        scores = torch.sigmoid(self.forward_at(site, h[:-2], batch))
        loss = auc_square_loss(scores, batch.y, h[-2], h[-1], alpha, site.prior, mask=batch.mask)
        z = torch.autograd.grad(loss, h + [alpha], allow_unused=True, materialize_grads=True)
        jz = jacobian_t(list(z[:-3])) + list(z[-3:-1])
        with torch.no_grad():
            torch._foreach_lerp_(self.group(site, "u"), [t.detach() for t in jz], 1.0 if first else self.p.beta_x)
            st["v"].lerp_(z[-1], 1.0 if first else self.p.beta_y)
        return loss.detach()
