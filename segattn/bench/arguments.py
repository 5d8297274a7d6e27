"""The command line of ``python -m segattn.bench``: one subcommand per part, the options every part shares
(``common_parser``) and each part's own group. The values are checked as they are parsed (``flags``);
options left unset are ``None``, so that each part's preset for the device fills them
(``__main__.PRESETS``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import flags


def add_raster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("raster")
    group.add_argument(
        "--size", type=flags.positive_int, help="side of the generated square GeoTIFF (default 20000)"
    )
    group.add_argument("--crop", type=flags.positive_int, help="slide window side (default 1024)")
    group.add_argument("--stride", type=flags.positive_int, help="slide stride (default half the window)")
    group.add_argument(
        "--crop-batch-size", type=flags.positive_int, help="windows per forward pass (default 2)"
    )
    group.add_argument("--classes", type=flags.positive_int, help="classes of the tiny model (default 3)")


def add_accuracy_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("accuracy")
    group.add_argument("--experiment", help="conf/experiment/<name> every run trains with")
    group.add_argument("--seeds", nargs="+", type=flags.non_negative_int, help="one run per variant and seed")
    group.add_argument(
        "--jobs", type=flags.positive_int, help="runs side by side, each with cores / jobs threads"
    )
    group.add_argument(
        "--arms", nargs="+", help="only these arms of the experiment's table.arms, by label (default: all)"
    )
    group.add_argument(
        "--overrides", nargs="+", help="Hydra overrides for every run, e.g. data.root=../shared/data/camvid"
    )
    group.add_argument("--repeats", type=flags.positive_int, help="timed step repeats for the s/step column")
    group.add_argument(
        "--budget-gib", type=flags.positive_float, help="memory budget of the largest-image column"
    )
    group.add_argument("--no-maxres", action="store_true", help="skip the largest-image column")
    group.add_argument("--start", type=flags.positive_int, help="first maxres probe size (pixels per side)")
    group.add_argument("--step", type=flags.positive_int, help="resolution of the maxres search")
    group.add_argument("--max-size", type=flags.positive_int, help="stop the maxres search above this size")
    group.add_argument(
        "--probe-timeout", type=flags.positive_float, help="seconds before a maxres probe counts as too slow"
    )
    group.add_argument(
        "--only",
        choices=["train", "costs", "table"],
        help="one phase: train the runs; measure the costs into costs.json (e.g. while another process "
        "trains); or table the runs finished so far (nothing trained). Without it: all three",
    )


def common_parser() -> argparse.ArgumentParser:
    common = flags.OneLineParser(add_help=False)
    common.add_argument("--smoke", action="store_true", help="tiny sizes that finish in seconds (CI)")
    common.add_argument("--out", type=Path, help="run directory (default bench_results/<timestamp>/)")
    common.add_argument("--device", help="cpu or cuda[:i] (default: cuda when available)")
    common.add_argument(
        "--threads",
        type=flags.positive_int,
        help="torch intra-op threads (default: torch's choice); in accuracy, those of each training run "
        "(default: cores / jobs)",
    )
    common.add_argument(
        "--variants",
        nargs="+",
        type=flags.variant,
        help="attention specs, e.g. flatten linear:feature_map=relu",
    )
    common.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="CPU timing clock: wall time, or process CPU time (robust on a busy machine with --threads 1)",
    )
    common.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    common.add_argument(
        "--debug", action="store_true", help="show the traceback of a refusal instead of its one line"
    )
    common.add_argument(
        "--compile",
        action="store_true",
        help="also run each variant under torch.compile (op, model, maxres), labelled <variant>+compile",
    )
    return common


def add_op_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("op")
    group.add_argument("--sizes", nargs="+", type=flags.count, help="token counts, e.g. 1k 4k 64k")
    group.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16", "fp16"])
    group.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"])
    group.add_argument("--batch", type=flags.positive_int)
    group.add_argument("--dim", type=flags.positive_int, help="channels C (default 64)")
    group.add_argument("--heads", type=flags.positive_int, help="heads (default 2, i.e. head dim 32)")
    group.add_argument(
        "--repeats", type=flags.positive_int, help="timed repeats after warm-up (median reported)"
    )
    group.add_argument("--warmup", type=flags.non_negative_int)
    group.add_argument(
        "--config-seconds",
        type=flags.positive_float,
        help="fewer repeats for calls slower than this / repeats",
    )
    group.add_argument(
        "--max-call-seconds", type=flags.positive_float, help="skip sizes predicted slower than this per call"
    )
    group.add_argument("--no-profile", action="store_true", help="skip the host/device profile of one call")
    group.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="also each eager variant captured into a CUDA graph and replayed, labelled <variant>+graphs "
        "(CUDA only): the pair shows the host's share of a call",
    )
    group.add_argument(
        "--profile-tokens", type=flags.count, help="profile at this size (default: the largest each ran at)"
    )
    group.add_argument(
        "--kernels",
        nargs="+",
        type=flags.kernel,
        help="SEGATTN_KERNEL values to time side by side for the variants with a Triton path "
        "(default: torch triton on CUDA, auto elsewhere); triton:BxWxP also sets the Triton launch: "
        "tokens per block, warps, reduction programs per multiprocessor (_ keeps a default), "
        "e.g. triton:128x8x4",
    )


def add_model_options(parser: argparse.ArgumentParser, maxres: bool) -> None:
    group = parser.add_argument_group("maxres" if maxres else "model")
    group.add_argument(
        "--models", nargs="+", type=flags.model, help="model specs, e.g. pvt:size=b0 vit:size=small"
    )
    group.add_argument(
        "--kernels",
        nargs="+",
        type=flags.kernel_path,
        help="SEGATTN_KERNEL values (auto, torch, triton) each model is built under, side by side: rows "
        "<variant>@<kernel> for the variants with a Triton path (default: auto, as the environment says)",
    )
    if maxres:
        group.add_argument(
            "--budget-gib", type=flags.positive_float, help="memory budget (default 80%% of free RAM / GPU)"
        )
        group.add_argument("--checkpointing", choices=["off", "on", "both"])
        group.add_argument(
            "--spatial",
            type=flags.positive_int,
            nargs="+",
            metavar="P",
            help="band counts: each probe also trains one image split into P bands over P gloo processes "
            "(trainer=spatial); 1 = one process. Budget and peak are per process",
        )
        group.add_argument("--start", type=flags.positive_int, help="first probe size (pixels per side)")
        group.add_argument(
            "--step", type=flags.positive_int, help="resolution of the search (sizes are multiples of it)"
        )
        group.add_argument("--max-size", type=flags.positive_int, help="stop searching above this size")
        group.add_argument(
            "--probe-timeout", type=flags.positive_float, help="seconds before a probe counts as too slow"
        )
        group.add_argument("--dtype", choices=["fp32", "bf16", "fp16"])
        group.add_argument(
            "--extrapolate-gib", type=flags.positive_float, help="also predict the maxres for this budget"
        )
    else:
        group.add_argument(
            "--image-sizes",
            nargs="+",
            type=flags.image_size,
            help="image sizes: sides of squares or WIDTHxHEIGHT, e.g. 2048 4096 4288x2848",
        )
        group.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16", "fp16"])
        group.add_argument("--batch", nargs="+", type=flags.positive_int, help="batch sizes, one row each")
        group.add_argument("--repeats", type=flags.positive_int)
        group.add_argument(
            "--max-step-seconds", type=flags.positive_float, help="skip sizes predicted slower than this"
        )
        group.add_argument(
            "--time-budget",
            type=flags.positive_float,
            help="seconds for the timing: sizes not started by then are skipped, and the table says so",
        )


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The bench's command line: a part (op, model, maxres, accuracy, raster, all) and its options; a bad
    value ends here, in one line (``flags``). ``description``: the text of ``--help``."""
    parser = flags.OneLineParser(prog="python -m segattn.bench", description=description)
    parts = parser.add_subparsers(dest="part", required=True)
    common = common_parser()
    add_op_options(parts.add_parser("op", parents=[common], help="attention ops vs the memory-traffic floor"))
    add_model_options(parts.add_parser("model", parents=[common], help="full training steps"), maxres=False)
    add_model_options(
        parts.add_parser("maxres", parents=[common], help="largest trainable image"), maxres=True
    )
    add_accuracy_options(
        parts.add_parser(
            "accuracy", parents=[common], help="test mIoU vs training cost: trains every variant (resumable)"
        )
    )
    add_raster_options(
        parts.add_parser(
            "raster", parents=[common], help="streaming predict of a generated GeoTIFF: peak RSS, windows/s"
        )
    )
    parts.add_parser("all", parents=[common], help="op, model and maxres with their defaults")
    return parser.parse_args(argv)
