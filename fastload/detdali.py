"""Detection images through the DALI graph: host-computed windows, sizes and flips in, uint8 CHW tensors out.

:class:`DaliImages` owns one :func:`fastload.pipeline.build_detection_pipeline` graph (CPU
backend, or ``mixed`` decoding and GPU resizing on CUDA) and runs one batch at a time; the
caller (``fastload.detection``) decides every number, so the boxes it moves on the host are
the pixels moved here.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np
import torch

from .errors import ConfigError
from .pipeline import GraphSpec, build_detection_pipeline, cpu_samples, decoder_sizing, encoded_batch, import_dali


class DaliImages:
    """A detection DALI graph for batches of up to ``batch_size`` images on ``device``."""

    def __init__(self, *, batch_size: int, num_threads: int, device: torch.device, stats: Any = None, max_pixels: int | None = None) -> None:
        import_dali()  # DependencyError with the install hint
        if device.type == "cuda":
            device_id = torch.cuda.current_device() if device.index is None else device.index
        elif device.type == "cpu":
            device_id = None
        else:
            raise ConfigError(f"backend='dali' runs on 'cpu' or 'cuda', not device={str(device)!r}")
        self.device = device
        spec = GraphSpec(
            batch_size=batch_size, num_threads=num_threads, device_id=device_id, train=True, crop=0, resize=0,
            mean=None, std=None, out_dtype="uint8", channels_last=True, prefetch=1, hw_decoder_load=None,
            **decoder_sizing(stats, max_pixels=max_pixels).fields(),
        )  # fmt: skip
        self.pipe = build_detection_pipeline(spec)
        self._lock = threading.Lock()  # one run at a time

    def run(self, payloads: Sequence[np.ndarray], windows: Sequence[tuple[int, int, int, int]], sizes: Sequence[tuple[int, int]],
            flips: Sequence[bool]) -> list[torch.Tensor]:  # fmt: skip
        """The images of one batch, uint8 ``[3, H, W]`` each on the device.

        Args:
            payloads: encoded images (1-D uint8 arrays).
            windows: each window as ``(left, top, width, height)`` in stored pixels.
            sizes: each output size ``(height, width)``.
            flips: each horizontal flip.
        """
        with self._lock:
            self.pipe.feed_input("encoded", encoded_batch(payloads))
            self.pipe.feed_input("anchor", [np.array(w[:2], np.float32) for w in windows])
            self.pipe.feed_input("shape", [np.array(w[2:], np.float32) for w in windows])
            self.pipe.feed_input("size", [np.array(s, np.float32) for s in sizes])
            self.pipe.feed_input("flip", [np.array(int(f), np.int32) for f in flips])
            (out,) = self.pipe.run()
            if self.device.type == "cpu":
                return [torch.from_numpy(a.copy()).permute(2, 0, 1) for a in cpu_samples(out)]
            return self._on_gpu(out)

    def _on_gpu(self, out: Any) -> list[torch.Tensor]:
        """Each sample of a ``TensorListGPU`` copied into a torch tensor on the device (DALI's
        ``feed_ndarray``, on the current stream). Written from DALI's documented API; not run here."""
        from nvidia.dali.plugin.pytorch import feed_ndarray

        images = []
        stream = torch.cuda.current_stream(self.device)
        for i in range(len(out)):
            t = out[i]
            dst = torch.empty(tuple(t.shape()), dtype=torch.uint8, device=self.device)
            feed_ndarray(t, dst, cuda_stream=stream)
            images.append(dst.permute(2, 0, 1))
        return images


__all__ = ["DaliImages"]
