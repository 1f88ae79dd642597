"""A Lightning module for the integration tests' subprocess scripts: it records which samples
each epoch's training steps read, decoded from their pixels (``conftest.encode_color``)."""

from __future__ import annotations

import lightning as L
import torch

from conftest import decode_batch
from fastload import IMAGENET_MEAN, IMAGENET_STD


class SeenNet(L.LightningModule):
    """A linear model on 16x16 crops; ``seen[str(epoch)]`` lists the sample indices trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3 * 16 * 16, 3)
        self.seen: dict[str, list[int]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        ids = [i for _, i in decode_batch(x.numpy(), IMAGENET_MEAN, IMAGENET_STD)]
        self.seen.setdefault(str(self.current_epoch), []).extend(ids)
        return torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
