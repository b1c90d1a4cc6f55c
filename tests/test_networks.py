"""Networks: output shapes, the small CNN learns, ImageNet weights map from the torchvision layout."""

import pytest
import torch
from monai.networks.nets import DenseNet121

from models.networks import (
    NETWORKS,
    PretrainedWeightsError,
    SmallResNet,
    build_network,
    count_parameters,
    load_imagenet_weights,
    torchvision_to_monai_key,
)


def torchvision_densenet121_state(legacy=False, seed=0):
    """torchvision's DenseNet121 state dict layout written from the architecture, with random values.

    growth 32, bn_size 4, 64 initial features, blocks (6, 12, 24, 16), 1000-class classifier.
    ``legacy`` uses the "norm.1"/"conv.1" spelling of the original ImageNet checkpoint.
    """
    g = torch.Generator().manual_seed(seed)
    state = {}

    def bn(prefix, c):
        state[f"{prefix}.weight"] = torch.rand(c, generator=g) + 0.5
        state[f"{prefix}.bias"] = torch.randn(c, generator=g)
        state[f"{prefix}.running_mean"] = torch.randn(c, generator=g)
        state[f"{prefix}.running_var"] = torch.rand(c, generator=g) + 0.5
        state[f"{prefix}.num_batches_tracked"] = torch.tensor(7)

    state["features.conv0.weight"] = torch.randn(64, 3, 7, 7, generator=g) * 0.05
    bn("features.norm0", 64)
    channels = 64
    for b, layers in enumerate((6, 12, 24, 16), start=1):
        for i in range(1, layers + 1):
            prefix = f"features.denseblock{b}.denselayer{i}"
            sep = "." if legacy else ""
            bn(f"{prefix}.norm{sep}1", channels)
            state[f"{prefix}.conv{sep}1.weight"] = torch.randn(128, channels, 1, 1, generator=g) * 0.05
            bn(f"{prefix}.norm{sep}2", 128)
            state[f"{prefix}.conv{sep}2.weight"] = torch.randn(32, 128, 3, 3, generator=g) * 0.05
            channels += 32
        if b < 4:
            bn(f"features.transition{b}.norm", channels)
            state[f"features.transition{b}.conv.weight"] = torch.randn(channels // 2, channels, 1, 1, generator=g) * 0.05
            channels //= 2
    bn("features.norm5", channels)
    state["classifier.weight"] = torch.randn(1000, channels, generator=g)
    state["classifier.bias"] = torch.randn(1000, generator=g)
    return state


@pytest.mark.parametrize("name,in_channels,size", [("densenet121", 1, 64), ("densenet121", 3, 64),
                                                   ("resnet18", 1, 64), ("small_resnet", 1, 64),
                                                   ("small_resnet", 3, 128)])
def test_networks_output_logits_per_disease(name, in_channels, size):
    torch.manual_seed(0)
    model = build_network(name, num_classes=5, in_channels=in_channels).eval()
    x = torch.rand(2, in_channels, size, size)
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        out = model(x)
        head.bias += 2.0
        shifted = model(x)
    assert out.shape == (2, 5) and torch.all(torch.isfinite(out))
    # Logits, not probabilities: the head's bias reaches the output unchanged (a sigmoid would squash it).
    torch.testing.assert_close(shifted - out, torch.full_like(out, 2.0))
    with pytest.raises(ValueError, match="valid choices: densenet121, resnet18, small_resnet"):
        build_network("vgg16", 5)


def test_small_resnet_is_small_and_learns_a_visual_task():
    torch.manual_seed(0)
    model = SmallResNet(num_classes=2, in_channels=1)
    assert 200_000 < count_parameters(model) < 500_000
    # disease 0: a bright square in the top half; disease 1: a bright square in the left half
    n = 32
    x = torch.rand(n, 1, 32, 32) * 0.3
    top = torch.rand(n) < 0.5
    left = torch.rand(n) < 0.5
    for i in range(n):
        r = 2 if top[i] else 20
        c = 2 if left[i] else 20
        x[i, 0, r:r + 8, c:c + 8] += 0.7
    y = torch.stack([top, left], 1).float()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_torchvision_keys_rename_to_monai_and_back_exactly():
    tv = torchvision_densenet121_state()
    monai_model = DenseNet121(spatial_dims=2, in_channels=3, out_channels=5)
    monai_keys = {k for k in monai_model.state_dict() if not k.startswith("class_layers.")}
    renamed = {torchvision_to_monai_key(k) for k in tv if not k.startswith("classifier.")}
    assert renamed == monai_keys
    legacy = {torchvision_to_monai_key(k) for k in torchvision_densenet121_state(legacy=True) if not k.startswith("classifier.")}
    assert legacy == monai_keys
    assert torchvision_to_monai_key("features.denseblock3.denselayer17.norm.2.running_var") == \
        "features.denseblock3.denselayer17.layers.norm2.running_var"


@pytest.mark.parametrize("in_channels", [1, 3])
def test_load_imagenet_weights_from_a_local_file(tmp_path, in_channels):
    tv = torchvision_densenet121_state(legacy=True)
    path = tmp_path / "densenet121_imagenet.pth"
    torch.save(tv, path)
    model = build_network("densenet121", num_classes=5, in_channels=in_channels)
    head_before = model.class_layers.out.weight.clone()
    report = load_imagenet_weights(model, path)
    state = model.state_dict()
    assert report["skipped"] == ["classifier.bias", "classifier.weight"]
    assert torch.equal(state["features.denseblock4.denselayer16.layers.conv2.weight"],
                       tv["features.denseblock4.denselayer16.conv.2.weight"])
    assert torch.equal(state["features.transition2.norm.running_var"], tv["features.transition2.norm.running_var"])
    conv0 = tv["features.conv0.weight"]
    assert torch.allclose(state["features.conv0.weight"], conv0 if in_channels == 3 else conv0.mean(1, keepdim=True))
    assert torch.equal(model.class_layers.out.weight, head_before)
    # on a gray image the 1-channel conv0 gives the 3-channel one's response on (R, G, B) = gray, divided by 3
    if in_channels == 1:
        rgb = build_network("densenet121", 5, in_channels=3)
        load_imagenet_weights(rgb, path)
        gray = torch.rand(2, 1, 32, 32)
        with torch.no_grad():
            assert torch.allclose(3 * model.features.conv0(gray), rgb.features.conv0(gray.expand(-1, 3, -1, -1)),
                                  atol=1e-5)


def test_load_imagenet_weights_names_mismatched_and_missing_keys(tmp_path):
    tv = torchvision_densenet121_state()
    tv["features.denseblock2.denselayer4.conv1.weight"] = torch.zeros(128, 10, 1, 1)
    del tv["features.norm5.bias"]
    model = build_network("densenet121", num_classes=5, in_channels=1)
    with pytest.raises(PretrainedWeightsError) as err:
        load_imagenet_weights(model, tv)
    message = str(err.value)
    assert "missing (1): features.norm5.bias" in message
    assert "features.denseblock2.denselayer4.layers.conv1.weight: file (128, 10, 1, 1) vs model (128, 224, 1, 1)" in message
    two_channel = build_network("densenet121", num_classes=5, in_channels=2)
    with pytest.raises(PretrainedWeightsError, match=r"features.conv0.weight: file \(64, 3, 7, 7\) vs model \(64, 2, 7, 7\)"):
        load_imagenet_weights(two_channel, torchvision_densenet121_state())
    with pytest.raises(FileNotFoundError, match="never downloads weights"):
        build_network("densenet121", 5, pretrained_path=tmp_path / "absent.pth")
    with pytest.raises(TypeError, match="not SmallResNet"):
        load_imagenet_weights(build_network("small_resnet", 5), tv)


def test_resnet18_loads_torchvision_named_weights():
    torch.manual_seed(0)
    model = build_network("resnet18", num_classes=5, in_channels=1)
    head_before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("fc.")}
    # torchvision's ResNet-18 layout (same names as MONAI's, 3-channel conv1, 1000-class fc) from a
    # separately initialised network, so every value differs from the model's before loading
    torch.manual_seed(1)
    tv = {k: v.clone() for k, v in build_network("resnet18", num_classes=1000, in_channels=3).state_dict().items()}
    for k, v in tv.items():
        if v.is_floating_point() and k.endswith(("running_mean", "running_var")):
            v.add_(torch.rand_like(v))  # fresh running statistics are all 0 and 1 in both networks
        elif k.endswith("num_batches_tracked"):
            v.fill_(7)
    report = load_imagenet_weights(model, tv)
    state = model.state_dict()
    assert report["skipped"] == ["fc.bias", "fc.weight"]
    assert report["loaded"] == sorted(k for k in state if not k.startswith("fc."))
    assert not torch.equal(state["conv1.weight"], tv["conv1.weight"][:, :1])
    torch.testing.assert_close(state["conv1.weight"], tv["conv1.weight"].mean(1, keepdim=True))
    for k in report["loaded"]:
        if k != "conv1.weight":
            assert torch.equal(state[k], tv[k]), k
    for k, before in head_before.items():
        assert torch.equal(state[k], before), k
    assert set(NETWORKS) == {"densenet121", "resnet18", "small_resnet", "densenet121_gn", "small_resnet_gn"}
