"""How a family plugs into the benchmark: its dims, and per benchmark ("cycle", "spec", ...) the options it
adds, the cases it plans and the table description. The timing method (timing.py), the launch-override
sets, repeats, the baseline and speed-up, the progress bar, the tables and the results file are the
runner's and the command line's, shared by every family.

A family module builds a Family and calls register() at import; bench/__init__.py imports the family
modules. A case is one configuration to measure: its row configuration (ordered: dims, batch, row kind,
...), a function that measures it once and returns a Measurement (seconds per step / round / call, the
byte model's bytes for that unit or None, extra columns), and the configuration of its baseline row in
the same table (None for a row without one).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable

from .dims import Dims, DimsTable


@dataclass
class Measurement:
    seconds: float
    nbytes: float | None = None
    extra: dict = field(default_factory=dict)
    kernels: dict | None = None      # seconds per unit per kernel (--kernel-times), "(replay)" included


@dataclass
class Case:
    config: dict
    measure: Callable[[], Measurement]
    baseline: dict | None = None
    overridable: bool = True         # run once per --override set (False: once, under the launcher's rules)
    extras: tuple = ()               # names of the extra columns its measurement fills
    meta: dict = field(default_factory=dict)   # stored with the row, not part of its configuration
                                               # ("dims": "H=32 P=64 N=128 G=2" for the dims legend)


@dataclass
class Bench:
    name: str
    help: str
    description: str                 # the table's method, unit and byte model, for --help and the results file
    plan: Callable[[argparse.Namespace, list], list]    # (args, resolved dims) -> [Case]
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    options: tuple = ("dims", "batches", "copies", "buffer_len")   # which shared options it takes
    default_dims: tuple = ()
    default_batches: tuple = (1, 64, 256, 512)
    default_copies: tuple = ("none", "bf16", "fp8")
    needs_ops: tuple = ()            # compiled ops the cases call (checked before anything runs)
    check: Callable | None = None    # check(args): cross-option checks, ValueError naming the option


@dataclass
class Family:
    name: str
    help: str
    dims: DimsTable | None
    benches: dict = field(default_factory=dict)

    def add(self, bench: Bench) -> Bench:
        self.benches[bench.name] = bench
        return bench


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.name in FAMILIES:
        raise ValueError(f"benchmark family {family.name!r} is registered twice")
    FAMILIES[family.name] = family
    return family


def table_name(family: Family | None, bench: Bench) -> str:
    return bench.name if family is None else f"{family.name} {bench.name}"


__all__ = ["Bench", "Case", "Dims", "DimsTable", "FAMILIES", "Family", "Measurement", "register", "table_name"]
