"""Build of replayssm-cuda: the Python package plus, when a CUDA toolchain is there, replayssm_cuda._C.

Install with `pip install --no-build-isolation .` (the build needs the torch you run with); a wheel with
`pip wheel --no-build-isolation .`.

The extension is built when torch imports, torch.version.cuda is set and a CUDA toolkit is found:
CUDA_HOME, else CUDA_PATH, else the toolkit of the nvcc on PATH (its real location, through symlinks
and wrapper scripts), else /usr/local/cuda; the toolkit must have bin/nvcc and cuda_runtime_api.h.
Otherwise the pure-Python package is installed. Either way one line on stderr says what was built and
why, and replayssm_cuda/_build.py keeps it for `python -m replayssm_cuda info` (pip shows a build's
output only with -v). The version's local tag tells the builds apart: 0.1.0+cu130.torch2.13 (CUDA 13.0,
torch 2.13) or 0.1.0+cpu (pure Python). Knobs:
    REPLAYSSM_CUDA_ARCHS   archs to compile, ';' or ',' separated (default "90a;100a")
    REPLAYSSM_CTA_TIMELINE 1: a diagnostic build whose update and step kernels record a time line per CTA
                           (csrc/diag/, tools/cta_timeline.py); never for a product
    MAX_JOBS               parallel compile jobs (torch's ninja build)
The kernels use the CUTLASS/CuTe headers of the `nvidia-cutlass` Python package (pip install --no-deps
nvidia-cutlass==4.2.0.0, the version whose machine code was checked); building the extension without it
stops with that instruction.
"""

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent.resolve()
PREFIX = "replayssm-cuda:"
DEFAULT_ARCHS = "90a;100a"
BUILD_RECORD = ROOT / "replayssm_cuda" / "_build.py"


def base_version() -> str:
    text = (ROOT / "replayssm_cuda" / "__init__.py").read_text()
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE).group(1)


def cuda_archs() -> list[str]:
    raw = os.environ.get("REPLAYSSM_CUDA_ARCHS", DEFAULT_ARCHS)
    archs = [a for a in re.split(r"[;,\s]+", raw) if a]
    bad = [a for a in archs if not re.fullmatch(r"\d+[af]?", a)]
    if not archs or bad:
        sys.exit(f"{PREFIX} REPLAYSSM_CUDA_ARCHS must list archs like '90a;100a', got {raw!r}")
    return archs


CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"


def cutlass_include() -> str:
    """The CUTLASS/CuTe include folder of the nvidia-cutlass package, located, not imported (the headers
    are all the build needs from it); stops the build with the install command when it is missing."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{PREFIX} the CUDA kernels need the CUTLASS/CuTe headers: pip install --no-deps "
                 f"{CUTLASS_REQUIREMENT} (no cutlass_library module in {sys.executable}), or build the "
                 f"pure-Python package with a CPU-only torch")
    include = Path(spec.submodule_search_locations[0]) / "source" / "include"
    if not (include / "cute").is_dir() or not (include / "cutlass").is_dir():
        sys.exit(f"{PREFIX} the CUDA kernels need the CUTLASS/CuTe headers: expected cute/ and cutlass/ under "
                 f"{include} (pip install --no-deps {CUTLASS_REQUIREMENT})")
    return str(include)


def cta_timeline_build() -> bool:
    return os.environ.get("REPLAYSSM_CTA_TIMELINE", "0") not in ("", "0")


SHAPE_SUBSET_HEADER = ROOT / "build" / "shape_subset" / "replayssm_shape_subset.h"


@functools.cache
def instantiation_tables():
    """tools/generate_instantiations.py, the one reader of the families' shape tables: its FAMILIES (each
    family's table macro and the dims its instantiation files are named by) and table_shapes. The
    families a build may narrow with REPLAYSSM_SHAPES are its keys; KDA runs GDN's kernels, so "gdn"
    narrows both."""
    spec = importlib.util.spec_from_file_location("replayssm_generate_instantiations",
                                                  ROOT / "tools" / "generate_instantiations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_shapes(family: str) -> list[tuple[int, int]]:
    """The rows of a family's shape table (its variants.h X-macro), in table order."""
    tables = instantiation_tables()
    return tables.table_shapes(ROOT / "csrc" / "families" / family / "variants.h", tables.FAMILIES[family][1])


def shape_subset() -> dict[str, list[tuple[int, int]]] | None:
    """REPLAYSSM_SHAPES ("mamba2=64x128,80x128;gdn=128x128"): the shapes to compile of each family named, in
    table order; a family not named keeps every shape. None when the variable is unset or empty. Stops the
    build naming the variable for a family or shape that is not in the tables."""
    raw = os.environ.get("REPLAYSSM_SHAPES", "").strip()
    if not raw:
        return None
    subset: dict[str, list[tuple[int, int]]] = {}
    families = instantiation_tables().FAMILIES
    for part in (p for p in re.split(r"[;\s]+", raw) if p):
        family, _, shapes = part.partition("=")
        if family not in families:
            sys.exit(f"{PREFIX} REPLAYSSM_SHAPES: unknown family {family!r} in {raw!r}; families: "
                     f"{', '.join(families)} (KDA runs gdn's kernels), e.g. 'mamba2=64x128,80x128;gdn=128x128'")
        table = table_shapes(family)
        wanted = set()
        for shape in (x for x in shapes.split(",") if x):
            match = re.fullmatch(r"(\d+)x(\d+)", shape.strip())
            if match is None or (int(match[1]), int(match[2])) not in table:
                sys.exit(f"{PREFIX} REPLAYSSM_SHAPES: {family} has no shape {shape!r}; its shapes: "
                         f"{', '.join(f'{a}x{b}' for a, b in table)}")
            wanted.add((int(match[1]), int(match[2])))
        if not wanted:
            sys.exit(f"{PREFIX} REPLAYSSM_SHAPES: {family!r} names no shape in {raw!r}, e.g. '{family}="
                     f"{table[-1][0]}x{table[-1][1]}'")
        subset[family] = [s for s in table if s in wanted]
    return subset


def shape_subset_header(subset: dict[str, list[tuple[int, int]]]) -> str:
    """replayssm_shape_subset.h: the compiled shapes of each narrowed family (variants.h reads it)."""
    lines = ["// Written by setup.py from REPLAYSSM_SHAPES (not tracked): the shapes this build compiles.",
             "#pragma once"]
    for family, shapes in subset.items():
        rows = " ".join(f"X({a}, {b})" for a, b in shapes)
        macro = instantiation_tables().FAMILIES[family][1]  # REPLAYSSM_GDN_SHAPES: its subset, ..._COMPILED_SHAPES
        lines.append(f"#define {macro.removesuffix('_SHAPES')}_COMPILED_SHAPES(X) {rows}")
    return "\n".join(lines) + "\n"


def extension_sources(diagnostic: bool, subset: dict[str, list[tuple[int, int]]] | None = None) -> list[str]:
    """Every kernel source (.cu) and host source (.cpp) under csrc/; csrc/diag/ only in a diagnostic build;
    of a family the subset narrows, the instantiation files of its shapes only."""
    csrc = ROOT / "csrc"
    found = [p for p in csrc.rglob("*") if p.suffix in (".cu", ".cpp")]
    if not diagnostic:
        found = [p for p in found if (csrc / "diag") not in p.parents]
    for family, shapes in (subset or {}).items():
        (a, _), (b, _) = instantiation_tables().FAMILIES[family][2]
        folder = csrc / "families" / family / "instantiations"
        keep = {f"_{a}{x}_{b}{y}.cu" for x, y in shapes}
        found = [p for p in found if p.parent != folder or any(p.name.endswith(k) for k in keep)]
    return sorted(str(p.relative_to(ROOT)) for p in found)


# --------------------------------------------------------------------------------------------------
# The CUDA toolkit, found the way users have it
# --------------------------------------------------------------------------------------------------

def toolkit_problem(root: Path) -> str | None:
    """Why `root` is not a usable CUDA toolkit, or None."""
    if not (root / "bin" / "nvcc").is_file():
        return "has no bin/nvcc"
    headers = [root / "include" / "cuda_runtime_api.h", *root.glob("targets/*/include/cuda_runtime_api.h")]
    if not any(h.is_file() for h in headers):
        return "has no include/cuda_runtime_api.h"
    return None


def nvcc_toolkit(nvcc: str) -> Path | None:
    """The toolkit of an nvcc on PATH: two levels above its real path; for a wrapper script (e.g.
    /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc), the toolkit of the nvcc the script
    names, else the TOP that nvcc reports in a dry run (which needs the host compiler on PATH)."""
    real = Path(nvcc).resolve()
    candidates = [real.parent.parent]
    try:
        if real.stat().st_size < 65536:
            text = real.read_bytes().decode("utf-8", errors="ignore")
            candidates += [Path(m).parent for m in re.findall(r"(/[^\s'\"]+)/nvcc\b", text)
                           if Path(m).is_dir()]
    except OSError:
        pass
    for root in candidates:
        if toolkit_problem(root) is None:
            return root.resolve()
    try:
        dry = subprocess.run([nvcc, "-v", "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    top = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    if top is None:
        return None
    root = Path(top.group(1).strip()).resolve()
    return root if toolkit_problem(root) is None else None


def find_cuda() -> tuple[Path | None, str]:
    """(toolkit, where it came from), or (None, why none was found)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value:
            problem = toolkit_problem(Path(value))
            if problem:
                return None, f"{var}={value} {problem}"
            return Path(value).resolve(), var
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = nvcc_toolkit(nvcc)
        if root is None:
            return None, (f"the nvcc on PATH ({nvcc}) belongs to no toolkit with bin/nvcc and "
                          f"include/cuda_runtime_api.h; set CUDA_HOME")
        return root, f"nvcc on PATH ({nvcc})"
    default = Path("/usr/local/cuda")
    if default.exists() and toolkit_problem(default) is None:
        return default.resolve(), "/usr/local/cuda"
    return None, "no CUDA toolkit found (no CUDA_HOME, CUDA_PATH, nvcc on PATH or /usr/local/cuda)"


def nvcc_version(root: Path) -> str:
    out = subprocess.run([str(root / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


# --------------------------------------------------------------------------------------------------
# What to build
# --------------------------------------------------------------------------------------------------

def plan() -> dict:
    """{"extension": bool, "reason" (when False), "toolkit", "found_by", "torch"}."""
    try:
        import torch
    except Exception as exc:  # torch missing or broken
        return {"extension": False, "reason": f"torch is not importable ({type(exc).__name__}: {exc})"}
    if torch.version.cuda is None:
        return {"extension": False, "reason": f"torch {torch.__version__} is a CPU-only build"}
    root, found_by = find_cuda()
    if root is None:
        return {"extension": False, "reason": found_by}
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported; a PATH wrapper would mislead its guess.
    os.environ["CUDA_HOME"] = str(root)
    return {"extension": True, "toolkit": root, "found_by": found_by, "torch": torch}


def torch_cuda_tag(torch) -> str:
    """cu130.torch2.13: the CUDA and torch versions the extension was built against (a PEP 440 local tag)."""
    cuda = "".join(torch.version.cuda.split(".")[:2])
    torch_version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    return f"cu{cuda}.torch{torch_version}"


def extension_kwargs(build: dict, version: str) -> tuple[dict, str]:
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs = cuda_archs()
    cutlass = cutlass_include()
    include_dirs = [str(ROOT / "csrc"), cutlass]
    cutlass_text = f"CUTLASS/CuTe headers from {cutlass}"
    subset = shape_subset()
    sources = extension_sources(diagnostic=cta_timeline_build(), subset=subset)
    # Build facts for replayssm_cuda._C.build_info(). The archs travel as one token ("90a_100a"): a ';'
    # would be cut by the shell that runs each compile command.
    defines = [f"-DREPLAYSSM_VERSION={version}", f"-DREPLAYSSM_CUDA_ARCHS={'_'.join(archs)}"]
    shapes_text = ""
    if subset:
        SHAPE_SUBSET_HEADER.parent.mkdir(parents=True, exist_ok=True)
        header = shape_subset_header(subset)
        if not SHAPE_SUBSET_HEADER.exists() or SHAPE_SUBSET_HEADER.read_text() != header:
            SHAPE_SUBSET_HEADER.write_text(header)
        include_dirs.append(str(SHAPE_SUBSET_HEADER.parent))
        defines.append("-DREPLAYSSM_SHAPE_SUBSET=1")
        shapes_text = "; shapes " + "; ".join(f"{f} {', '.join(f'{a}x{b}' for a, b in s)}" for f, s in subset.items())
    diagnostic = ""
    if cta_timeline_build():
        defines.append("-DREPLAYSSM_CTA_TIMELINE=1")
        diagnostic = "; DIAGNOSTIC build (per-CTA time lines in the update and step kernels)"
    nvcc = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]
    nvcc += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    torch = build["torch"]
    summary = (f"building replayssm_cuda._C for sm_{', sm_'.join(archs)} with CUDA {nvcc_version(build['toolkit'])} "
               f"at {build['toolkit']} (from {build['found_by']}), for torch {torch.__version__}; "
               f"{cutlass_text}{shapes_text}{diagnostic}")
    ext = CUDAExtension(
        name="replayssm_cuda._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": ["-O3", *defines], "nvcc": nvcc + defines},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}, summary


def record(extension: bool, version: str, summary: str, reason: str | None, torch_version: str | None = None,
           cuda_version: str | None = None) -> None:
    """replayssm_cuda/_build.py: what this install built, for `python -m replayssm_cuda info`, and the torch
    and CUDA versions _C was built against (replayssm_cuda._extension refuses to load it under others)."""
    text = (f'"""Written by setup.py when this package was built (not tracked): what the build made."""\n\n'
            f"EXTENSION = {extension!r}\nVERSION = {version!r}\nSUMMARY = {summary!r}\nREASON = {reason!r}\n"
            f"TORCH = {torch_version!r}\nCUDA = {cuda_version!r}\n")
    if not BUILD_RECORD.exists() or BUILD_RECORD.read_text() != text:
        BUILD_RECORD.write_text(text)


def main() -> None:
    base = base_version()
    build = plan()
    if build["extension"]:
        version = f"{base}+{torch_cuda_tag(build['torch'])}"
        kwargs, summary = extension_kwargs(build, base)
    else:
        version = f"{base}+cpu"
        kwargs = {}
        summary = (f"installing the pure-Python package (no replayssm_cuda._C; every op runs the PyTorch "
                   f"reference): {build['reason']}")
    print(f"{PREFIX} {version}: {summary}", file=sys.stderr)
    torch = build.get("torch")
    record(build["extension"], version, summary, build.get("reason"),
           torch.__version__.split("+")[0] if torch is not None else None,
           torch.version.cuda if torch is not None else None)
    setup(version=version, packages=find_packages(include=["replayssm_cuda", "replayssm_cuda.*"]), **kwargs)


# setuptools runs this file as __main__; tests/test_install.py imports it for its toolkit search.
if __name__ == "__main__":
    main()
