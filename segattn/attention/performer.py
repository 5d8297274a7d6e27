"""Performer: FAVOR+ positive orthogonal random features (Choromanski et al. 2020, arXiv 2009.14794)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from ..layers import HW
from .base import AttentionBase
from .functional_approx import default_num_features, orthogonal_random_features, performer_attention


class PerformerAttention(AttentionBase):
    """Kernel attention whose random features estimate the softmax kernel without bias.

    The projection ω [num_features, d] is a buffer (saved in the state_dict, shared by the heads). In
    training it is redrawn every ``redraw_interval`` forward calls (0 = never; a recomputed forward under
    gradient checkpointing counts as a call); eval and export always use the stored one. Draws come from
    a per-module seed taken from the global RNG at construction, so DDP ranks seeded alike redraw alike.
    The seed and the schedule's counters are saved too (buffer ``redraw_state``), so a resumed run redraws
    when and what the uninterrupted one would; a state_dict without them (saved before they were) loads
    and leaves this module's schedule as it is.
    """

    band_parallel: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        num_features: int | None = None,
        redraw_interval: int = 1000,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        num_features = default_num_features(self.head_dim) if num_features is None else num_features
        if num_features < 1:
            raise ValueError(f"PerformerAttention: num_features={num_features}; expected an integer >= 1")
        if redraw_interval < 0:
            raise ValueError(
                f"PerformerAttention: redraw_interval={redraw_interval}; expected >= 0 (0 = never)"
            )
        self.num_features = num_features
        self.redraw_interval = redraw_interval
        self.eps = eps
        self.seed = int(torch.randint(2**62, (), device="cpu"))
        self.num_draws = 0
        self.training_calls = 0
        self.register_buffer("projection", self.draw_projection().to(self.qkv.weight.device))
        # [seed, draws, training calls], written when a state_dict is taken and read back when one is loaded:
        # the schedule itself runs on Python ints, with no device round trip per forward
        self.register_buffer("redraw_state", torch.zeros(3, dtype=torch.long, device=self.qkv.weight.device))
        self.register_state_dict_pre_hook(PerformerAttention._save_redraw_state)

    def draw_projection(self) -> Tensor:
        """The next orthogonal random projection [num_features, d] of this module's seed sequence."""
        generator = torch.Generator().manual_seed(self.seed + self.num_draws)
        self.num_draws += 1
        return orthogonal_random_features(self.num_features, self.head_dim, generator)

    @torch.compiler.disable
    def step_redraw_schedule(self) -> None:
        """Count a training call and redraw the projection in place at every ``redraw_interval``-th one."""
        if self.training_calls > 0 and self.training_calls % self.redraw_interval == 0:
            self.projection.copy_(self.draw_projection())
        self.training_calls += 1

    def _redraw_counters(self) -> Tensor:
        return torch.tensor([self.seed, self.num_draws, self.training_calls])

    def _save_redraw_state(self, prefix: str, keep_vars: bool) -> None:
        self.redraw_state.copy_(self._redraw_counters())

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        key = prefix + "redraw_state"
        if key not in state_dict:  # saved before the schedule was: keep this module's own (as BatchNorm does)
            state_dict[key] = self._redraw_counters()
        super()._load_from_state_dict(state_dict, prefix, *args)
        self.seed, self.num_draws, self.training_calls = self.redraw_state.tolist()

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        if self.training and self.redraw_interval > 0:
            self.step_redraw_schedule()
        return performer_attention(q, k, v, self.projection, self.eps, self.kernel_backend)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_features={self.num_features}, "
            f"redraw_interval={self.redraw_interval}"
        )
