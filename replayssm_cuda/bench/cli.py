"""`python -m replayssm_cuda bench ...` (or `python -m replayssm_cuda.bench ...`): the one benchmark entry point.

    bench mamba2 cycle      update vs the replay step over whole cycles, lock-step and staggered
    bench mamba2 spec       conventional T-token snapshots vs verify(T) + commit
    bench mamba2 overhead   host µs per eager call
    bench mamba2 layers     every layer's slot and fold ops: the per-layer loop vs LayerCaches' one launch
    bench gdn cycle         Gated DeltaNet: update (and fla's fused_recurrent) vs the replay step's cycles
    bench gdn spec          Gated DeltaNet: conventional T-token snapshots vs verify(T) + commit
    bench gdn layers        every GDN layer's slot and fold ops: the per-layer loop vs LayerCaches' one launch
    bench kda cycle         KDA (Kimi Delta Attention, the decay per key channel): update vs the replay step
    bench kda spec          KDA: conventional T-token snapshots vs verify(T) + commit
    bench copy              the device copy bandwidth (the ceiling), also at the sizes kernels move
    bench compare           two builds' JSON files, row by row

Each run measures the copy bandwidth first, prints a markdown table as rows finish, and writes its rows into
bench/results/<gpu-model>.md and .json (rows of the same configuration replaced; --no-write to skip).
`--dry-run` lists the rows a command would measure, without a GPU.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from . import compare as compare_mod
from . import gdn, kda, layers, mamba2  # noqa: F401  (register the families and their benchmarks; a new one adds its import here)
from . import results, timing
from .copybw import COPY
from .registry import FAMILIES, table_name
from .runner import (RULE, BenchError, Progress, check_override_names, environment_overrides, execute,
                     override_sets, parse_override_set, planned_rows)

COPY_CHOICES = ("none", "bf16", "fp16", "fp8")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _dims_type(table):
    def parse(text):
        try:
            return table.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--dims: ")) from None
    parse.__name__ = "dims"
    return parse


def _override_type(text):
    try:
        return parse_override_set(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--override: ")) from None


def _common(parser, family, bench):
    """The options every benchmark shares (those of bench.options, then the method's and the output's)."""
    if "dims" in bench.options:
        models = ", ".join(family.dims.models)
        parser.add_argument("--dims", nargs="+", type=_dims_type(family.dims), default=None, metavar="DIMS",
                            help=f"named dims ({models}), NAME@tpK (the shard of one of K tensor-parallel GPUs, e.g. "
                                 f"super120b@tp4) or {family.dims._explicit_form()}; default: "
                                 f"{' '.join(bench.default_dims)}")
    if "batches" in bench.options:
        parser.add_argument("--batches", nargs="+", type=_positive_int, default=None, metavar="B",
                            help=f"batch rows (default {' '.join(map(str, bench.default_batches))})")
    if "copies" in bench.options:
        parser.add_argument("--copies", nargs="+", choices=COPY_CHOICES, default=None, metavar="COPY",
                            help=f"read copies of the replay rows: {', '.join(COPY_CHOICES)} "
                                 f"(default {' '.join(bench.default_copies)})")
    if "buffer_len" in bench.options:
        parser.add_argument("--buffer-len", type=_positive_int, default=16, metavar="L",
                            help="replay buffer length L (default 16)")
    if bench.name != "copy":
        parser.add_argument("--override", action="append", type=_override_type, default=None, metavar="SET",
                            help="a launch-override set: 'rule' (the launcher's rules) or NAME=INT[,NAME=INT...] with "
                                 "the fields of replayssm_cuda.launch_overrides (e.g. step_heads_per_cta=8,"
                                 "step_order=0). Repeat it for one row per set, measured in the same process; the "
                                 "baseline always runs under the rule")
    parser.add_argument("--repeats", type=_positive_int, default=1, metavar="N",
                        help="measure each row this many times (a fresh pool each, override sets alternating); "
                             "the median is reported with the range (default 1)")
    parser.add_argument("--hold-us", type=_non_negative_float, default=timing.HOLD_US, metavar="US",
                        help=f"µs of GPU hold queued before each timed region, so that the host's launch is not "
                             f"timed (default {timing.HOLD_US:g}; 0: no hold)")
    parser.add_argument("--replays", type=_positive_int, default=timing.REPLAYS, metavar="N",
                        help=f"timed graph replays per row after {timing.WARMUP_REPLAYS} warm-up ones "
                             f"(default {timing.REPLAYS})")
    parser.add_argument("--kernel-times", action="store_true",
                        help="also the GPU time of each kernel of a row's graph (torch.profiler), as a second table; "
                             "where a launch starts early by PDL (batch 1 to a few, docs/TUNING.md) a kernel's span "
                             "includes its wait for the kernel ahead: add --override pdl=0 for spans of its own")
    parser.add_argument("--json", metavar="PATH", help="also write this run's rows as JSON (what `bench compare` reads)")
    parser.add_argument("--plot", metavar="PATH.png",
                        help="PNG of time and %% of copy bandwidth against batch, one line per configuration "
                             "(needs matplotlib)")
    parser.add_argument("--no-write", action="store_true",
                        help="do not write the results file bench/results/<gpu-model>.md / .json")
    parser.add_argument("--results-dir", metavar="DIR", default=None,
                        help=f"folder of the results files (default {results.default_results_dir()})")
    parser.add_argument("--commit", metavar="TEXT", default=None,
                        help="the commit to record in the results header when this tree is not a git checkout "
                             "(e.g. a copy of it on another machine); default: git rev-parse HEAD (+dirty)")
    parser.add_argument("--dry-run", action="store_true", help="list the rows it would measure and stop (no GPU)")


def _fill(parser):
    targets = parser.add_subparsers(dest="bench_target", required=True, metavar="{" + ",".join(
        [*FAMILIES, "copy", "compare"]) + "}")
    for family in FAMILIES.values():
        fp = targets.add_parser(family.name, help=f"{family.help}: {', '.join(family.benches)}")
        whats = fp.add_subparsers(dest="bench_what", required=True, metavar="{" + ",".join(family.benches) + "}")
        for bench in family.benches.values():
            bp = whats.add_parser(bench.name, help=bench.help, description=bench.description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
            _common(bp, family, bench)
            bench.add_arguments(bp)
            bp.set_defaults(bench_run=(family.name, bench.name))
    cp = targets.add_parser("copy", help=COPY.help, description=COPY.description,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(cp, None, COPY)
    COPY.add_arguments(cp)
    cp.set_defaults(bench_run=(None, "copy"))
    cmp = targets.add_parser("compare", help="two builds' benchmark JSON files, row by row",
                             description=compare_mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("--base", nargs="+", required=True, metavar="JSON", help="the base side's files")
    cmp.add_argument("--new", nargs="+", required=True, metavar="JSON", help="the new side's files")
    cmp.set_defaults(bench_run=("compare", None))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `bench` to the subcommands of `python -m replayssm_cuda`."""
    parser = subparsers.add_parser("bench", help="GPU benchmarks: tables, results file per GPU model, plots",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _fill(parser)
    return parser


def build_parser(prog: str = "python -m replayssm_cuda bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _fill(parser)
    return parser


# ---- running ----------------------------------------------------------------------------------------

def resolve(args) -> tuple:
    """(family or None, bench, table name, dims list) with the bench's defaults filled into args; ValueError
    naming the option on bad input."""
    family_name, bench_name = args.bench_run
    family = FAMILIES.get(family_name)
    bench = COPY if family is None else family.benches[bench_name]
    dims = []
    if "dims" in bench.options:
        dims = args.dims or [family.dims.parse(d) for d in bench.default_dims]
        labels = [d.label for d in dims]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"--dims: {', '.join(dup)} given twice")
    if "batches" in bench.options:
        args.batches = list(dict.fromkeys(args.batches or bench.default_batches))
    if "copies" in bench.options:
        args.copies = list(dict.fromkeys(args.copies or bench.default_copies))
    if bench.check is not None:
        bench.check(args)
    return family, bench, table_name(family, bench), dims


def require_gpu(table: str, needs_ops) -> None:
    """BenchError unless a CUDA GPU is visible and this build compiled the ops the benchmark calls."""
    import torch

    from .. import _extension
    if not torch.cuda.is_available():
        raise BenchError(f"bench {table} needs a CUDA GPU; torch {torch.__version__} sees none "
                         f"(torch.cuda.is_available() is False). --dry-run lists the rows without one.")
    if needs_ops and not _extension.is_compiled():
        raise BenchError(f"bench {table} needs the compiled extension: {_extension.load_error()}")
    missing = [op for op in needs_ops if not _extension.has_op(op)]
    if missing:
        raise BenchError(f"bench {table} needs compiled {', '.join(needs_ops)}; this build lacks "
                         f"{', '.join(missing)} (compiled: {', '.join(_extension.compiled_ops()) or 'none'})")


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n")[0].replace("\n", " ")


def run(args) -> int:
    if args.bench_run[0] == "compare":
        try:
            print(compare_mod.compare(args.base, args.new), end="")
        except (OSError, ValueError) as exc:
            print(f"bench compare: error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        family, bench, table, dims = resolve(args)
        sets = override_sets(getattr(args, "override", None))
        timing.configure(hold_us=args.hold_us, replays=args.replays, kernel_times=args.kernel_times)
        cases, notes = bench.plan(args, dims)
    except ValueError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    if args.plot and not args.dry_run:
        from .plot import MISSING
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"bench: error: {MISSING}", file=sys.stderr)
            return 2
    planned = planned_rows(cases, sets)
    if dims:
        notes.insert(0, "dims: " + "; ".join(f"{d.label}: {d.text()}" for d in dims))
    columns, constant = results.split_constant(planned)
    extras = []
    for case in cases:
        extras += [e for e in case.extras if e not in extras]
    if args.repeats > 1:
        extras.append("range µs")
    if args.dry_run:
        print(f"# bench {table}: {len(planned)} rows" + (f"; all rows: {results.constant_text(constant)}" if constant else ""))
        for note in notes:
            print(f"# {note}")
        print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
        for config in planned:
            print("| " + " | ".join(str(config.get(c, "-")) for c in columns) + " |")
        return 0
    try:
        require_gpu(table, bench.needs_ops)
        check_override_names(sets)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    return _measure(args, bench, table, cases, notes, sets, columns, constant, extras, len(planned))


def _measure(args, bench, table, cases, notes, sets, columns, constant, extras, total) -> int:
    import torch

    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    copy_bw = timing.measure_copy_bandwidth()
    settings = {"hold µs": f"{timing.HOLD_US:g}", "replays": timing.REPLAYS}
    env = environment_overrides()
    if env:
        settings["environment"] = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    argv = list(getattr(args, "bench_argv", None) or sys.argv[1:])
    if argv[:1] == ["bench"]:
        argv = argv[1:]
    run_info = results.run_info(gpu, copy_bw, settings, "python -m replayssm_cuda bench " + shlex.join(argv),
                                commit=args.commit)
    description = {table: _first_paragraph(bench.description)}
    print(f"# bench {table} on {gpu}: {results.run_header(run_info)}")
    print(f"# {description[table]}")
    if env and RULE in sets:
        print(f"# note: the environment sets {settings['environment']}: the launcher reads it, so the 'rule' rows "
              f"are not the launcher's own rules")
    if constant:
        print(f"# All rows: {results.constant_text(constant)}.")
    for note in notes:
        print(f"# {note}")
    print(results.table_header(columns, extras), flush=True)

    store = None
    if not args.no_write:
        directory = args.results_dir or results.default_results_dir()
        store = results.ResultsFile(directory, results.gpu_model(gpu))
    progress = Progress(total)

    def on_row(row):
        progress.write(results.table_line(row, columns, extras))
        if store is not None and not row.get("error"):
            store.merge(run_info, [row], description)
            store.write()

    try:
        rows = execute(table, cases, sets, args.repeats, copy_bw, on_row=on_row, progress=progress,
                       cleanup=torch.cuda.empty_cache)
    finally:
        progress.close()
    kernels = results.kernel_table(rows)
    if kernels:
        print("\nGPU time per kernel (torch.profiler), µs per step / round:\n")
        print(kernels, end="")
    failed = [r for r in rows if r.get("error")]
    if store is not None:
        print(f"# results: {store.md_path} and {store.json_path.name} ({len(rows) - len(failed)} rows written)")
    if args.json:
        results.write_json(args.json, run_info, rows, description)
        print(f"# json: {args.json}")
    if args.plot:
        from .plot import plot
        try:
            print(f"# plot: {plot(rows, args.plot, f'{table} on {gpu}')}")
        except (RuntimeError, ValueError) as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
    if failed:
        print(f"bench: {len(failed)} of {len(rows)} rows failed (error in the table)", file=sys.stderr)
        return 1
    return 0


def main(argv=None, prog: str = "python -m replayssm_cuda bench") -> int:
    args = build_parser(prog).parse_args(argv)
    args.bench_argv = argv
    return run(args)
