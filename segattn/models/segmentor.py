"""Segmentor: encoder features → head logits at the input resolution, plus the protocol the trainer uses."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.fast_path import exporting
from .blocks import Checkpointable, recompute_in_backward, set_block_checkpointing
from .encoder import Encoder


class Segmentor(nn.Module):
    """Image [B, 3, H, W] → logits [B, K, H, W] for any H, W.

    The image is zero-padded on the right/bottom to a multiple of the encoder's ``stride``; logits are
    upsampled bilinearly to the padded size and cropped back. ``config`` holds the ``build_model`` kwargs
    that rebuild this model.
    """

    def __init__(
        self,
        encoder: Encoder,
        head: nn.Module,
        aux_head: nn.Module | None = None,
        aux_weight: float = 0.0,
        head_lr_mult: float = 1.0,
        layer_decay: float | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.aux_head = aux_head
        self.aux_weight = float(aux_weight) if aux_head is not None else 0.0
        self.head_lr_mult = head_lr_mult
        self.layer_decay = layer_decay
        self.num_classes: int = head.num_classes
        self.config: dict[str, Any] = {}
        self.recompute_heads = False  # heads recomputed whole in backward (set_grad_checkpointing)

    @property
    def stride(self) -> int:
        """Inputs are padded to a multiple of this inside ``forward``."""
        return self.encoder.stride

    def forward(self, images: Tensor) -> Tensor:
        return self._segment(images, with_aux=False)[0]

    def forward_with_aux(self, images: Tensor, upsample: bool = True) -> tuple[Tensor, Tensor | None]:
        """Main logits and auxiliary-head logits (None without an aux head), both at input resolution.

        ``upsample=False`` returns them as the heads make them, at their own stride of the padded image
        (``padded_size``), uncropped: for a loss that upsamples them itself (``loss.chunk_rows``)."""
        return self._segment(images, with_aux=True, upsample=upsample)

    def _segment(self, images: Tensor, with_aux: bool, upsample: bool = True) -> tuple[Tensor, Tensor | None]:
        height, width = images.shape[-2:]
        logits, aux = self.padded_logits(self.pad_to_stride(images), with_aux, upsample)
        if not upsample:
            return logits, aux
        return logits[..., :height, :width], None if aux is None else aux[..., :height, :width]

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """The sides of an image of ``height`` × ``width`` padded to a multiple of ``stride``."""
        # Round up as (n + s - 1) // s on non-negative sizes: a %-derived size reaching F.interpolate breaks
        # torch.compile(dynamic=True) in torch 2.14, and ONNX integer Div truncates negative quotients.
        stride = self.stride
        return (height + stride - 1) // stride * stride, (width + stride - 1) // stride * stride

    def pad_to_stride(self, images: Tensor) -> Tensor:
        """``images`` zero-padded on the right and bottom to a multiple of ``stride``; themselves, not a copy,
        where they are one already, except in a traced or compiled graph, which keeps the pad for the sizes
        that need one."""
        height, width = images.shape[-2:]
        padded_height, padded_width = self.padded_size(height, width)
        traced = exporting() or torch.compiler.is_compiling()
        if (padded_height, padded_width) == (height, width) and not traced:
            return images
        return F.pad(images, (0, padded_width - width, 0, padded_height - height))

    def padded_logits(
        self, padded: Tensor, with_aux: bool, upsample: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (and aux logits when ``with_aux`` and there is an aux head) at the size of ``padded``, an
        image whose sides are multiples of ``stride``: one band of it under spatial parallelism. Without
        ``upsample``, at each head's own stride."""
        features = self.encoder(padded)
        resize = self._to_padded_size if upsample else lambda logits, _: logits
        logits = resize(self._run_head(self.head, features), padded)
        if not with_aux or self.aux_head is None:
            return logits, None
        return logits, resize(self._run_head(self.aux_head, features), padded)

    def _run_head(self, head: nn.Module, features: list[Tensor]) -> Tensor:
        """``head(features)``, recomputed in backward under gradient checkpointing unless the head has
        blocks of its own (UNet's decoder), which are recomputed one by one instead: the decoder's wide
        maps at stride 4 (SegFormer's fused 256 channels) are then not held from forward to backward. Its
        BatchNorm statistics are updated once, by the forward."""
        whole = self.recompute_heads and not any(isinstance(m, Checkpointable) for m in head.modules())
        return recompute_in_backward(whole, head, features, keep_stats_of=head)

    @staticmethod
    def _to_padded_size(logits: Tensor, padded: Tensor) -> Tensor:
        if logits.shape[-2:] != padded.shape[-2:]:
            logits = F.interpolate(logits, size=padded.shape[-2:], mode="bilinear", align_corners=False)
        return logits

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``torch.compile`` encoder, head and aux head in place (``nn.Module.compile`` on each, same
        arguments), so ``forward`` and ``forward_with_aux`` both run compiled while parameter names and
        ``state_dict`` keys stay unchanged; the padding and resizing around them stay eager."""
        for part in (self.encoder, self.head, self.aux_head):
            if part is not None:
                part.compile(*args, **kwargs)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute in backward instead of storing: each transformer block (and timm CNN stage), PVT's
        patch embeddings, and each head, block by block where it has blocks, else as a whole."""
        self.encoder.set_grad_checkpointing(enable)
        set_block_checkpointing(self.head, enable)
        self.recompute_heads = enable

    def param_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW parameter groups.

        No weight decay on 1-D parameters (norms, biases, FLatten's ``scale``, LayerScale) and on the
        encoder's ``no_weight_decay()`` names (position embeddings). Head and auxiliary head train at
        ``lr · head_lr_mult``; with ``layer_decay`` the encoder parameter at depth l of L trains at
        ``lr · layer_decay^(L − l)``. Each group carries its ``lr_scale`` for schedulers.
        """
        no_decay = {f"encoder.{name}" for name in self.encoder.no_weight_decay()}
        groups: dict[str, dict[str, Any]] = {}
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            decay = param.ndim > 1 and name not in no_decay
            if name.startswith("encoder."):
                if self.layer_decay is None:
                    key, scale = "encoder", 1.0
                else:
                    layer = self.encoder.layer_id(name.removeprefix("encoder."))
                    key, scale = (
                        f"encoder.layer{layer}",
                        self.layer_decay ** (self.encoder.num_layers - layer),
                    )
            else:
                key, scale = "head", self.head_lr_mult
            key = f"{key}.{'decay' if decay else 'no_decay'}"
            group = groups.setdefault(
                key,
                {
                    "name": key,
                    "params": [],
                    "lr": lr * scale,
                    "lr_scale": scale,
                    "weight_decay": weight_decay if decay else 0.0,
                },
            )
            group["params"].append(param)
        return list(groups.values())
