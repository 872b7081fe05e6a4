"""Writes the per-shape instantiation files of each family's kernels from its variants table.

    python tools/generate_instantiations.py          # (re)write them
    python tools/generate_instantiations.py --check  # exit 1 and list them where they are stale

One file per op and shape (csrc/families/<family>/instantiations/<op>_<a><A>_<b><B>.cu: step_p80_n128.cu
for Mamba-2's (head_dim P, state_dim N), step_k128_v128.cu for GDN's (head_k_dim K, head_v_dim V)), so the
shapes compile in parallel; the shapes are the rows of the family's shape table in
csrc/families/<family>/variants.h (an X-macro: one `X(A, B)` a row, in the order of the launchers'
template arguments). Files of shapes no longer in the table are removed.
tests/test_generated_instantiations.py runs --check.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# family -> (its name in prose, its shape table's macro, the two dims (file-name letter, name in prose),
#            {op: (launch header, namespace, launcher, its arguments before the stream, what the file holds)})
FAMILIES = {
    "mamba2": ("Mamba-2", "REPLAYSSM_MAMBA2_SHAPES", (("p", "head_dim"), ("n", "state_dim")), {
        "step": ("families/mamba2/step_launch.cuh", "replayssm::mamba2", "launch_step_shape", "const Mamba2Params&",
                 "step kernels (the ordered and two-group ones with them)"),
        "verify": ("families/mamba2/verify_launch.cuh", "replayssm::mamba2_spec", "launch_verify_shape",
                   "const Mamba2SpecParams&", "verify kernels"),
        "fold": ("families/mamba2/fold_launch.cuh", "replayssm::mamba2_spec", "launch_fold_shape",
                 "const Mamba2SpecParams&, const LayerTableArgs*",
                 "fold kernels (commit, flush, materialize; one layer or a layer table)"),
    }),
    "gdn": ("Gated DeltaNet", "REPLAYSSM_GDN_SHAPES", (("k", "head_k_dim"), ("v", "head_v_dim")), {
        "step": ("families/gdn/step_launch.cuh", "replayssm::gdn", "launch_step_shape", "const GdnParams&", "step kernels"),
        "verify": ("families/gdn/verify_launch.cuh", "replayssm::gdn", "launch_verify_shape", "const GdnParams&",
                   "verify kernels"),
        "fold": ("families/gdn/fold_launch.cuh", "replayssm::gdn", "launch_fold_shape",
                 "const GdnParams&, const LayerTableArgs*",
                 "fold kernels (commit, flush, materialize; one layer or a layer table)"),
    }),
}


def table_shapes(variants: Path, macro: str) -> list[tuple[int, int]]:
    """The (A, B) rows of `macro` in `variants` (a header defining it as an X-macro)."""
    text = variants.read_text()
    match = re.search(rf"#define {macro}\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    if match is None:
        sys.exit(f"generate_instantiations: {variants} does not define {macro}(X)")
    rows = re.findall(r"X\(\s*(\d+)\s*,\s*(\d+)\s*\)", match.group(1))
    if not rows:
        sys.exit(f"generate_instantiations: {macro} in {variants} has no X(A, B) rows")
    return [(int(p), int(n)) for p, n in rows]


def file_text(family: str, name: str, dims, spec: tuple[str, str, str, str, str], P: int, N: int) -> str:
    header, namespace, launcher, params, what = spec
    comment = (f"{name} {what}, {dims[0][1]} {P}, {dims[1][1]} {N}. One file per shape, so the shapes compile in "
               f"parallel. Written by tools/generate_instantiations.py from the shapes in "
               f"families/{family}/variants.h: do not edit.")
    return ("".join(f"// {line}\n" for line in textwrap.wrap(comment, 105)) +
            f'#include "{header}"\n\n'
            f"namespace {namespace} {{\n"
            f"template cudaError_t {launcher}<{P}, {N}>({params}, cudaStream_t);\n"
            f"}}  // namespace {namespace}\n")


def expected_files() -> dict[Path, str]:
    files = {}
    for family, (name, macro, dims, ops) in FAMILIES.items():
        folder = ROOT / "csrc" / "families" / family
        (a, _), (b, _) = dims
        for P, N in table_shapes(folder / "variants.h", macro):
            for op, spec in ops.items():
                files[folder / "instantiations" / f"{op}_{a}{P}_{b}{N}.cu"] = file_text(family, name, dims, spec, P, N)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale files and exit 1 instead of writing")
    args = parser.parse_args()
    want = expected_files()
    folders = {path.parent for path in want}
    present = {path for folder in folders if folder.is_dir() for path in folder.glob("*.cu")}
    stale = sorted(path for path, text in want.items() if not path.exists() or path.read_text() != text)
    extra = sorted(present - set(want))
    if args.check:
        for path in stale:
            print(f"stale or missing: {path.relative_to(ROOT)}")
        for path in extra:
            print(f"not in the variants table: {path.relative_to(ROOT)}")
        if stale or extra:
            print("run: python tools/generate_instantiations.py")
            return 1
        return 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(want[path])
        print(f"wrote {path.relative_to(ROOT)}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
