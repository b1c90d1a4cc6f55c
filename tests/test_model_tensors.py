"""``federated.state.model_tensors``: a network's live tensors under their ``model.`` names, in the network's own
order, found through slots kept per network (the engine asks for them several times a site a round) and read
anew at every call, so a reassigned parameter or buffer is never a stale one."""

from __future__ import annotations

import torch
from torch import nn

from federated.state import model_tensors


def network() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2)).eval()


def test_they_are_the_networks_own_tensors_in_its_order():
    model = network()
    model(torch.zeros(1, 1, 5, 5))
    expected = {"model." + n: p for n, p in model.named_parameters()}
    expected.update({"model." + n: b for n, b in model.named_buffers()})
    for _ in range(2):  # the second call goes through the kept slots
        tensors = model_tensors(model)
        assert list(tensors) == list(expected)
        assert all(tensors[n].data_ptr() == t.data_ptr() for n, t in expected.items())
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert torch.equal(model_tensors(model)["model.0.weight"], model[0].weight)


def test_a_reassigned_parameter_or_buffer_is_the_new_one():
    model = network()
    model(torch.zeros(1, 1, 5, 5))
    model_tensors(model)
    model[1].running_mean = torch.full((4,), 7.0)
    model[0].bias = nn.Parameter(torch.full((4,), 3.0))
    tensors = model_tensors(model)
    assert torch.equal(tensors["model.1.running_mean"], torch.full((4,), 7.0))
    assert torch.equal(tensors["model.0.bias"], torch.full((4,), 3.0))


def test_each_network_has_its_own_slots():
    first, second = network(), network()
    for model in (first, second):
        model(torch.zeros(1, 1, 5, 5))
    a, b = model_tensors(first), model_tensors(second)
    assert all(a[n].data_ptr() != b[n].data_ptr() for n in a)
