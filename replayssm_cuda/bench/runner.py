"""Runs a plan of cases: once per launch-override set and repeat, baselines under the launcher's rules,
one row per (case, set) with the median, a progress bar, and each row handed on as soon as it is done.

Launch-override sets (`--override`) replace the knob sweeps and A/B scripts: every set's launches run in
the same process, one after the other, so a table compares them without a rebuild or a second process.
A set is `rule` (no override: the launcher's rules) or `NAME=VALUE[,NAME=VALUE...]` with the fields of
replayssm_cuda.launch_overrides (e.g. step_heads_per_cta=8,step_order=0; REPLAYSSM_STEP_HEADS_PER_CTA=8
is read as the same field). A CUDA graph captures the launch chosen at capture time, and every
measurement captures its own graph under its set. With --repeats, the sets alternate in order (forward,
then backward) so that a drift of clocks or temperature does not favour one.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys

from .registry import Case, Measurement
from .results import make_row

RULE = "rule"


class BenchError(RuntimeError):
    """A benchmark cannot run here (no GPU, op not compiled, bad override name); the CLI prints it."""


def parse_override_set(text: str) -> tuple[str, dict]:
    """'rule' -> ('rule', {}); 'step_heads_per_cta=8,step_order=0' -> (label, {field: int})."""
    text = text.strip()
    if text == RULE:
        return RULE, {}
    fields = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if name.startswith("replayssm_"):
            name = name[len("replayssm_"):]
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_]*", name) or not re.fullmatch(r"-?\d+", value.strip()):
            raise ValueError(f"--override: expected 'rule' or NAME=INT[,NAME=INT...] (e.g. step_heads_per_cta=8), "
                             f"got {text!r}")
        if name in fields:
            raise ValueError(f"--override: {name} is given twice in {text!r}")
        fields[name] = int(value)
    return ",".join(f"{k}={v}" for k, v in fields.items()), fields


def override_sets(given: list | None) -> dict:
    """label -> fields, in the order given (just the rule when none is)."""
    sets = {}
    for label, fields in given or [(RULE, {})]:
        if label in sets:
            raise ValueError(f"--override: the set {label!r} is given twice")
        sets[label] = fields
    return sets


def check_override_names(sets: dict) -> None:
    """Every field named in a set must be one that replayssm_cuda.launch_overrides knows."""
    named = sorted({k for fields in sets.values() for k in fields})
    if not named:
        return
    import replayssm_cuda
    get = getattr(replayssm_cuda, "get_launch_overrides", None)
    if get is None or getattr(replayssm_cuda, "launch_overrides", None) is None:
        raise BenchError("--override needs replayssm_cuda.launch_overrides, which this version of the package "
                         "does not have")
    try:
        known = set(get())
    except RuntimeError as exc:
        raise BenchError(f"--override: {exc}") from exc
    unknown = [k for k in named if k not in known]
    if unknown:
        raise BenchError(f"--override: unknown launch override {', '.join(unknown)}; expected one of "
                         f"{', '.join(sorted(known))}")


def launch_context(fields: dict):
    if not fields:
        return contextlib.nullcontext()
    import replayssm_cuda
    return replayssm_cuda.launch_overrides(**fields)


# The launch-override fields (replayssm_cuda.launch_overrides), for when the package cannot list them.
LAUNCH_FIELDS = ("step_heads_per_cta", "step_groups_per_cta", "step_order", "step_fold_split",
                 "step_staggered_heads_per_cta", "verify_heads_per_cta", "gdn_step_parts", "gdn_step_order", "gdn_step_order_cursor",
                 "gdn_step_fold_parts", "gdn_step_tile_stages", "gdn_update_split", "update_stages",
                 "update_ctas", "update_claims", "update_split", "order_pass_pdl", "pdl_warm", "pdl")


def environment_overrides() -> dict:
    """The REPLAYSSM_<FIELD> launch variables set in the environment: the launcher reads them, so they change
    what the `rule` rows measure."""
    import replayssm_cuda
    fields = LAUNCH_FIELDS
    get = getattr(replayssm_cuda, "get_launch_overrides", None)
    if get is not None:
        try:
            fields = tuple(get())
        except RuntimeError:
            pass
    names = {f"REPLAYSSM_{f.upper()}" for f in fields}
    return {k: v for k, v in os.environ.items() if k in names}


# ---- progress ----------------------------------------------------------------------------------------

class Progress:
    """tqdm when it is installed and stderr is a terminal; else a single line rewritten in place on a
    terminal; nothing when stderr is not a terminal (the table rows on stdout are the progress then)."""

    def __init__(self, total: int, enabled: bool | None = None):
        self.total, self.done = total, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="row", file=sys.stderr, leave=False, dynamic_ncols=True)
            except ImportError:
                pass

    def start(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description_str(text[:60])
        else:
            sys.stderr.write(f"\r\033[K[{self.done}/{self.total}] {text[:100]}")
            sys.stderr.flush()

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def write(self, line: str) -> None:
        """Print a line to stdout without breaking the bar."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            if self.enabled:
                sys.stderr.write("\r\033[K")
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# ---- execution ---------------------------------------------------------------------------------------

def case_labels(case: Case, sets: dict, baseline_keys: set) -> list:
    """The override sets a case runs under: all of them, or the rule alone when it is not overridable;
    a case that is another row's baseline also runs under the rule."""
    labels = list(sets) if case.overridable else [RULE]
    if _config_key(case.config) in baseline_keys and RULE not in labels:
        labels.insert(0, RULE)
    return labels


def planned_rows(cases: list, sets: dict) -> list:
    """The configurations the plan will produce rows for (with their launch label), in order."""
    baseline_keys = {_config_key(c.baseline) for c in cases if c.baseline is not None}
    return [dict(c.config, launch=label) for c in cases for label in case_labels(c, sets, baseline_keys)]


def _config_key(config: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in config.items()))


def _describe(config: dict) -> str:
    return " ".join(str(v) for k, v in config.items() if k in ("dims", "batch", "row", "copy", "launch", "size"))


def execute(table: str, cases: list, sets: dict, repeats: int, copy_bw: float | None, on_row=None,
            progress: Progress | None = None, cleanup=None) -> list:
    """Measure every case under its sets, `repeats` times each (sets alternating), and return one row per
    (case, set): the median seconds as µs, the byte model, the baseline's median µs under the rule, the
    extras of the median sample, and "range µs" with several repeats. A case that raises gives an error
    row and the run goes on. on_row(row) is called as each row is done; cleanup() after each measurement
    (e.g. torch.cuda.empty_cache)."""
    baseline_keys = {_config_key(c.baseline) for c in cases if c.baseline is not None}
    measured = {}   # (config key, label) -> median µs
    rows = []
    for case in cases:
        labels = case_labels(case, sets, baseline_keys)
        samples = {label: [] for label in labels}
        errors = {}
        for r in range(repeats):
            for label in labels if r % 2 == 0 else labels[::-1]:
                if label in errors:          # it failed once: not again
                    if progress is not None:
                        progress.advance()
                    continue
                if progress is not None:
                    progress.start(_describe(dict(case.config, launch=label)))
                try:
                    with launch_context(sets.get(label, {})):
                        samples[label].append(case.measure())
                except (RuntimeError, ValueError, TypeError) as exc:
                    errors[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                finally:
                    if cleanup is not None:
                        cleanup()
                    if progress is not None:
                        progress.advance()
        summaries = {label: _summarize(samples[label], repeats) for label in labels if label not in errors}
        for label, (us, _, _, _) in summaries.items():
            measured[(_config_key(case.config), label)] = us
        baseline_us = None
        if case.baseline is not None:
            baseline_us = measured.get((_config_key(case.baseline), RULE))
        for label in labels:
            config = dict(case.config, launch=label)
            if label in errors:
                row = make_row(table, config, None, None, copy_bw, baseline_us, error=errors[label], meta=case.meta)
            else:
                us, nbytes, extra, all_us = summaries[label]
                row = make_row(table, config, us, nbytes, copy_bw, baseline_us, extra, all_us, meta=case.meta)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _summarize(samples: list, repeats: int) -> tuple:
    """(median µs, bytes, extras of the sample nearest the median (+ "range µs", "kernels"), all µs)."""
    us = [m.seconds * 1e6 for m in samples]
    median = statistics.median(us)
    middle = min(samples, key=lambda m: abs(m.seconds * 1e6 - median))
    extra = dict(middle.extra)
    if repeats > 1:
        extra["range µs"] = f"{min(us):.2f}-{max(us):.2f}"
    if middle.kernels:
        extra["kernels"] = dict(middle.kernels)
    return median, middle.nbytes, extra, us


__all__ = ["BenchError", "Case", "Measurement", "Progress", "RULE", "check_override_names", "environment_overrides",
           "execute", "launch_context", "override_sets", "parse_override_set", "planned_rows"]
