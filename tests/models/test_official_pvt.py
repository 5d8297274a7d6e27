"""The official ImageNet checkpoints of FLatten-PVT, Agent-PVT and PolaFormer-PVT (and of PVT v1 itself) load
into ``model=pvt_v1``.

Each test builds a state dict with the names and shapes the official code creates for its smallest release
(``*_pvt_tiny``: widths 64/128/320/512, heads 1/2/5/8, MLP ratios 8/8/4/4, two blocks per stage, 224²
input, the released ``la_sr_ratios`` '1111' and Agent's counts 9/16/49/49; PVT v1: softmax with
``sr_ratios`` 8/4/2/1 and a class token in the last stage), with random values: no download. The
correspondence checked below is the one official_pvt documents.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import Tensor

from segattn.layers import resample_grid_embedding
from segattn.models import build_model

DIMS, HEADS, MLP_RATIOS, DEPTHS = (64, 128, 320, 512), (1, 2, 5, 8), (8, 8, 4, 4), (2, 2, 2, 2)
GRIDS = (56, 28, 14, 7)  # 224 / 4, then halved by each stage's 2×2 patches
AGENT_NUMS = (9, 16, 49, 49)
V1 = {
    "size": "tiny",
    "patch_embed": "plain",
    "ffn": "mlp",
    "position_encoding": "learned",
    "stage_norm": False,
}
EXTRA = {"agent": {"stage_attention_options": [{"agent_num": n} for n in AGENT_NUMS]}}
CLASSIFIER = ("head.", "norm.", "cls_token")


def attention_shapes(release: str, dim: int, heads: int, grid: int, agents: int, sr: int) -> dict[str, tuple]:
    """The attention parameters of one official block (linear ones without reduction: la_sr_ratios '1111')."""
    d = dim // heads
    shapes = {
        "kv.weight": (2 * dim, dim),
        "kv.bias": (2 * dim,),
        "proj.weight": (dim, dim),
        "proj.bias": (dim,),
    }
    if release == "softmax":  # PVT v1's spatial-reduction attention
        shapes |= {"q.weight": (dim, dim), "q.bias": (dim,)}
        if sr > 1:
            shapes |= {
                "sr.weight": (dim, dim, sr, sr),
                "sr.bias": (dim,),
                "norm.weight": (dim,),
                "norm.bias": (dim,),
            }
    elif release == "pola":
        shapes |= {"qg.weight": (2 * dim, dim), "qg.bias": (2 * dim,), "power": (1, heads, 1, d)}
    else:
        shapes |= {"q.weight": (dim, dim), "q.bias": (dim,)}
    if release in ("flatten", "pola"):
        shapes |= {"dwc.weight": (d, 1, 5, 5), "dwc.bias": (d,), "scale": (1, 1, dim)}
        shapes |= {"positional_encoding": (1, grid * grid, dim)}
    if release == "agent":
        shapes |= {"dwc.weight": (dim, 1, 3, 3), "dwc.bias": (dim,)}
        shapes |= {"an_bias": (heads, agents, 7, 7), "na_bias": (heads, agents, 7, 7)}
        shapes |= {"ah_bias": (1, heads, agents, grid, 1), "aw_bias": (1, heads, agents, 1, grid)}
        shapes |= {"ha_bias": (1, heads, grid, 1, agents), "wa_bias": (1, heads, 1, grid, agents)}
    return shapes


def official_state_dict(release: str) -> dict[str, Tensor]:
    """``{flatten,agent,pola}_pvt_tiny().state_dict()`` names and shapes, random values."""
    shapes: dict[str, tuple] = {}
    for s, (dim, heads, ratio, depth, grid) in enumerate(
        zip(DIMS, HEADS, MLP_RATIOS, DEPTHS, GRIDS, strict=True)
    ):
        patch, dim_in = (4, 3) if s == 0 else (2, DIMS[s - 1])
        embed = f"patch_embed{s + 1}."
        shapes |= {embed + "proj.weight": (dim, dim_in, patch, patch), embed + "proj.bias": (dim,)}
        shapes |= {
            embed + "norm.weight": (dim,),
            embed + "norm.bias": (dim,),
            f"pos_embed{s + 1}": (1, grid**2, dim),
        }
        for j in range(depth):
            block = f"block{s + 1}.{j}."
            for norm in ("norm1", "norm2"):
                shapes |= {f"{block}{norm}.weight": (dim,), f"{block}{norm}.bias": (dim,)}
            hidden = dim * ratio
            shapes |= {block + "mlp.fc1.weight": (hidden, dim), block + "mlp.fc1.bias": (hidden,)}
            shapes |= {block + "mlp.fc2.weight": (dim, hidden), block + "mlp.fc2.bias": (dim,)}
            attention = attention_shapes(release, dim, heads, grid, AGENT_NUMS[s], (8, 4, 2, 1)[s])
            shapes |= {f"{block}attn.{name}": shape for name, shape in attention.items()}
    shapes |= {"head.weight": (1000, 512), "head.bias": (1000,)}
    if release != "agent":  # PVT's classifier norm (FLatten's, PolaFormer's: unused by their forward)
        shapes |= {"norm.weight": (512,), "norm.bias": (512,)}
    if release == "softmax":  # PVT v1's class token, with its slot first in the last stage's embedding
        shapes |= {"cls_token": (1, 1, 512), "pos_embed4": (1, 1 + 7 * 7, 512)}
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}


def official_source(key: str, official: dict[str, Tensor]) -> tuple[Tensor, set[str]]:
    """The value segattn's parameter ``key`` must hold, and the official keys it comes from."""
    renames = [
        (r"patch_embed\.(.+)", lambda m: f"patch_embed1.{m[1]}"),
        (r"stages\.(\d)\.downsample\.(.+)", lambda m: f"patch_embed{int(m[1]) + 1}.{m[2]}"),
        (r"stages\.(\d)\.pos_embed", lambda m: f"pos_embed{int(m[1]) + 1}"),
        (r"stages\.(\d)\.blocks\.(\d+)\.(.+)", lambda m: f"block{int(m[1]) + 1}.{m[2]}.{m[3]}"),
    ]
    name = next(replace(m) for pattern, replace in renames if (m := re.fullmatch(pattern, key)))
    prefix, _, param = name.rpartition("attn.")
    if param.startswith("qkv."):
        kv = f"{prefix}attn.kv.{param[4:]}"
        q = f"{prefix}attn.q.{param[4:]}"
        if q in official:
            return torch.cat([official[q], official[kv]]), {q, kv}
        qg = f"{prefix}attn.qg.{param[4:]}"
        return torch.cat([official[qg].chunk(2)[0], official[kv]]), {qg, kv}
    if param.startswith("gate."):
        qg = f"{prefix}attn.qg.{param[5:]}"
        return official[qg].chunk(2)[1], {qg}
    if name == "pos_embed4" and "cls_token" in official:
        return official[name][:, 1:], {name}  # the class token's slot cut
    return official[name], {name}


@pytest.fixture(scope="module", params=["flatten", "agent", "pola", "softmax"])
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(release, official state dict, the pvt_v1 model loaded from it as a training checkpoint file)."""
    release = request.param
    official = official_state_dict(release)
    path = tmp_path_factory.mktemp(release) / f"{release}_pvt_tiny.pth"
    torch.save({"model": official, "epoch": 299}, path)  # the releases' checkpoint layout
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no attention parameter left over or left at its initialisation
        model = build_model("pvt", 3, attention=release, pretrained=str(path), **V1, **EXTRA.get(release, {}))
    return release, official, model.eval()


def test_every_parameter_comes_from_the_checkpoint_and_every_key_is_used(loaded) -> None:
    _, official, model = loaded
    used: set[str] = set()
    for key, value in model.encoder.state_dict().items():
        expected, sources = official_source(key, official)
        assert torch.equal(value, expected.reshape(value.shape)), key
        used |= sources
    assert used == {k for k in official if not k.startswith(CLASSIFIER)}


def test_runs_at_224_and_at_a_larger_non_square_size(loaded) -> None:
    _, _, model = loaded
    with torch.no_grad():
        for height, width in ((224, 224), (224, 288)):
            features = model.encoder(torch.randn(1, 3, height, width))
            assert [tuple(f.shape) for f in features] == [
                (1, dim, height // 4 // 2**s, width // 4 // 2**s) for s, dim in enumerate(DIMS)
            ]
            assert all(torch.isfinite(f).all() for f in features)


def test_position_encodings_are_the_stored_ones_at_224_and_bilinear_elsewhere(loaded) -> None:
    release, official, model = loaded
    for s, stage in enumerate(model.encoder.stages):
        grid, stored = GRIDS[s], official_source(f"stages.{s}.pos_embed", official)[0]
        assert torch.equal(stage.pos_embed_for((grid, grid)), stored)
        image = stored.reshape(1, grid, grid, -1).permute(0, 3, 1, 2)  # token n -> (n // W, n % W)
        wider = F.interpolate(image, size=(grid, grid * 9 // 7), mode="bilinear", align_corners=False)
        assert torch.equal(stage.pos_embed_for((grid, grid * 9 // 7)), wider.flatten(2).transpose(1, 2))
        attn = stage.blocks[1].attn
        if release in ("flatten", "pola"):  # the key encoding, at the key grid of a 224² input
            key_encoding = resample_grid_embedding(attn.positional_encoding, (grid, grid), (grid, grid))
            assert torch.equal(key_encoding, official[f"block{s + 1}.1.attn.positional_encoding"])
        if release == "agent":  # the official bias: 7×7 block bias interpolated + stored row/column biases
            block = f"block{s + 1}.1.attn."
            an_bias = F.interpolate(official[block + "an_bias"], size=(grid, grid), mode="bilinear")
            expected = an_bias + official[block + "ah_bias"][0] + official[block + "aw_bias"][0]
            torch.testing.assert_close(attn.agent_key_bias((grid, grid)), expected.flatten(-2))


def official_flatten_attention(
    sd: dict[str, Tensor], a: str, x: Tensor, hw: tuple[int, int], heads: int
) -> Tensor:
    """FLatten-PVT's attention as its paper and release define it, at la_sr_ratio 1 (224² keys: the stored
    key encoding as is): focused q, k (relu + 1e-6, / softplus(scale), power 3 renormalised over C),
    q (Σ kᵀv / n) / (q · mean k + 1e-6) per head, plus the shared depthwise conv of each head's V."""
    batch, tokens, channels = x.shape
    q = F.linear(x, sd[a + "q.weight"], sd[a + "q.bias"])
    k, v = F.linear(x, sd[a + "kv.weight"], sd[a + "kv.bias"]).chunk(2, dim=-1)
    k = k + sd[a + "positional_encoding"]
    scale = F.softplus(sd[a + "scale"])
    q, k = ((F.relu(t) + 1e-6) / scale for t in (q, k))
    q, k = (t**3 / (t**3).norm(dim=-1, keepdim=True) * t.norm(dim=-1, keepdim=True) for t in (q, k))
    q, k, v = (t.reshape(batch, tokens, heads, -1).transpose(1, 2) for t in (q, k, v))
    z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
    out = (q @ ((k.transpose(-2, -1) * tokens**-0.5) @ (v * tokens**-0.5)) * z).transpose(1, 2)
    images = v.reshape(batch * heads, *hw, -1).permute(0, 3, 1, 2)
    d = images.shape[1]
    local = F.conv2d(images, sd[a + "dwc.weight"], sd[a + "dwc.bias"], padding=2, groups=d)
    out = out.reshape(batch, tokens, channels) + local.reshape(batch, channels, tokens).transpose(1, 2)
    return F.linear(out, sd[a + "proj.weight"], sd[a + "proj.bias"])


def official_pola_attention(
    sd: dict[str, Tensor], a: str, x: Tensor, hw: tuple[int, int], heads: int
) -> Tensor:
    """PolaFormer-PVT's attention as released, at la_sr_ratio 1: q and the gate g from ``qg``, k + the stored
    key encoding, q, k / softplus(scale) split into relu(±·)^p with p = 1 + 4·sigmoid(power) per channel;
    same-sign pairs on the first half of each head's V, opposite-sign on the second; plus the shared
    depthwise conv of V; times g."""
    batch, tokens, channels = x.shape
    q, g = F.linear(x, sd[a + "qg.weight"], sd[a + "qg.bias"]).chunk(2, dim=-1)
    k, v = F.linear(x, sd[a + "kv.weight"], sd[a + "kv.bias"]).chunk(2, dim=-1)
    k = k + sd[a + "positional_encoding"]
    scale, power = F.softplus(sd[a + "scale"]), 1 + 4 * torch.sigmoid(sd[a + "power"])
    q, k, v = (t.reshape(batch, tokens, heads, -1).transpose(1, 2) for t in (q / scale, k / scale, v))
    q_pos, q_neg, k_pos, k_neg = (F.relu(t) ** power for t in (q, -q, k, -k))
    keys = torch.cat([k_pos, k_neg], dim=-1)
    halves = []
    for query, values in zip(
        (torch.cat([q_pos, q_neg], -1), torch.cat([q_neg, q_pos], -1)), v.chunk(2, dim=-1), strict=True
    ):
        z = 1 / (query @ keys.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        halves.append(query @ ((keys.transpose(-2, -1) * tokens**-0.5) @ (values * tokens**-0.5)) * z)
    out = torch.cat(halves, dim=-1).transpose(1, 2).reshape(batch, tokens, channels)
    images = v.reshape(batch * heads, *hw, -1).permute(0, 3, 1, 2)
    d = images.shape[1]
    local = F.conv2d(images, sd[a + "dwc.weight"], sd[a + "dwc.bias"], padding=2, groups=d)
    out = (out + local.reshape(batch, channels, tokens).transpose(1, 2)) * g
    return F.linear(out, sd[a + "proj.weight"], sd[a + "proj.bias"])


def official_agent_attention(
    sd: dict[str, Tensor], a: str, x: Tensor, hw: tuple[int, int], heads: int
) -> Tensor:
    """Agent-PVT's attention as released, at agent_sr_ratio 1: n agents average-pooled from the queries on a
    √n×√n grid; agents attend to the keys (bias: the 7×7 ``an_bias`` interpolated to the key grid + the
    row/column biases as stored), queries to the agents (likewise ``na_bias``, ``ha_bias``, ``wa_bias``),
    softmax with scale d^-½; plus the depthwise conv of V."""
    batch, tokens, channels = x.shape
    d, agents = channels // heads, sd[a + "an_bias"].shape[1]
    q = F.linear(x, sd[a + "q.weight"], sd[a + "q.bias"])
    k, v = F.linear(x, sd[a + "kv.weight"], sd[a + "kv.bias"]).chunk(2, dim=-1)
    side = int(agents**0.5)
    pooled = F.adaptive_avg_pool2d(q.reshape(batch, *hw, channels).permute(0, 3, 1, 2), (side, side))
    agent = pooled.reshape(batch, channels, agents).transpose(1, 2)
    q, k, v, agent = (t.reshape(batch, -1, heads, d).transpose(1, 2) for t in (q, k, v, agent))
    key_bias = F.interpolate(sd[a + "an_bias"], size=hw, mode="bilinear").reshape(1, heads, agents, -1)
    key_bias = key_bias + (sd[a + "ah_bias"] + sd[a + "aw_bias"]).reshape(1, heads, agents, -1)
    agent_v = torch.softmax(agent * d**-0.5 @ k.transpose(-2, -1) + key_bias, dim=-1) @ v
    query_bias = F.interpolate(sd[a + "na_bias"], size=hw, mode="bilinear").reshape(1, heads, agents, -1)
    query_bias = query_bias.transpose(-2, -1) + (sd[a + "ha_bias"] + sd[a + "wa_bias"]).reshape(
        1, heads, -1, agents
    )
    out = torch.softmax(q * d**-0.5 @ agent.transpose(-2, -1) + query_bias, dim=-1) @ agent_v
    out = out.transpose(1, 2).reshape(batch, tokens, channels)
    image = v.transpose(1, 2).reshape(batch, *hw, channels).permute(0, 3, 1, 2)
    local = F.conv2d(image, sd[a + "dwc.weight"], sd[a + "dwc.bias"], padding=1, groups=channels)
    return F.linear(out + local.flatten(2).transpose(1, 2), sd[a + "proj.weight"], sd[a + "proj.bias"])


def official_pvt_forward(sd: dict[str, Tensor], images: Tensor, attention) -> list[Tensor]:
    """The releases' stage outputs (as their detection/segmentation backbones return them): per stage, plain
    patches → LayerNorm (eps 1e-5) → + pos_embed, pre-norm blocks (eps 1e-6) with ``attention`` and a GELU
    MLP, no stage norm."""
    x, outs = images, []
    for s in range(4):
        p = f"patch_embed{s + 1}."
        x = F.conv2d(x, sd[p + "proj.weight"], sd[p + "proj.bias"], stride=sd[p + "proj.weight"].shape[-1])
        batch, channels, height, width = x.shape
        tokens = F.layer_norm(
            x.flatten(2).transpose(1, 2), (channels,), sd[p + "norm.weight"], sd[p + "norm.bias"]
        )
        tokens = tokens + sd[f"pos_embed{s + 1}"]  # 224² input: the stored grid
        for j in range(DEPTHS[s]):
            b = f"block{s + 1}.{j}."
            normed = F.layer_norm(tokens, (channels,), sd[b + "norm1.weight"], sd[b + "norm1.bias"], 1e-6)
            tokens = tokens + attention(sd, b + "attn.", normed, (height, width), HEADS[s])
            normed = F.layer_norm(tokens, (channels,), sd[b + "norm2.weight"], sd[b + "norm2.bias"], 1e-6)
            hidden = F.gelu(F.linear(normed, sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"]))
            tokens = tokens + F.linear(hidden, sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"])
        x = tokens.transpose(1, 2).reshape(batch, channels, height, width)
        outs.append(x)
    return outs


@pytest.mark.parametrize(
    ("release", "attention"),
    [
        ("flatten", official_flatten_attention),
        ("pola", official_pola_attention),
        ("agent", official_agent_attention),
    ],
)
def test_features_equal_the_official_forward_at_224(tmp_path: Path, release: str, attention) -> None:
    """The whole layout, not only the names: stage features of the loaded model against the release's own
    forward written from its definition, in float64 (small weights keep the activations O(1))."""
    official = {k: 0.05 * v for k, v in official_state_dict(release).items()}
    for key in official:
        if re.search(r"norm\d?\.weight$", key):
            official[key] = 1 + official[key]
    path = tmp_path / f"{release}_pvt_tiny.pth"
    torch.save({"model": official}, path)  # float32, as released; both sides compute in float64
    options = {**V1, **EXTRA.get(release, {})}
    model = build_model("pvt", 3, attention=release, pretrained=str(path), **options).double().eval()
    official = {k: v.double() for k, v in official.items()}
    images = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        for ours, theirs in zip(
            model.encoder(images), official_pvt_forward(official, images, attention), strict=True
        ):
            torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)


def test_keys_that_do_not_fit_are_named(tmp_path: Path) -> None:
    official = official_state_dict("flatten")
    official["extra_token"] = torch.zeros(1, 1, 64)
    official["block1.0.attn.temperature"] = torch.ones(1)
    path = tmp_path / "flatten_pvt_tiny.pth"
    torch.save({"model": official}, path)
    with pytest.raises(ValueError) as error:
        build_model("pvt", 3, attention="flatten", pretrained=str(path), **V1)
    message = str(error.value)
    assert message.startswith(f"pretrained={str(path)!r}: FLatten-PVT checkpoint does not fit")
    assert "keys it has no place for [extra_token] (1)" in message
    del official["extra_token"]
    torch.save({"model": official}, path)
    with pytest.warns(UserWarning, match=r"attention parameters not loaded \[block1\.0\.attn\.temperature\]"):
        build_model("pvt", 3, attention="flatten", pretrained=str(path), **V1)
    with pytest.raises(ValueError) as error:  # the PVTv2 layout has no place for the position embeddings
        build_model("pvt", 3, attention="flatten", pretrained=str(path), size="tiny")
    message = str(error.value)
    assert "pos_embed1" in message and "model=pvt_v1 attention=flatten model.depths=[2, 2, 2, 2]" in message


AGENT_OVERRIDE = (
    "model.stage_attention_options=[{agent_num: 9}, {agent_num: 16}, {agent_num: 49}, {agent_num: 49}]"
)


@pytest.mark.parametrize(
    ("attention", "overrides"), [("flatten", []), ("pola", []), ("agent", [AGENT_OVERRIDE])]
)
def test_pvt_v1_preset_composes_the_official_layout(attention: str, overrides: list[str]) -> None:
    """``model=pvt_v1 attention=<variant>`` from the real conf/: PVT v1's layout, and the attention's position
    parameters sized per stage over the yaml's single value (bias_size, position_size: 14)."""
    with initialize_config_dir(str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=pvt_v1", f"attention={attention}", *overrides])
    options = OmegaConf.to_container(cfg.model, resolve=True)
    options.pop("compile")
    group = OmegaConf.to_container(cfg.attention, resolve=True)
    assert {k: options[k] for k in V1} == V1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = build_model(
            num_classes=3, attention=group["name"], attention_options=group["options"], **options
        )
    encoder = model.encoder
    assert encoder.patch_embed.proj.kernel_size == (4, 4)
    assert all(isinstance(stage.norm, torch.nn.Identity) for stage in encoder.stages)
    assert [stage.pos_embed.shape[1] for stage in encoder.stages] == [g * g for g in GRIDS]
    attns = [stage.blocks[0].attn for stage in encoder.stages]
    assert [attn.sr_ratio for attn in attns] == [1, 1, 1, 1]
    if attention == "agent":
        assert [attn.agent_num for attn in attns] == list(AGENT_NUMS)
        assert [attn.ha_bias.shape[2] for attn in attns] == list(GRIDS)
    else:
        assert [attn.positional_encoding.shape[1] for attn in attns] == [g * g for g in GRIDS]


@dataclass
class TrainingConfig:
    """Stands for the yacs config the official training scripts save beside the weights."""

    epochs: int = 300


def test_checkpoint_with_python_objects_is_refused_naming_what_it_would_call(tmp_path: Path) -> None:
    """Refused, saying that the file asks to run code and what it would call, without suggesting
    weights_only=False (issue 27)."""
    path = tmp_path / "flatten_pvt_tiny.pth"
    torch.save({"model": {"pos_embed1": torch.zeros(1)}, "config": TrainingConfig()}, path)
    with pytest.raises(ValueError) as error:
        build_model("pvt", 3, attention="flatten", pretrained=str(path), **V1)
    message = str(error.value)
    assert message.startswith(f"model.pretrained={path}: refused to unpickle (weights_only=True): the file")
    assert f"may call {TrainingConfig.__module__}.TrainingConfig." in message
    assert "weights_only=False" not in message
