"""Rows, markdown tables and the results file per GPU model.

A row is one measured configuration: the table it belongs to (e.g. "mamba2 cycle"), its configuration
(ordered key -> value: dims, batch, row kind, copy, ...) and its numbers (us, the byte model's bytes, the
baseline's us, extra columns). The results file of a GPU model, bench/results/<model>.json, holds every
row with the run that measured it (GPU, date, commit, torch and CUDA versions, copy bandwidth, command);
<model>.md is rendered from it. Writing a run replaces the rows whose table and configuration it
measured again and keeps the others, so the file is the current state of each configuration, not a
history of runs; a run none of whose rows are left is dropped.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

SCHEMA = 1

# Metric columns of every table, in order: (header, row key, format).
METRICS = [("µs", "us", "{:.2f}"), ("GB/s", "gbps", "{:.0f}"), ("% copy", "copy_pct", "{:.1f}"),
           ("baseline µs", "baseline_us", "{:.2f}"), ("speed-up", "speedup", "{:.2f}x")]


def make_row(table: str, config: dict, us: float | None, nbytes: float | None, copy_bw: float | None,
             baseline_us: float | None, extra: dict | None = None, samples_us: list | None = None,
             error: str | None = None, run: str | None = None, meta: dict | None = None) -> dict:
    """A row dict with the derived numbers: GB/s and % of the copy bandwidth from the byte model (None
    without one), and speed-up = baseline us / us."""
    gbps = copy_pct = speedup = None
    if us is not None and us > 0:
        if nbytes is not None:
            gbps = nbytes / (us * 1e-6) / 1e9
            if copy_bw:
                copy_pct = 100 * nbytes / (us * 1e-6) / copy_bw
        if baseline_us is not None:
            speedup = baseline_us / us
    return {"table": table, "config": dict(config), "us": us, "bytes": nbytes, "gbps": gbps, "copy_pct": copy_pct,
            "baseline_us": baseline_us, "speedup": speedup, "extra": dict(extra or {}),
            "samples_us": list(samples_us or ([] if us is None else [us])), "error": error, "run": run,
            "meta": dict(meta or {})}


def row_key(row: dict) -> tuple:
    """What makes two rows the same configuration: the table and every configuration item."""
    return (row["table"], tuple(sorted((k, str(v)) for k, v in row["config"].items())))


# ---- markdown ----------------------------------------------------------------------------------------

def _cell(value, fmt="{}") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return fmt.format(value)
    return str(value).replace("|", "/")


def _extra_cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e4 else f"{value:.2f}"
    return _cell(value)


def split_constant(configs: list[dict]) -> tuple[list[str], dict]:
    """The configuration keys that vary between the rows (table columns, in first-seen order) and those
    that do not (key -> value, for the table's header line)."""
    keys = []
    for c in configs:
        keys += [k for k in c if k not in keys]
    columns, constant = [], {}
    for k in keys:
        values = {str(c.get(k, "-")) for c in configs}
        if len(values) == 1 and len(configs) > 1:
            constant[k] = configs[0].get(k, "-")
        else:
            columns.append(k)
    return columns, constant


def extra_columns(rows: list[dict]) -> list[str]:
    names = []
    for r in rows:
        names += [k for k in r.get("extra", {}) if k not in names and k != "kernels"]
    return names


def table_header(columns: list[str], extras: list[str]) -> str:
    cells = columns + [h for h, _, _ in METRICS] + extras
    return "| " + " | ".join(cells) + " |\n|" + "---|" * len(cells)


def table_line(row: dict, columns: list[str], extras: list[str]) -> str:
    cells = [_cell(row["config"].get(k, "-")) for k in columns]
    if row.get("error"):
        cells += [f"error: {_cell(row['error'])}"] + ["-"] * (len(METRICS) - 1)
    else:
        cells += [_cell(row.get(key), fmt) for _, key, fmt in METRICS]
    cells += [_extra_cell(row.get("extra", {}).get(k)) for k in extras]
    return "| " + " | ".join(cells) + " |"


def constant_text(constant: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in constant.items())


def markdown_table(rows: list[dict]) -> str:
    """One table of rows: the configuration items that vary as columns, then the metrics and extras; the
    items every row shares on a line above it."""
    columns, constant = split_constant([r["config"] for r in rows])
    extras = extra_columns(rows)
    lines = []
    if constant:
        lines.append(f"All rows: {constant_text(constant)}.")
        lines.append("")
    lines.append(table_header(columns, extras))
    lines += [table_line(r, columns, extras) for r in rows]
    return "\n".join(lines) + "\n"


def kernel_table(rows: list[dict]) -> str:
    """GPU time per kernel of the rows measured with --kernel-times (empty when none was)."""
    measured = [r for r in rows if r.get("extra", {}).get("kernels")]
    if not measured:
        return ""
    columns, _ = split_constant([r["config"] for r in measured])
    lines = ["| " + " | ".join(columns + ["kernel", "µs"]) + " |", "|" + "---|" * (len(columns) + 2)]
    for r in measured:
        head = [_cell(r["config"].get(k, "-")) for k in columns]
        for name, seconds in r["extra"]["kernels"].items():
            lines.append("| " + " | ".join(head + [name, f"{seconds * 1e6:.2f}"]) + " |")
    return "\n".join(lines) + "\n"


# ---- the run -----------------------------------------------------------------------------------------

def gpu_model(device_name: str) -> str:
    """File name of a GPU model: 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H100 PCIe' -> 'h100-pcie',
    'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB' -> 'a100-sxm4'. Memory sizes and types are dropped
    (they do not make another model); form factors are kept (they change the clocks)."""
    tokens = re.split(r"[^a-z0-9]+", device_name.lower())
    keep = [t for t in tokens if t and t not in ("nvidia", "tesla", "geforce")
            and not re.fullmatch(r"\d+gb|hbm\d*e?|gddr\d*x?", t)]
    return "-".join(keep) or "unknown-gpu"


def repo_root() -> pathlib.Path | None:
    """The source checkout this package runs from (it holds pyproject.toml), or None when installed."""
    root = pathlib.Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "replayssm_cuda").is_dir() else None


def default_results_dir() -> pathlib.Path:
    root = repo_root()
    return (root if root is not None else pathlib.Path.cwd()) / "bench" / "results"


def git_commit(root: pathlib.Path | None = None) -> str | None:
    """Short commit hash of the checkout, with '+dirty' when tracked files differ from it; None outside git."""
    root = repo_root() if root is None else root
    if root is None:
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_info(gpu: str, copy_bw: float | None, settings: dict | None = None, command: str | None = None,
             now: datetime.datetime | None = None, commit: str | None = None) -> dict:
    """What the header of a run says: GPU, date (UTC), commit (`commit`, else the checkout's), torch / CUDA
    versions, copy bandwidth, the method's settings and the command."""
    import torch

    from .. import _extension
    now = now or datetime.datetime.now(datetime.timezone.utc)
    build = _extension.build_info() or {}
    return {"id": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "gpu": gpu, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit or git_commit(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "archs": build.get("archs"), "copy_bw": copy_bw, "settings": dict(settings or {}),
            "command": command or "python -m replayssm_cuda " + " ".join(sys.argv[1:])}


def run_header(run: dict) -> str:
    parts = [run.get("date"), f"commit {run.get('commit') or 'unknown'}", f"torch {run.get('torch')}",
             f"CUDA {run.get('cuda') or 'none'}"]
    if run.get("copy_bw"):
        parts.append(f"device-to-device copy {run['copy_bw'] / 1e12:.3f} TB/s (read + write)")
    parts += [f"{k} {v}" for k, v in run.get("settings", {}).items()]
    return ", ".join(str(p) for p in parts)


# ---- the results file --------------------------------------------------------------------------------

TITLE_NOTE = ("Written by `python -m replayssm_cuda bench`; rerunning a configuration replaces its rows. "
              "µs: GPU time per step, round or call as each table says (CUDA-graph replay, cold L2, median of "
              "the replays, host launch not timed). GB/s: the table's byte model over that time; % copy: of "
              "the device-to-device copy bandwidth measured in the same run; speed-up: the baseline's µs over "
              "the row's, both from the same run.")


class ResultsFile:
    """bench/results/<model>.json (all rows with their runs) and its rendering <model>.md."""

    def __init__(self, directory, model: str):
        self.dir = pathlib.Path(directory)
        self.json_path = self.dir / f"{model}.json"
        self.md_path = self.dir / f"{model}.md"
        self.data = {"schema": SCHEMA, "gpu": None, "runs": {}, "tables": {}, "rows": []}
        if self.json_path.is_file():
            loaded = json.loads(self.json_path.read_text())
            if loaded.get("schema") != SCHEMA:
                raise ValueError(f"{self.json_path}: results schema {loaded.get('schema')!r}, this benchmark "
                                 f"writes schema {SCHEMA}; move the old file away")
            self.data = loaded

    def merge(self, run: dict, rows: list[dict], descriptions: dict | None = None) -> None:
        """Put a run's rows in: each replaces the stored row of the same table and configuration (in its
        place), or is appended; error rows are not stored; runs with no row left are dropped."""
        self.data["gpu"] = run.get("gpu") or self.data.get("gpu")
        self.data["runs"][run["id"]] = run
        self.data["tables"].update(descriptions or {})
        index = {row_key(r): i for i, r in enumerate(self.data["rows"])}
        for row in rows:
            if row.get("error"):
                continue
            row = dict(row, run=run["id"])
            i = index.get(row_key(row))
            if i is None:
                index[row_key(row)] = len(self.data["rows"])
                self.data["rows"].append(row)
            else:
                self.data["rows"][i] = row
        used = {r["run"] for r in self.data["rows"]}
        self.data["runs"] = {k: v for k, v in self.data["runs"].items() if k in used}

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, self.json_path)
        self.md_path.write_text(render_markdown(self.data))


def dims_legend(rows: list[dict]) -> str:
    """'nano4b: H=96 P=80 N=128 G=8; ...' for the dims labels of the rows (from their meta)."""
    seen = {}
    for r in rows:
        label, text = r["config"].get("dims"), r.get("meta", {}).get("dims")
        if label is not None and text and label not in seen:
            seen[label] = text
    return "; ".join(f"{k}: {v}" for k, v in seen.items())


def render_markdown(data: dict) -> str:
    """The results file as markdown: per table, per run (oldest first), the run's header and its rows."""
    out = [f"# Benchmarks: {data.get('gpu') or 'unknown GPU'}", "", TITLE_NOTE, ""]
    legend = dims_legend(data["rows"])
    if legend:
        out += [f"Dims: {legend}.", ""]
    tables = []
    for r in data["rows"]:
        if r["table"] not in tables:
            tables.append(r["table"])
    for table in tables:
        out += [f"## {table}", ""]
        if data.get("tables", {}).get(table):
            out += [data["tables"][table], ""]
        rows = [r for r in data["rows"] if r["table"] == table]
        for run_id in sorted({r["run"] for r in rows}):
            run = data["runs"].get(run_id, {})
            out += [f"Run {run_header(run)}.", "", f"`{run.get('command', '')}`", ""]
            run_rows = [r for r in rows if r["run"] == run_id]
            out.append(markdown_table(run_rows))
            kernels = kernel_table(run_rows)
            if kernels:
                out += ["GPU time per kernel (torch.profiler), per step / round:", "", kernels]
    return "\n".join(out).rstrip() + "\n"


def write_json(path, run: dict, rows: list[dict], descriptions: dict | None = None) -> None:
    """This run's rows alone, in the results file's format (what `bench compare` reads)."""
    rows = [dict(r, run=run["id"]) for r in rows]
    data = {"schema": SCHEMA, "gpu": run.get("gpu"), "runs": {run["id"]: run}, "tables": dict(descriptions or {}),
            "rows": rows}
    path = pathlib.Path(path)
    if path.parent != pathlib.Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
