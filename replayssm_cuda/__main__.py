"""`python -m replayssm_cuda info`, `python -m replayssm_cuda demo` and `python -m replayssm_cuda bench ...`."""

from __future__ import annotations

import argparse

import torch

from . import __version__, _extension, demo
from ._schemas import ALL_OPS as ALL_SCHEMA_OPS
from .bench import cli as bench_cli

ALL_OPS = list(ALL_SCHEMA_OPS)


def info() -> None:
    print(f"replayssm_cuda {__version__}")
    print(f"install: {_extension.install_summary()}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"GPU: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
              f"{p.total_memory / 2**30:.0f} GiB")
    else:
        print("GPU: none (ops run the PyTorch reference)")
    if _extension.is_compiled():
        b = _extension.build_info()
        print(f"compiled extension: yes (CUDA {b['cuda_version']}, archs {b['archs']})")
    else:
        print(f"compiled extension: no ({_extension.load_error()})")
    compiled = [op for op in ALL_OPS if _extension.has_op(op)]
    print(f"compiled ops ({len(compiled)}/{len(ALL_OPS)}): {', '.join(compiled) or 'none'}")
    print(f"reference-only ops: {', '.join(op for op in ALL_OPS if op not in compiled) or 'none'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replayssm_cuda")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, build, GPU arch and which ops are compiled")
    d = sub.add_parser("demo", help="decode a hybrid Mamba-2 + GDN stack, conventional vs ReplaySSM, under CUDA "
                                    "graphs with requests coming and going; checks that the two agree")
    demo.add_arguments(d)
    bench_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench_cli.run(args)
    if args.command == "info":
        info()
        return 0
    return demo.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
