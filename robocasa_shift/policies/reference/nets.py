"""Small keypoint networks that read one camera image and regress 3-D points.

Conv trunk -> K keypoint maps -> spatial softmax (expected x, y and the map's
peak) -> MLP -> normalised outputs. The label mean and standard deviation are
buffers of the module, so a saved state dict is all a policy needs.
"""

from __future__ import annotations

import hashlib
from typing import Dict, Sequence

import numpy as np
import torch
from torch import nn


class SpatialSoftmax(nn.Module):
    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        n, k, h, w = maps.shape
        flat = maps.reshape(n, k, h * w)
        prob = torch.softmax(flat, dim=-1).reshape(n, k, h, w)
        ys = torch.linspace(-1.0, 1.0, h, device=maps.device)
        xs = torch.linspace(-1.0, 1.0, w, device=maps.device)
        ex = (prob.sum(dim=2) * xs).sum(dim=-1)
        ey = (prob.sum(dim=3) * ys).sum(dim=-1)
        peak = flat.max(dim=-1).values
        return torch.cat([ex, ey, peak], dim=1)


class KeypointNet(nn.Module):
    """Image (uint8, N x H x W x 3) -> ``n_out`` values in label units."""

    def __init__(self, n_out: int, channels: Sequence[int] = (16, 32, 32), n_keypoints: int = 32, hidden: int = 128):
        super().__init__()
        layers, c_in = [], 3
        for i, c in enumerate(channels):
            layers += [nn.Conv2d(c_in, c, 5 if i == 0 else 3, stride=2 if i < 2 else 1, padding=2 if i == 0 else 1), nn.ReLU()]
            c_in = c
        layers += [nn.Conv2d(c_in, n_keypoints, 1)]
        self.trunk = nn.Sequential(*layers)
        self.keypoints = SpatialSoftmax()
        self.head = nn.Sequential(nn.Linear(3 * n_keypoints, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
        self.register_buffer("label_mean", torch.zeros(n_out))
        self.register_buffer("label_std", torch.ones(n_out))
        self.n_out = n_out

    def forward_normalized(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float() / 255.0 - 0.5
        return self.head(self.keypoints(self.trunk(x)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward_normalized(images) * self.label_std + self.label_mean

    @torch.no_grad()
    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """``forward`` for inference, bit-identical for an image whatever batch it arrives in.

        oneDNN convolutions and BLAS matrix products pick kernels by batch size, which changes
        the last bits; the native convolution works image by image, and the head's products
        are written as per-row sums. Batched policy calls therefore give the same actions.
        """
        return self._predict(images)

    @torch.no_grad()
    def predict_with_dropout(self, image: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
        """Outputs for one image (1, H, W, 3) under ``len(keep)`` dropout masks on its keypoint features.

        ``keep`` (n, 3 * n_keypoints) holds 0/1; kept features are scaled by 1 / (1 - p), as
        inverted dropout does. Monte Carlo samples of the estimate (monitors' sampling disagreement).
        """
        return self._predict(image, lambda h: h * keep / (1.0 - p))

    @torch.no_grad()
    def keypoint_features(self, images: torch.Tensor) -> torch.Tensor:
        """The spatial-softmax keypoint features (N, 3 * n_keypoints) the head reads: expected x, y and peak
        of every keypoint map (what a hidden-state monitor probes); the same kernels as :meth:`predict`."""
        mkldnn = torch.backends.mkldnn
        enabled, mkldnn.enabled = mkldnn.enabled, False
        try:
            x = images.permute(0, 3, 1, 2).float() / 255.0 - 0.5
            return self.keypoints(self.trunk(x))
        finally:
            mkldnn.enabled = enabled

    @torch.no_grad()
    def layer_features(self, images: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Every layer's representation of ``images``, by name (:data:`LAYERS`), input side first: each
        convolution's ReLU output averaged over the image (``conv1``-``conv3``, N x channels), the
        spatial-softmax keypoint features the head reads (``keypoints``, the same as
        :meth:`keypoint_features`) and the head's hidden ReLU layer (``hidden``); the kernels of :meth:`predict`."""
        mkldnn = torch.backends.mkldnn
        enabled, mkldnn.enabled = mkldnn.enabled, False
        try:
            x = images.permute(0, 3, 1, 2).float() / 255.0 - 0.5
            out: Dict[str, torch.Tensor] = {}
            for i, layer in enumerate(self.trunk):
                x = layer(x)
                if isinstance(layer, nn.ReLU):
                    out[f"conv{len(out) + 1}"] = x.mean(dim=(2, 3))
            out["keypoints"] = self.keypoints(x)
            out["hidden"] = self.head[1](_rowwise_linear(self.head[0], out["keypoints"]))
            return out
        finally:
            mkldnn.enabled = enabled

    def layer_widths(self) -> Dict[str, int]:
        """The width of each of :meth:`layer_features`' layers."""
        convs = [m.out_channels for m in self.trunk if isinstance(m, nn.Conv2d)][:-1]
        return {**{f"conv{i + 1}": c for i, c in enumerate(convs)}, "keypoints": self.head[0].in_features,
                "hidden": self.head[0].out_features}

    def _predict(self, images: torch.Tensor, edit_features=None) -> torch.Tensor:
        mkldnn = torch.backends.mkldnn
        enabled, mkldnn.enabled = mkldnn.enabled, False  # restored: training in this process keeps oneDNN
        try:
            x = images.permute(0, 3, 1, 2).float() / 255.0 - 0.5
            h = self.keypoints(self.trunk(x))
            if edit_features is not None:
                h = edit_features(h)
            for layer in self.head:
                h = _rowwise_linear(layer, h) if isinstance(layer, nn.Linear) else layer(h)
        finally:
            mkldnn.enabled = enabled
        return h * self.label_std + self.label_mean


def _rowwise_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return (x[:, None, :] * layer.weight[None]).sum(-1) + layer.bias


def state_hash(state: Dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's tensors (names, dtypes, shapes, bytes), independent of file format."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def param_count(module: nn.Module) -> int:
    return int(sum(np.prod(p.shape) for p in module.parameters()))
