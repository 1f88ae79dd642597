"""Models for the training-loop measurement and the training step that drives them.

On the CPU a small CNN (a few ms per image, so the input pipeline decides); on the
GPU a torchvision ResNet with AMP (bfloat16) and channels-last memory format.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..errors import ConfigError, DependencyError

__all__ = ["MODELS", "SmallCNN", "build_model", "default_model", "TrainStep"]

#: Model names ``fastload bench --model`` accepts ("none" skips the training loop).
MODELS = ("small-cnn", "resnet18", "resnet34", "resnet50", "none")


class SmallCNN(nn.Module):
    """A small convolutional classifier for any input size (global average pooling).

    It shrinks the input 4x by average pooling, then three strided conv/BN/ReLU blocks:
    about 4 MFLOP per 224x224 image forward (roughly 12 ms per step of 64 on two cores),
    so on a CPU a real training step (forward, backward, SGD) leaves most of the cores'
    time to the data loader, as a GPU would.
    """

    def __init__(self, num_classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int, k: int, s: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        self.features = nn.Sequential(
            nn.AvgPool2d(4, ceil_mode=True),
            block(3, 16, 3, 2),
            block(16, 32, 3, 2),
            block(32, 64, 3, 2),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def default_model(device: str) -> str:
    """``small-cnn`` on the CPU, ``resnet50`` on CUDA."""
    return "resnet50" if str(device).startswith("cuda") else "small-cnn"


def build_model(name: str, num_classes: int, device: str | torch.device = "cpu") -> nn.Module:
    """A freshly initialised model (seeded, so every loader trains the same network)."""
    if name not in MODELS or name == "none":
        raise ConfigError(f"model must be one of {', '.join(m for m in MODELS if m != 'none')}, got {name!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    torch.manual_seed(0)
    if name == "small-cnn":
        model: nn.Module = SmallCNN(num_classes)
    else:
        try:
            import torchvision
        except ImportError as e:
            raise DependencyError(f"model {name!r} needs torchvision ({e}); pip install torchvision") from None
        model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    model = model.to(device)
    if torch.device(device).type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


class TrainStep:
    """One optimisation step: copy the batch to the device, forward, backward, SGD update.

    On CUDA: channels-last inputs and autocast to bfloat16 (AMP); on the CPU: float32.
    ``step(images, labels)`` returns the loss tensor (not synchronised).
    """

    def __init__(self, model: nn.Module, device: str | torch.device, *, amp: bool | None = None, lr: float = 0.01) -> None:
        self.model = model
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.amp = self.cuda if amp is None else bool(amp)
        self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        model.train()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True)
        y = labels.to(self.device, non_blocking=True)
        if self.cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = self.loss_fn(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


def make_train_step(name: str, num_classes: int, device: str) -> Callable[[Any, Any], Any]:
    """``TrainStep`` over a fresh :func:`build_model`."""
    return TrainStep(build_model(name, num_classes, device), device)
