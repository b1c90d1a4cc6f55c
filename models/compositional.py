"""Compositional AUC building block (Yuan et al. ICLR 2022; LocalSCGDAM; docs/algorithms.md sections 1.3 and 6).

The inner function is one cross-entropy gradient step on the network weights,
``g_w(w) = w - rho * grad_w CE(w; xi)``; the outer AUC loss is evaluated with the network run on
those weights. These functions give algorithms the three pieces they need:

* :func:`inner_ce_step` returns g_w as a name -> tensor dict of the model's trainable parameters;
* :func:`functional_forward` runs the model with any such dict (torch.func.functional_call);
* :func:`inner_ce_step_vjp` returns ``J_g(w)^T z = z - rho * H_CE(w) z`` for a given z (one
  Hessian-vector product by double backward), or z itself for the first-order variant (J_g = I).

BatchNorm: by default neither function touches the model's running statistics (``update_buffers=False``
runs on copies of the buffers), so a training-mode forward uses batch statistics and leaves the
running estimates, which belong to x (docs/algorithms.md section 6), to the step that owns them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from models.objectives import masked_bce_with_logits

Weights = dict[str, Tensor]


def trainable_parameters(model: nn.Module) -> Weights:
    """The model's parameters that require gradients, by name (the keys every function here uses)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def functional_forward(model: nn.Module, weights: Weights, inputs: Tensor, update_buffers: bool = False) -> Tensor:
    """Run ``model`` on ``inputs`` with its parameters replaced by ``weights`` (missing names keep the model's).

    With ``update_buffers=False`` the model's buffers (BatchNorm running statistics) are passed as
    copies, so a training-mode forward cannot change them.
    """
    unknown = set(weights) - {name for name, _ in model.named_parameters()}
    if unknown:
        raise KeyError(f"weights name parameters the model does not have: {sorted(unknown)[:5]}")
    tensors: dict[str, Tensor] = dict(weights)
    if not update_buffers:
        tensors.update({name: b.clone() for name, b in model.named_buffers()})
    return functional_call(model, tensors, (inputs,), strict=False)


def _ce_gradient(model: nn.Module, weights: Weights, inputs: Tensor, labels: Tensor, mask: Tensor | None,
                 create_graph: bool, update_buffers: bool) -> tuple[Tensor, ...]:
    logits = functional_forward(model, weights, inputs, update_buffers=update_buffers)
    ce = masked_bce_with_logits(logits, labels, mask)
    return torch.autograd.grad(ce, list(weights.values()), create_graph=create_graph, allow_unused=True)


def inner_ce_step(model: nn.Module, inputs: Tensor, labels: Tensor, rho: float, mask: Tensor | None = None,
                  create_graph: bool = False, update_buffers: bool = False) -> Weights:
    """``g_w = w - rho * grad_w CE(w; inputs, labels)`` for the model's trainable parameters.

    The result stays attached to w: with ``create_graph=False`` the gradient is a constant, so
    backpropagating through g_w gives ``J_g = I`` (the first-order variant); with ``create_graph=True``
    it gives the exact Jacobian ``I - rho * H_CE``. CE is :func:`models.objectives.masked_bce_with_logits`.
    A parameter the CE does not reach (unused head) gets a zero gradient.
    """
    weights = trainable_parameters(model)
    grads = _ce_gradient(model, weights, inputs, labels, mask, create_graph, update_buffers)
    return {name: w - rho * (torch.zeros_like(w) if g is None else g)
            for (name, w), g in zip(weights.items(), grads)}


def inner_ce_step_vjp(model: nn.Module, inputs: Tensor, labels: Tensor, rho: float, z: Weights,
                      mask: Tensor | None = None, exact: bool = True) -> Weights:
    """``J_g(w)^T z = z - rho * H_CE(w) z`` (exact) or ``z`` (``exact=False``, J_g = I), detached.

    ``z`` is the outer gradient with respect to g_w, keyed like :func:`trainable_parameters`.
    The Hessian-vector product is one double backward of the CE at the model's current weights.
    """
    weights = trainable_parameters(model)
    if set(z) != set(weights):
        raise KeyError(f"z must have exactly the model's trainable parameter names; missing "
                       f"{sorted(set(weights) - set(z))[:5]}, unknown {sorted(set(z) - set(weights))[:5]}")
    if not exact:
        return {name: z[name].detach().clone() for name in weights}
    grads = _ce_gradient(model, weights, inputs, labels, mask, create_graph=True, update_buffers=False)
    used = [(name, w, g) for (name, w), g in zip(weights.items(), grads) if g is not None]
    hz: Weights = {}
    if used:  # a parameter the CE never reaches has a zero Hessian block
        dot = sum((g * z[name].detach()).sum() for name, _, g in used)
        hvp = torch.autograd.grad(dot, [w for _, w, _ in used], allow_unused=True)
        hz = {name: h for (name, _, _), h in zip(used, hvp) if h is not None}
    return {name: (z[name] - rho * hz[name] if name in hz else z[name]).detach().clone() for name in weights}
