"""Build of replayssm-cuda: the Python package plus, when a CUDA toolchain is there, replayssm_cuda._C.

Install with `pip install --no-build-isolation .` (the build needs the torch you run with).

The extension is built when torch imports, torch.version.cuda is set and nvcc is found (CUDA_HOME);
otherwise the pure-Python package is installed and one line says why. Knobs:
    REPLAYSSM_CUDA_ARCHS   archs to compile, ';' or ',' separated (default "90a;100a")
    REPLAYSSM_CTA_TIMELINE 1: a diagnostic build whose update and step kernels record a time line per CTA
                           (csrc/diag/, tools/cta_timeline.py); never for a product
    MAX_JOBS               parallel compile jobs (torch's ninja build)
The kernels use the CUTLASS/CuTe headers of the `nvidia-cutlass` Python package (pip install --no-deps
nvidia-cutlass==4.2.0.0, the version whose machine code was checked); building the extension without it
stops with that instruction.
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent.resolve()
PREFIX = "replayssm-cuda:"
DEFAULT_ARCHS = "90a;100a"


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE).group(1)


def cuda_archs() -> list[str]:
    raw = os.environ.get("REPLAYSSM_CUDA_ARCHS", DEFAULT_ARCHS)
    archs = [a for a in re.split(r"[;,\s]+", raw) if a]
    bad = [a for a in archs if not re.fullmatch(r"\d+[af]?", a)]
    if not archs or bad:
        sys.exit(f"{PREFIX} REPLAYSSM_CUDA_ARCHS must list archs like '90a;100a', got {raw!r}")
    return archs


def cutlass_include() -> str:
    # Located, not imported: the headers are all we need from nvidia-cutlass.
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{PREFIX} the CUDA kernels need the CUTLASS/CuTe headers: pip install --no-deps nvidia-cutlass==4.2.0.0 "
                 f"(no cutlass_library module in {sys.executable})")
    include = Path(spec.submodule_search_locations[0]) / "source" / "include"
    if not (include / "cute").is_dir() or not (include / "cutlass").is_dir():
        sys.exit(f"{PREFIX} the CUDA kernels need the CUTLASS/CuTe headers: expected cute/ and cutlass/ under "
                 f"{include} (pip install --no-deps nvidia-cutlass==4.2.0.0)")
    print(f"{PREFIX} CUTLASS/CuTe headers: {include}", file=sys.stderr)
    return str(include)


def cta_timeline_build() -> bool:
    return os.environ.get("REPLAYSSM_CTA_TIMELINE", "0") not in ("", "0")


def extension_sources(diagnostic: bool) -> list[str]:
    """Every kernel source (.cu) and host source (.cpp) under csrc/; csrc/diag/ only in a diagnostic build."""
    csrc = ROOT / "csrc"
    found = [p for p in csrc.rglob("*") if p.suffix in (".cu", ".cpp")]
    if not diagnostic:
        found = [p for p in found if (csrc / "diag") not in p.parents]
    return sorted(str(p.relative_to(ROOT)) for p in found)


def why_no_extension() -> str | None:
    """None when the CUDA extension can be built, else the reason it cannot."""
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception as exc:  # torch missing or broken
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if CUDA_HOME is None:
        return "nvcc was not found (set CUDA_HOME)"
    return None


def extension_kwargs() -> dict:
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs = cuda_archs()
    include_dirs = [str(ROOT / "csrc"), cutlass_include()]
    sources = extension_sources(diagnostic=cta_timeline_build())
    # Build facts for replayssm_cuda._C.build_info(). The archs travel as one token ("90a_100a"): a ';'
    # would be cut by the shell that runs each compile command.
    defines = [f"-DREPLAYSSM_VERSION={project_version()}", f"-DREPLAYSSM_CUDA_ARCHS={'_'.join(archs)}"]
    if cta_timeline_build():
        defines.append("-DREPLAYSSM_CTA_TIMELINE=1")
        print(f"{PREFIX} diagnostic build: per-CTA time lines in the update and step kernels", file=sys.stderr)
    nvcc = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]
    nvcc += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    print(f"{PREFIX} building replayssm_cuda._C for sm_{', sm_'.join(archs)}", file=sys.stderr)
    ext = CUDAExtension(
        name="replayssm_cuda._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": ["-O3", *defines], "nvcc": nvcc + defines},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


reason = why_no_extension()
if reason is None:
    kwargs = extension_kwargs()
else:
    print(f"{PREFIX} installing the pure-Python package only (no replayssm_cuda._C, ops use the PyTorch "
          f"reference): {reason}", file=sys.stderr)
    kwargs = {}

setup(packages=find_packages(include=["replayssm_cuda", "replayssm_cuda.*"]), **kwargs)
