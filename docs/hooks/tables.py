"""MkDocs hook: the measured tables of the site, rendered from the files the bench writes.

A page asks for one with a comment line; the path is relative to docs/:

    <!-- bench-table h100/op.csv -->                    bench op: variants × token counts
    <!-- bench-table h100/model_pvt_b0.csv -->          bench model: variants × image sizes
    <!-- bench-table spatial/maxres.csv -->             bench maxres: largest image per variant
    <!-- bench-table h100/op.csv dtype=bf16 -->         key=value keeps the rows whose column has that value
    <!-- include accuracy/accuracy.md -->               a markdown file the bench wrote, as it is

An ``environment.json`` beside the CSV (device, torch, commit) becomes the table's caption. A file that is
not there (docs/gpu/ before `make device-check` ran) renders as a note saying so, so the build never
depends on which measurements exist. Standard library only: the docs build does not import torch.
"""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path

DIRECTIVE = re.compile(r"^<!-- (bench-table|include) (\S+)((?: \w+=\S+)*) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs = Path(config["docs_dir"])
    return DIRECTIVE.sub(lambda match: render(docs, *match.groups()), markdown)


def render(docs: Path, kind: str, path: str, args: str) -> str:
    file = docs / path
    if not file.is_file():
        return f"*Not measured yet: `docs/{path}` does not exist in this checkout.*"
    if kind == "include":
        return file.read_text().strip()
    filters = dict(arg.split("=", 1) for arg in args.split())
    with file.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if all(r.get(k) == v for k, v in filters.items())]
    if not rows:
        raise ValueError(f"bench-table {path}: no rows match {filters or 'the file'}")
    if "tokens" in rows[0]:
        table = op_table(rows)
    elif "fits" in rows[0]:
        table = probes_table(rows)
    elif "speedup" in rows[0]:
        table = model_table(rows)
    elif "maxres" in rows[0]:
        table = maxres_table(rows)
    else:
        table = markdown_table(list(rows[0]), [list(r.values()) for r in rows])
    return f"{table}\n\n{caption(file, path)}"


def caption(file: Path, path: str) -> str:
    """Where the table comes from: the CSV, and the environment.json beside it (or one folder up)."""
    source = f"Rendered from `docs/{path}`"
    folders = (file.parent, file.parent.parent)
    env_file = next((d / "environment.json" for d in folders if (d / "environment.json").is_file()), None)
    if env_file is None:
        return f"*{source}.*"
    env = json.loads(env_file.read_text())
    threads = env.get("threads")
    return (
        f"*{source}: {env.get('device')}, {threads} thread{'s' * (threads != 1)}, torch {env.get('torch')}, "
        f"commit `{env.get('commit')}`, {env.get('time', '')[:10]}.*"
    )


def op_table(rows: list[dict]) -> str:
    """One table per (dtype, mode): a row per variant, a column per token count; cell: time (× SDPA) and
    the peak memory above the inputs where it was measured."""
    parts = []
    for (dtype, mode), group in grouped(rows, ("dtype", "mode")).items():
        tokens = sorted({int(r["tokens"]) for r in group})
        cells = defaultdict(dict)
        for r in group:
            if r["status"] != "ok":
                cells[r["variant"]][int(r["tokens"])] = r["status"]
                continue
            value = seconds(r["seconds"])
            value += f" ({times(r['vs_softmax'])})" if r.get("vs_softmax") else ""
            value += f", {mib(r['peak_bytes'])}" if r.get("peak_bytes") else ""
            cells[r["variant"]][int(r["tokens"])] = value
        header = ["variant", *(f"{n:,} tokens" for n in tokens)]
        body = [[f"`{v}`", *(by_n.get(n, "") for n in tokens)] for v, by_n in cells.items()]
        what = "forward+backward" if mode == "fwdbwd" else "forward"
        legend = []
        if any(r.get("vs_softmax") for r in group):
            legend.append("× SDPA: how many times faster than `softmax`")
        if any(r.get("peak_bytes") for r in group):
            legend.append("then the peak memory above the inputs")
        parts.append(f"**{what}, {dtype}**" + (f" ({'; '.join(legend)})" if legend else "") + "\n\n")
        parts.append(markdown_table(header, body) + "\n\n")
    return "".join(parts).strip()


def model_table(rows: list[dict]) -> str:
    """A row per (model, variant), a column per image size; cell: s/step (speed-up), peak memory."""
    sizes = sorted({int(r["size"]) for r in rows})
    cells = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            value = f"{float(r['seconds']):.3g} s ({float(r['speedup']):.2g}×)"
            value += f", {gib(r['peak_bytes'])}" if r.get("peak_bytes") else ""
        else:
            value = r["status"]
        cells[(r["model"], r["variant"])][int(r["size"])] = value
    header = ["model", "variant", *(f"{s}²: s/step (speed-up), peak" for s in sizes)]
    body = [[f"`{m}`", f"`{v}`", *(by_size.get(s, "") for s in sizes)] for (m, v), by_size in cells.items()]
    return markdown_table(header, body)


def maxres_table(rows: list[dict]) -> str:
    """A row per probe series: the largest square image within the budget and what stopped the search."""
    bands = "bands" in rows[0]
    header = ["model", "variant", "checkpointing", *(["bands"] if bands else [])]
    header += ["largest image", "stopped by", "budget", "extrapolated to 24 GiB"]
    body = [
        [
            f"`{r['model']}`",
            f"`{r['variant']}`",
            "on" if r["checkpointing"] == "True" else "off",
            *([r["bands"]] if bands else []),
            f"{r['maxres']}²",
            r["limited_by"],
            gib(r["budget_bytes"]),
            f"≈ {r['extrapolated_24gib']}²" if r["extrapolated_24gib"] else "",
        ]
        for r in rows
    ]
    return markdown_table(header, body)


def probes_table(rows: list[dict]) -> str:
    """Every probe of a maxres search: a row per image size, a column per series; cell: peak memory, or why
    the probe failed."""
    keys = [k for k in ("variant", "checkpointing", "bands") if k in rows[0]]
    series = list(dict.fromkeys(tuple(r[k] for k in keys) for r in rows))
    cells = defaultdict(dict)
    for r in rows:
        peak = gib(r["peak_bytes"])
        value = peak if r["status"] == "ok" else f"{r['status']}" + (f" ({peak})" if peak else "")
        cells[int(r["size"])][tuple(r[k] for k in keys)] = value
    names = {"variant": "`{}`", "checkpointing": "checkpointing {}", "bands": "{} band(s)"}
    label = {"True": "on", "False": "off"}
    header = ["image"]
    header += [
        ", ".join(names[k].format(label.get(v, v)) for k, v in zip(keys, s, strict=True)) for s in series
    ]
    body = [[f"{size}²", *(cells[size].get(s, "") for s in series)] for size in sorted(cells)]
    return markdown_table(header, body)


def grouped(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    return groups


def seconds(text: str) -> str:
    value = float(text)
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def gib(text: str) -> str:
    return f"{float(text) / 2**30:.2f} GiB" if text else ""


def times(text: str) -> str:
    """A ratio with two significant digits, written out in full from 100 up (110×, not 1.1e+02×)."""
    value = float(text)
    return f"{value:.0f}×" if value >= 100 else f"{value:.2g}×"


def mib(text: str) -> str:
    return f"{float(text) / 2**20:.0f} MiB"


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in body]
    return "\n".join(lines)
