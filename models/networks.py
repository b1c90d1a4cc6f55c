"""Networks with C logit outputs: MONAI DenseNet121 and ResNet-18, and a small residual CNN for CPUs.

``build_network(name, num_classes, in_channels)`` looks a name up in ``NETWORKS``:

* ``densenet121``: MONAI DenseNet121 (the DAM/LibAUC chest X-ray and melanoma backbone), 1-channel
  X-rays or 3-channel dermoscopy; ``load_imagenet_weights`` maps a torchvision-format ImageNet state
  dict onto it.
* ``resnet18``: MONAI ResNet-18 (torchvision key names, so ImageNet weights load by name too).
* ``small_resnet``: :class:`SmallResNet`, three residual stages (about 0.3 M parameters, 43 M
  multiply-adds at 128 px), meant to train in minutes on a 2-core CPU at 64-128 px.

Every network outputs logits (no sigmoid): the AUC losses take ``torch.sigmoid(logits)``.
Nothing is downloaded at run time: pretrained weights come only from a local file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

# ---------------------------------------------------------------------------------------------------
# Small residual CNN
# ---------------------------------------------------------------------------------------------------


def norm_layer(channels: int, norm: str) -> nn.Module:
    """BatchNorm, or GroupNorm (Wu and He 2018: per-sample statistics, so that differential privacy's
    per-sample gradients exist, federated/dp/sgd.py) in groups of up to 8."""
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(math.gcd(8, channels), channels)
    raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")


class ResidualBlock(nn.Module):
    """Two 3x3 conv-norm layers with an identity (or 1x1 conv-norm projection) shortcut (He et al. 2016)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str = "batch"):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(out_channels, norm)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = norm_layer(out_channels, norm)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          norm_layer(out_channels, norm))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A stride-2 3x3 stem and one stride-2 residual block per width, global average pool, linear head.

    ``widths`` sets the channels of the stem and of each stage: more or wider stages cost compute
    roughly in proportion to width squared; the defaults keep a 128 px training step on a 2-core CPU
    in the tens of milliseconds per image.
    """

    def __init__(self, num_classes: int, in_channels: int = 1, widths: tuple[int, ...] = (16, 32, 64, 128),
                 norm: str = "batch"):
        super().__init__()
        if len(widths) < 2:
            raise ValueError(f"widths needs a stem width and at least one stage width, got {widths}")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, stride=2, padding=1, bias=False),
                                  norm_layer(widths[0], norm), nn.ReLU(inplace=True))
        self.stages = nn.Sequential(*(ResidualBlock(c_in, c_out, stride=2, norm=norm)
                                      for c_in, c_out in zip(widths, widths[1:])))
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        features = self.stages(self.stem(x))
        return self.head(features.mean(dim=(2, 3)))


# ---------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------


# MONAI is imported where its networks are built: its package loads every integration it finds installed
# (MLflow, matplotlib, scipy), which a hospital's small_resnet job process has no use for.
def _densenet121(num_classes: int, in_channels: int, **kwargs) -> nn.Module:
    from monai.networks.nets import DenseNet121

    return DenseNet121(spatial_dims=2, in_channels=in_channels, out_channels=num_classes, **kwargs)


def _resnet18(num_classes: int, in_channels: int, **kwargs) -> nn.Module:
    from monai.networks.nets import resnet18

    return resnet18(spatial_dims=2, n_input_channels=in_channels, num_classes=num_classes, **kwargs)


def _small_resnet(num_classes: int, in_channels: int, **kwargs) -> nn.Module:
    return SmallResNet(num_classes=num_classes, in_channels=in_channels, **kwargs)


NETWORKS: dict[str, Callable[..., nn.Module]] = {
    "densenet121": _densenet121,
    "resnet18": _resnet18,
    "small_resnet": _small_resnet,
    # GroupNorm variants, the networks that train under differential privacy (BatchNorm mixes a batch's records).
    # MONAI's ResNet keeps BatchNorm in its downsampling shortcuts whatever its norm: no resnet18 variant.
    "densenet121_gn": lambda num_classes, in_channels, **kw: _densenet121(num_classes, in_channels,
                                                                          norm=("group", {"num_groups": 8}), **kw),
    "small_resnet_gn": lambda num_classes, in_channels, **kw: _small_resnet(num_classes, in_channels,
                                                                            norm="group", **kw),
}


def build_network(name: str, num_classes: int, in_channels: int = 1, pretrained_path: str | Path | None = None,
                  **kwargs) -> nn.Module:
    """Build a registered network with ``num_classes`` logit outputs for ``in_channels``-channel 2-D images.

    ``pretrained_path``: a local torchvision-format ImageNet state dict, loaded with
    :func:`load_imagenet_weights` (densenet121 and resnet18). ``kwargs`` go to the constructor
    (for example ``dropout_prob`` for DenseNet121, ``widths`` for small_resnet).
    """
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; valid choices: {', '.join(NETWORKS)}")
    if num_classes < 1 or in_channels < 1:
        raise ValueError(f"num_classes and in_channels must be positive, got {num_classes} and {in_channels}")
    model = NETWORKS[name](num_classes, in_channels, **kwargs)
    if pretrained_path is not None:
        load_imagenet_weights(model, pretrained_path)
    return model


# ---------------------------------------------------------------------------------------------------
# ImageNet weights from a local torchvision-format file
# ---------------------------------------------------------------------------------------------------

# torchvision DenseNet keys "...denselayer3.norm1.weight" (and the legacy "norm.1" spelling of the
# original checkpoints) become MONAI's "...denselayer3.layers.norm1.weight".
_TV_DENSELAYER = re.compile(r"^(features\.denseblock\d+\.denselayer\d+)\.(norm|relu|conv)\.?(\d)\.(.+)$")
_FIRST_CONV = {"densenet121": "features.conv0.weight", "resnet18": "conv1.weight"}
_CLASSIFIER = {"densenet121": "classifier.", "resnet18": "fc."}


class PretrainedWeightsError(ValueError):
    """A pretrained state dict that does not fit the model; the message lists the offending keys."""


def _architecture(model: nn.Module) -> str:
    from monai.networks.nets import DenseNet121, ResNet

    if isinstance(model, DenseNet121):
        return "densenet121"
    if isinstance(model, ResNet):
        return "resnet18"
    raise TypeError(f"ImageNet weights can be loaded into MONAI DenseNet121 or ResNet-18, not {type(model).__name__}")


def torchvision_to_monai_key(key: str, architecture: str = "densenet121") -> str:
    """The MONAI parameter name of a torchvision DenseNet121/ResNet-18 state-dict key."""
    if architecture == "densenet121":
        match = _TV_DENSELAYER.match(key)
        if match:
            block, kind, number, rest = match.groups()
            return f"{block}.layers.{kind}{number}.{rest}"
    return key


def _read_state_dict(source: str | Path | Mapping[str, Tensor]) -> dict[str, Tensor]:
    if isinstance(source, Mapping):
        state = dict(source)
        origin = "the given state dict"
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"pretrained weights file {path} does not exist (fedauc never downloads weights: "
                                    f"save torchvision's ImageNet state dict there first)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        origin = str(path)
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = dict(state["state_dict"])
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise PretrainedWeightsError(f"{origin} is not a state dict of tensors")
    # checkpoints saved from nn.DataParallel prefix every key with "module."
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_imagenet_weights(model: nn.Module, source: str | Path | Mapping[str, Tensor]) -> dict[str, list[str]]:
    """Copy a torchvision-format ImageNet state dict into a MONAI DenseNet121 or ResNet-18, in place.

    Keys are renamed with :func:`torchvision_to_monai_key`. The ImageNet classifier (1000 classes) is
    skipped: the C-class head keeps its initialisation. For a 1-channel model the first convolution's
    RGB kernels are averaged over the colour axis (gray input = equal R, G, B up to the BatchNorm that
    follows). Every other tensor must match by name and shape; otherwise
    :class:`PretrainedWeightsError` names the missing, unexpected and mismatched keys with shapes.
    ``num_batches_tracked`` counters absent from old checkpoints keep the model's values.
    Returns ``{"loaded": [...], "skipped": [...]}`` (MONAI key names, then the skipped source keys).
    """
    architecture = _architecture(model)
    source_state = _read_state_dict(source)
    target = model.state_dict()
    head = _CLASSIFIER[architecture]
    skipped = sorted(k for k in source_state if k.startswith(head))
    mapped = {torchvision_to_monai_key(k, architecture): v for k, v in source_state.items() if not k.startswith(head)}
    first_conv = _FIRST_CONV[architecture]
    if first_conv in mapped and target[first_conv].shape[1] == 1 and mapped[first_conv].shape[1] == 3:
        mapped[first_conv] = mapped[first_conv].mean(dim=1, keepdim=True)

    model_head = "class_layers." if architecture == "densenet121" else "fc."
    expected = {k for k in target if not k.startswith(model_head)}
    missing = sorted(k for k in expected - set(mapped) if not k.endswith("num_batches_tracked"))
    unexpected = sorted(set(mapped) - expected)
    mismatched = sorted(f"{k}: file {tuple(mapped[k].shape)} vs model {tuple(target[k].shape)}"
                        for k in expected & set(mapped) if mapped[k].shape != target[k].shape)
    if missing or unexpected or mismatched:
        name = source if not isinstance(source, Mapping) else "the given state dict"
        parts = [f"{label} ({len(keys)}): {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                 for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched))
                 if keys]
        raise PretrainedWeightsError(f"{name} does not fit {architecture} with {target[first_conv].shape[1]} input "
                                     f"channel(s): " + "; ".join(parts))
    loaded = sorted(expected & set(mapped))
    with torch.no_grad():
        for k in loaded:
            target[k].copy_(mapped[k].to(target[k].dtype))
    return {"loaded": loaded, "skipped": skipped}


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
