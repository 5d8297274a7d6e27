"""Performer, Linformer, Nyström and SRA against explicit definitions written from their papers (issue 8).

References are spelled out here with plain tensor ops in float64 (the shared helpers come from
``attention_reference``); tokens lie row-major on the (H, W) grid.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from attention_reference import ShapeRecorder, depthwise_conv, merge, softmax_weights, split_qkv
from omegaconf import OmegaConf
from torch import Tensor

from segattn.attention import (
    attention_class,
    available_attention,
    build_attention,
    iterative_pinv,
    nystrom_attention,
    orthogonal_random_features,
    performer_attention,
    segment_means,
)
from segattn.attention.functional_approx import _performer_attention

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention"
NAMES = ["performer", "linformer", "nystrom", "sra"]
# Small, non-default settings that exercise each variant's particular path.
OPTIONS: dict[str, dict[str, Any]] = {
    "performer": {"redraw_interval": 2},
    "linformer": {"max_tokens": 4096, "proj_len": 24, "share_kv": True},
    "nystrom": {"num_landmarks": 18},  # N = 240 and 4096 are not multiples of 18: padded segments
    "sra": {"sr_ratio": 2},
}
FLAGS = {  # (onnx_dynamic, quadratic) as docs/attention.md documents them
    "performer": (True, False),
    "linformer": (False, False),
    "nystrom": (True, False),
    "sra": (True, True),
}


def project(module: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return split_qkv(x, module.qkv.weight, module.qkv.bias, module.num_heads)


def output(module: torch.nn.Module, heads_out: Tensor) -> Tensor:
    return merge(heads_out) @ module.proj.weight.T + module.proj.bias


def performer_reference(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> Tensor:
    """Kernel attention with φ(x) = m^-½ exp(ωᵀx − ‖x‖²/2) on q, k scaled by d^-¼, unstabilised, eps = 0."""
    q, k, v = project(module, x)
    omega = module.projection.double()
    scale = q.shape[-1] ** -0.25

    def phi(t: Tensor) -> Tensor:
        t = t * scale
        return torch.exp(t @ omega.T - 0.5 * (t * t).sum(-1, keepdim=True)) / math.sqrt(omega.shape[0])

    sim = phi(q) @ phi(k).transpose(-2, -1)  # [B, h, N, N]
    return output(module, (sim / sim.sum(-1, keepdim=True)) @ v)


def linformer_reference(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> Tensor:
    """softmax(q (E k)ᵀ/√d)(F v) with the first N columns of E, F as they are."""
    q, k, v = project(module, x)
    n = x.shape[1]
    e = module.proj_e.weight[:, :n]
    f = e if module.proj_f is None else module.proj_f.weight[:, :n]
    return output(module, softmax_weights(q, e @ k) @ (f @ v))


def segments(n: int, m: int) -> list[list[int]]:
    """Token indices of the m landmark segments: ⌈N/m⌉ tokens each, the last m⌈N/m⌉ − N one short
    (their pad token left out); with N < m the surplus segments repeat the last token."""
    if n < m:
        return [[i] for i in range(n)] + [[n - 1]] * (m - n)
    length = -(-n // m)
    short = m * length - n
    sizes = [length] * (m - short) + [length - 1] * short
    starts = [sum(sizes[:i]) for i in range(m)]
    return [list(range(start, start + size)) for start, size in zip(starts, sizes, strict=True)]


def newton_schulz_pinv(a: Tensor, iterations: int) -> Tensor:
    """The paper's iteration for one matrix: Z₀ = Aᵀ/(max col sum · max row sum), Z ← ¼Z(13I − AZ(15I −
    AZ(7I − AZ)))."""
    eye = torch.eye(a.shape[0], dtype=a.dtype)
    z = a.T / (max(a.abs().sum(0)) * max(a.abs().sum(1)))
    for _ in range(iterations):
        az = a @ z
        z = z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az))) / 4
    return z


def nystrom_core(q: Tensor, k: Tensor, v: Tensor, m: int, pinv: Any) -> Tensor:
    """F̃ pinv(Ã) B̃ v per [N, d] head, landmarks = segment means of q, k."""
    groups = segments(q.shape[0], m)
    q_land = torch.stack([q[group].mean(0) for group in groups])
    k_land = torch.stack([k[group].mean(0) for group in groups])
    return (
        softmax_weights(q, k_land) @ pinv(softmax_weights(q_land, k_land)) @ (softmax_weights(q_land, k) @ v)
    )


def nystrom_reference(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> Tensor:
    """Nyström per batch element and head with the paper's pinv iteration, plus the depthwise conv on V."""
    q, k, v = project(module, x)
    pinv = lambda a: newton_schulz_pinv(a, module.pinv_iterations)
    heads = torch.stack(
        [
            torch.stack(
                [
                    nystrom_core(q[b, h], k[b, h], v[b, h], module.num_landmarks, pinv)
                    for h in range(q.shape[1])
                ]
            )
            for b in range(q.shape[0])
        ]
    )
    out = merge(heads)
    if module.conv is not None:
        v_tokens = merge(v)  # [B, N, C]
        out = out + torch.stack(
            [
                depthwise_conv(t.T.reshape(-1, *hw), module.conv.weight, module.conv.bias).flatten(1).T
                for t in v_tokens
            ]
        )
    return out @ module.proj.weight.T + module.proj.bias


def sra_reference(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> Tensor:
    """PVT: K, V from the R×R patches of the grid (stride-R conv = patch · weight), LayerNorm, softmax."""
    r, (height, width), channels = module.sr_ratio, hw, x.shape[-1]
    q = project(module, x)[0]
    grid = x.reshape(x.shape[0], height, width, channels)[:, : height // r * r, : width // r * r]
    patches = grid.reshape(x.shape[0], height // r, r, width // r, r, channels).permute(0, 1, 3, 5, 2, 4)
    reduced = patches.flatten(3) @ module.sr.weight.flatten(1).T + module.sr.bias  # [B, H/R, W/R, C]
    reduced = reduced.flatten(1, 2)
    mean = reduced.mean(-1, keepdim=True)
    var = ((reduced - mean) ** 2).mean(-1, keepdim=True)
    reduced = (reduced - mean) / torch.sqrt(var + module.norm.eps) * module.norm.weight + module.norm.bias
    kv = reduced @ module.qkv.weight[channels:].T + module.qkv.bias[channels:]
    heads = module.num_heads
    k, v = (t.unflatten(-1, (heads, channels // heads)).transpose(1, 2) for t in kv.split(channels, -1))
    return output(module, softmax_weights(q, k) @ v)


REFERENCES = {
    "performer": performer_reference,
    "linformer": linformer_reference,
    "nystrom": nystrom_reference,
    "sra": sra_reference,
}


def randomise(module: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    """Move every parameter away from its init (LayerNorm's 1/0, zero biases) so nothing is trivial."""
    with torch.no_grad():
        for param in module.parameters():
            param.add_(scale * torch.randn_like(param))
    return module


# ---------------------------------------------------------------------------------------------- all four


@pytest.mark.parametrize("name", NAMES)
def test_registered_config_builds_and_flags(name: str) -> None:
    assert name in available_attention()
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    assert cfg.name == name
    module = build_attention(cfg.name, 32, 4, **OmegaConf.to_container(cfg.options))
    assert module(torch.randn(1, 8 * 8, 32), (8, 8)).shape == (1, 64, 32)
    cls = attention_class(name)
    assert (cls.onnx_dynamic, cls.quadratic) == FLAGS[name]


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("performer", {"eps": 0.0}),  # the reference is the unstabilised ratio without eps
        ("linformer", {}),
        ("linformer", {"share_kv": False}),
        ("nystrom", {}),
        ("nystrom", {"conv_kernel": 0, "num_landmarks": 30}),  # no conv; 240 = 30 segments of 8, no pad
        ("sra", {}),
        ("sra", {"sr_ratio": 3}),  # 12×20 is not a multiple of 3 in W: the conv drops the last column
    ],
)
def test_equals_explicit_reference_on_non_square_grid(name: str, extra: dict[str, Any]) -> None:
    torch.manual_seed(0)
    hw = (12, 20)
    module = randomise(build_attention(name, 32, 2, **{**OPTIONS[name], **extra})).double().eval()
    x = torch.randn(2, hw[0] * hw[1], 32, dtype=torch.float64)
    expected = REFERENCES[name](module, x, hw)
    assert (module(x, hw) - expected).abs().max() <= 1e-10 * expected.abs().max()


@pytest.mark.parametrize("name", NAMES)
def test_no_tensor_with_two_dims_of_size_n(name: str) -> None:
    """Forward + backward at N = 4096 in training mode: no tensor has two dims ≥ N."""
    n, hw = 4096, (64, 64)
    module = build_attention(name, 16, 2, **OPTIONS[name]).train()
    x = torch.randn(1, n, 16, requires_grad=True)
    with ShapeRecorder() as recorder:
        module(x, hw).square().mean().backward()
    assert any(op.startswith("aten.mm") for op, _ in recorder.records)  # backward was recorded
    assert recorder.quadratic(n) == []


@pytest.mark.parametrize("name", NAMES)
def test_bf16_autocast_with_large_activations_is_finite(name: str) -> None:
    torch.manual_seed(0)
    hw = (32, 32)
    module = build_attention(name, 32, 2, **OPTIONS[name]).train()
    x = (torch.rand(2, hw[0] * hw[1], 32) * 100 - 50).requires_grad_()  # |x| up to 50
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x, hw)
    out.float().square().mean().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_after_training_steps(name: str) -> None:
    torch.manual_seed(0)
    hw = (12, 20)
    source = randomise(build_attention(name, 32, 2, **OPTIONS[name])).train()
    for _ in range(3):  # Performer redraws at the second call: the saved buffer must be the new draw
        source(torch.randn(1, hw[0] * hw[1], 32), hw)
    source.eval()
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(1)
    target = build_attention(name, 32, 2, **OPTIONS[name]).eval()
    x = torch.randn(2, hw[0] * hw[1], 32)
    assert not torch.equal(target(x, hw), source(x, hw))
    target.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(target(x, hw), source(x, hw))


# --------------------------------------------------------------------------------------------- Performer


def test_orthogonal_random_features_are_orthogonal_blocks_with_chi_norms() -> None:
    d, m = 16, 40
    omega = orthogonal_random_features(m, d, torch.Generator().manual_seed(0), dtype=torch.float64)
    assert omega.shape == (m, d)
    norms = omega.norm(dim=-1)
    for block in (omega[:16], omega[16:32], omega[32:]):
        gram = block @ block.T
        assert (gram - torch.diag(gram.diagonal())).abs().max() <= 1e-10  # orthogonal rows
    assert norms.std() > 0.1  # rescaled by independent χ(d) draws, not unit rows
    # Every row is marginally N(0, I): the second moment over many rows is close to the identity.
    many = orthogonal_random_features(64 * d, d, torch.Generator().manual_seed(1), dtype=torch.float64)
    assert (many.T @ many / many.shape[0] - torch.eye(d, dtype=torch.float64)).abs().max() < 0.2


def test_performer_converges_to_softmax_as_features_grow() -> None:
    """Mean |error| vs softmax(q kᵀ/√d) v, averaged over 4 projection seeds, falls at every size step."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    q, k = 0.5 * q, 0.5 * k
    exact = softmax_weights(q, k) @ v
    errors = []
    for num_features in (16, 128, 1024):
        per_seed = [
            performer_attention(
                q,
                k,
                v,
                orthogonal_random_features(num_features, 16, torch.Generator().manual_seed(s), torch.float64),
            )
            .sub(exact)
            .abs()
            .mean()
            .item()
            for s in range(4)
        ]
        errors.append(sum(per_seed) / len(per_seed))
    assert errors[0] > 1.5 * errors[1] > 2.25 * errors[2], errors
    assert errors[2] < 0.015, errors


def test_performer_fast_path_gradients_equal_autograd_through_the_formula() -> None:
    """The FAVOR+ autograd Function (hand-written backward) against autograd of the plain formula, float64, on
    strided head views like the module's, plus gradcheck."""
    torch.manual_seed(0)
    projection = orthogonal_random_features(20, 8, dtype=torch.float64)
    qkv = torch.randn(2, 50, 3, 3, 8, dtype=torch.float64)
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in qkv.unbind(2))
    fast = performer_attention(q, k, v, projection)
    plain = _performer_attention(q, k, v, projection, 1e-6)
    assert (fast - plain).abs().max() <= 1e-12
    upstream = torch.randn_like(fast)
    for mine, theirs in zip(
        torch.autograd.grad(fast, [q, k, v], upstream),
        torch.autograd.grad(plain, [q, k, v], upstream),
        strict=True,
    ):
        assert (mine - theirs).abs().max() <= 1e-12
    # fast mode checks random projections of the Jacobian (a few passes) instead of one per input element
    assert torch.autograd.gradcheck(
        lambda a, b, c: performer_attention(a, b, c, projection), (q, k, v), fast_mode=True
    )


def test_performer_redraws_on_schedule_in_training_and_never_in_eval() -> None:
    torch.manual_seed(0)
    module = build_attention("performer", 16, 2, redraw_interval=3)
    x, hw = torch.randn(1, 16, 16), (4, 4)
    draws = []
    for _ in range(7):
        module(x, hw)
        draws.append(module.projection.clone())
    changed = [i for i in range(1, 7) if not torch.equal(draws[i], draws[i - 1])]
    assert changed == [3, 6]  # calls 0-2 use the first draw, 3-5 the second, 6 the third

    module.eval()
    outputs = [module(x, hw) for _ in range(5)]
    assert all(torch.equal(out, outputs[0]) for out in outputs)
    assert torch.equal(module.projection, draws[-1])

    never = build_attention("performer", 16, 2, redraw_interval=0)
    before = never.projection.clone()
    for _ in range(5):
        never(x, hw)
    assert torch.equal(never.projection, before)


def test_performer_resumed_from_a_state_dict_redraws_when_and_what_the_uninterrupted_module_does() -> None:
    x, hw = torch.randn(1, 16, 16), (4, 4)
    torch.manual_seed(0)
    straight = build_attention("performer", 16, 2, redraw_interval=3)
    for _ in range(5):
        straight(x, hw)
    saved = {key: value.clone() for key, value in straight.state_dict().items()}
    torch.manual_seed(1)  # another seed: without the saved schedule it would draw other projections
    resumed = build_attention("performer", 16, 2, redraw_interval=3)
    resumed.load_state_dict(saved)
    for _ in range(7):  # redraws at calls 6 and 9 of the schedule
        straight(x, hw)
        resumed(x, hw)
        assert torch.equal(resumed.projection, straight.projection)
    assert (resumed.seed, resumed.num_draws, resumed.training_calls) == (
        straight.seed,
        straight.num_draws,
        straight.training_calls,
    )


def test_performer_loads_a_state_dict_saved_without_the_schedule_and_keeps_its_own() -> None:
    torch.manual_seed(0)
    module = build_attention("performer", 16, 2, redraw_interval=3)
    old = {key: value for key, value in module.state_dict().items() if not key.endswith("redraw_state")}
    torch.manual_seed(1)
    target = build_attention("performer", 16, 2, redraw_interval=3)
    own = (target.seed, target.num_draws, target.training_calls)
    target.load_state_dict(old)  # strict: the missing key is not an error
    assert torch.equal(target.projection, module.projection)
    assert (target.seed, target.num_draws, target.training_calls) == own


def test_performer_default_feature_count_is_d_ln_d() -> None:
    module = build_attention("performer", 64 * 4, 4)
    assert module.projection.shape == (round(64 * math.log(64)), 64)


# --------------------------------------------------------------------------------------------- Linformer


def test_linformer_refuses_more_tokens_than_max_tokens_and_says_how_to_raise_it() -> None:
    module = build_attention("linformer", 32, 2, max_tokens=64, proj_len=8)
    assert module.max_tokens == 64
    assert module(torch.randn(1, 64, 32), (8, 8)).shape == (1, 64, 32)  # exactly at the limit
    with pytest.raises(
        ValueError, match=r"N=72 .*max_tokens=64.*8×8 grid.*attention\.options\.max_tokens=72"
    ):
        module(torch.randn(1, 72, 32), (8, 9))


def test_linformer_share_kv_uses_one_projection() -> None:
    shared = build_attention("linformer", 32, 2, max_tokens=100, proj_len=8, share_kv=True)
    separate = build_attention("linformer", 32, 2, max_tokens=100, proj_len=8)
    extra = lambda m: {k for k in m.state_dict() if k.startswith("proj_")} - {"proj.weight", "proj.bias"}
    assert extra(shared) == {"proj_e.weight"}
    assert extra(separate) == {"proj_e.weight", "proj_f.weight"}


# ----------------------------------------------------------------------------------------------- Nyström


def test_segment_means_by_hand() -> None:
    x = torch.arange(10.0).reshape(1, 1, 10, 1)
    # 4 segments: pad 10 -> 12 with one pad in each of the last two: [0 1 2] [3 4 5] [6 7 .] [8 9 .]
    assert segment_means(x, 4).flatten().tolist() == [1.0, 4.0, 6.5, 8.5]
    assert segment_means(x, 10).flatten().tolist() == list(range(10))
    assert segment_means(x, 12).flatten().tolist() == [*range(10), 9, 9]  # N < landmarks: repeat the last


@pytest.mark.parametrize("num_landmarks", [64, 70])
def test_nystrom_with_every_token_a_landmark_equals_softmax(num_landmarks: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    out = nystrom_attention(q, k, v, num_landmarks, pinv_iterations=30)
    assert (out - softmax_weights(q, k) @ v).abs().max() <= 1e-4


def test_iterative_pinv_converges_to_the_moore_penrose_inverse() -> None:
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(3, 16, 16, generator=gen, dtype=torch.float64) * 2).softmax(-1)
    a[1, :, -1] = a[1, :, 0]  # one singular matrix: pinv, not inverse
    assert (iterative_pinv(a, 40) - torch.linalg.pinv(a)).abs().max() <= 1e-8


# --------------------------------------------------------------------------------------------------- SRA


def test_sra_defaults_to_ratio_two_and_with_ratio_one_is_exactly_softmax() -> None:
    assert build_attention("sra", 32, 2).sr_ratio == 2
    torch.manual_seed(0)
    softmax = build_attention("softmax", 32, 2).eval()
    sra = build_attention("sra", 32, 2, sr_ratio=1).eval()
    sra.load_state_dict(softmax.state_dict())
    x = torch.randn(2, 12 * 20, 32)
    assert torch.equal(sra(x, (12, 20)), softmax(x, (12, 20)))
