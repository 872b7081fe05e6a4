"""Layer dimensions a benchmark runs at: named model dims, their tensor-parallel shards, or explicit values.

A family describes its dims with a DimsTable: the field names (Mamba-2: H, P, N, G), the named models, and
which fields a tensor-parallel split divides (Mamba-2: the heads H and the groups G; each GPU keeps the
full head and state sizes). `--dims` then takes, per entry:

    NAME          a named model, e.g. super120b
    NAME@tpK      that model on one of K tensor-parallel GPUs, e.g. super120b@tp4 (H = 32, G = 2)
    F=v,F=v,...   explicit values of every field, e.g. H=32,P=64,N=128,G=2
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Dims:
    """One resolved set of dims: `label` as the table shows it, `values` field -> int (in field order)."""
    label: str
    values: dict = field(hash=False, compare=True)

    def __getattr__(self, name):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


@dataclass(frozen=True)
class DimsTable:
    fields: tuple
    models: dict                     # name -> {field: value}
    tp_fields: tuple                 # fields a tensor-parallel split divides
    check: object = None             # optional callable(values) -> error text or None

    def parse(self, text: str) -> Dims:
        """Resolve one --dims entry (see the module doc); ValueError naming what was expected otherwise."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"--dims: expected a model name, NAME@tpK or {self._explicit_form()}, got {text!r}")
        text = text.strip()
        if "=" in text:
            values = self._parse_explicit(text)
            label = ",".join(f"{k}={v}" for k, v in values.items())
        else:
            m = re.fullmatch(r"([A-Za-z0-9_.\-]+?)(?:@tp(\d+))?", text, flags=re.IGNORECASE)
            name = m.group(1) if m else text
            if m is None or name not in self.models:
                raise ValueError(f"--dims: unknown dims {text!r}; expected one of {', '.join(self.models)}, "
                                 f"NAME@tpK (e.g. {next(iter(self.models))}@tp2) or {self._explicit_form()}")
            values = dict(self.models[name])
            k = int(m.group(2)) if m.group(2) is not None else 1
            if k < 1:
                raise ValueError(f"--dims: {text}: the tensor-parallel size must be >= 1, got {k}")
            bad = [f"{f}={values[f]}" for f in self.tp_fields if values[f] % k != 0]
            if bad:
                raise ValueError(f"--dims: {text}: tensor parallelism {k} must divide "
                                 f"{' and '.join(f'{f}={values[f]}' for f in self.tp_fields)}; "
                                 f"it does not divide {', '.join(bad)}")
            for f in self.tp_fields:
                values[f] //= k
            label = name if k == 1 else f"{name}@tp{k}"
        if self.check is not None:
            problem = self.check(values)
            if problem:
                raise ValueError(f"--dims: {text}: {problem}")
        return Dims(label, values)

    def _explicit_form(self) -> str:
        return ",".join(f"{f}=..." for f in self.fields)

    def _parse_explicit(self, text: str) -> dict:
        values = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in self.fields or not value.strip().isdigit() or int(value) < 1:
                raise ValueError(f"--dims: {text!r}: expected {self._explicit_form()} with positive integers, "
                                 f"got the part {part!r}")
            if key in values:
                raise ValueError(f"--dims: {text!r}: {key} is given twice")
            values[key] = int(value)
        missing = [f for f in self.fields if f not in values]
        if missing:
            raise ValueError(f"--dims: {text!r}: expected {self._explicit_form()}, missing {', '.join(missing)}")
        return {f: values[f] for f in self.fields}
