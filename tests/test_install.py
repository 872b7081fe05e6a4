"""The install: setup.py finds the CUDA toolkit the way users have it (CUDA_HOME, CUDA_PATH, the nvcc on
PATH through symlinks and wrapper scripts), and says what it built."""

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def setup_py(monkeypatch):
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    spec = importlib.util.spec_from_file_location("replayssm_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_toolkit() -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("no nvcc on this machine")
    out = subprocess.run([nvcc, "-v", "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True)
    top = [line.split("=", 1)[1] for line in (out.stdout + out.stderr).splitlines() if line.startswith("#$ TOP=")]
    return Path(top[0]).resolve()


def fake_bin(tmp_path, name, target=None, script=None) -> Path:
    folder = tmp_path / name / "bin"
    folder.mkdir(parents=True)
    nvcc = folder / "nvcc"
    if target is not None:
        nvcc.symlink_to(target)
    else:
        nvcc.write_text(script)
        nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return folder


def test_nvcc_through_a_wrapper_script(setup_py, tmp_path, monkeypatch):
    """/usr/local/bin/nvcc running the real one: the toolkit is where the real one lives, not /usr/local."""
    toolkit = real_toolkit()
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path, "wrapper", script=f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')))
    root, found_by = setup_py.find_cuda()
    assert root == toolkit and "nvcc on PATH" in found_by


def test_nvcc_through_a_wrapper_that_hides_the_path(setup_py, tmp_path, monkeypatch):
    """A wrapper naming no path: nvcc's own dry run says where it lives (the host compiler on PATH)."""
    toolkit = real_toolkit()
    script = f'#!/bin/sh\nT={toolkit.parent}\nexec "$T/{toolkit.name}/bin/nvcc" "$@"\n'
    monkeypatch.setenv("PATH", f"{fake_bin(tmp_path, 'hidden', script=script)}{os.pathsep}{os.environ['PATH']}")
    assert setup_py.find_cuda()[0] == toolkit


def test_nvcc_through_a_symlink(setup_py, tmp_path, monkeypatch):
    toolkit = real_toolkit()
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path, "link", target=toolkit / "bin" / "nvcc")))
    assert setup_py.find_cuda()[0] == toolkit


def test_cuda_home_and_cuda_path(setup_py, tmp_path, monkeypatch):
    toolkit = real_toolkit()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_PATH", str(toolkit))
    assert setup_py.find_cuda() == (toolkit, "CUDA_PATH")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    root, why = setup_py.find_cuda()
    assert root is None and why == f"CUDA_HOME={tmp_path} has no bin/nvcc"
    headerless = fake_bin(tmp_path, "headerless", target=toolkit / "bin" / "nvcc").parent
    monkeypatch.setenv("CUDA_HOME", str(headerless))
    assert setup_py.find_cuda() == (None, f"CUDA_HOME={headerless} has no include/cuda_runtime_api.h")


def test_local_version_tag(setup_py):
    class Torch:
        __version__ = "2.11.0+cu130"

        class version:
            cuda = "13.0"

    assert setup_py.torch_cuda_tag(Torch) == "cu130.torch2.11"


def test_info_says_what_the_install_built():
    """`python -m replayssm_cuda info` repeats setup.py's line (pip -q hides it), or says there is none."""
    out = subprocess.run([sys.executable, "-m", "replayssm_cuda", "info"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    record = ROOT / "replayssm_cuda" / "_build.py"
    if record.exists():
        assert "install: replayssm-cuda " in out and ("building replayssm_cuda._C" in out or "pure-Python" in out)
    else:
        assert "install: no record" in out


def test_a_build_for_another_torch_is_refused_naming_both_versions():
    """_C links against one torch minor version's C++ ABI and one CUDA major version: another torch gets an
    ImportError that names both builds (never a crash or a missing-symbol trace); patch releases load."""
    from replayssm_cuda._extension import torch_mismatch

    assert torch_mismatch("2.11.0", "13.0", "2.11.1+cu130", "13.0") is None
    assert torch_mismatch("2.11.0", "13.0", "2.11.0", "13.1") is None
    assert torch_mismatch(None, None, "2.13.0+cpu", None) is None  # a pure-Python install records none
    message = torch_mismatch("2.11.0", "13.0", "2.13.0+cu130", "13.0")
    assert "torch 2.11.0 with CUDA 13.0" in message and "torch 2.13.0+cu130 with CUDA 13.0" in message
    assert torch_mismatch("2.11.0", "13.0", "2.11.0+cu128", "12.8") is not None
    assert "CUDA None" in torch_mismatch("2.11.0", "13.0", "2.11.0+cpu", None)  # a CUDA build under CPU torch


# REPLAYSSM_SHAPES narrows a build to some shapes of each family it names (the rest keep every shape):
# the shapes in table order, only their instantiation files among the sources, and clear errors naming
# the variable for what the tables do not have.
def test_shape_subset_narrows_the_sources(setup_py, monkeypatch):
    monkeypatch.delenv("REPLAYSSM_SHAPES", raising=False)
    assert setup_py.shape_subset() is None
    every = setup_py.extension_sources(diagnostic=False)
    monkeypatch.setenv("REPLAYSSM_SHAPES", "gdn=128x128 ; mamba2=80x128,64x128")
    subset = setup_py.shape_subset()
    assert subset == {"gdn": [(128, 128)], "mamba2": [(64, 128), (80, 128)]}
    kept = setup_py.extension_sources(diagnostic=False, subset=subset)
    instantiations = sorted(Path(s).name for s in kept if "/instantiations/" in s)
    assert instantiations == sorted(f"{op}_{shape}.cu" for op in ("fold", "step", "verify")
                                    for shape in ("k128_v128", "p64_n128", "p80_n128"))
    assert [s for s in kept if "/instantiations/" not in s] == [s for s in every if "/instantiations/" not in s]
    assert len(every) - len(kept) == 3 * (3 + 4)  # 3 of GDN's 4 shapes and 4 of Mamba-2's 6, 3 files each


@pytest.mark.parametrize("value,says", [("kda=128x128", "unknown family 'kda'"), ("gdn=96x128", "gdn has no shape '96x128'"),
                                        ("mamba2=", "'mamba2' names no shape"), ("gdn=128", "gdn has no shape '128'")])
def test_shape_subset_rejects_what_the_tables_lack(setup_py, monkeypatch, value, says):
    monkeypatch.setenv("REPLAYSSM_SHAPES", value)
    with pytest.raises(SystemExit) as err:
        setup_py.shape_subset()
    assert "REPLAYSSM_SHAPES" in str(err.value) and says in str(err.value)


# The header setup.py writes narrows the tables the dispatch and _C.capabilities() read (variants.h is
# host-safe C++: compiled here with the CUDA toolkit's headers), and without it they keep every row.
def test_shape_subset_header_narrows_the_tables(setup_py, monkeypatch, tmp_path):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    cuda_include = real_toolkit() / "include"
    monkeypatch.setenv("REPLAYSSM_SHAPES", "mamba2=80x128;gdn=64x128,128x128")
    (tmp_path / "replayssm_shape_subset.h").write_text(setup_py.shape_subset_header(setup_py.shape_subset()))
    program = tmp_path / "shapes.cpp"
    program.write_text('#include "families/gdn/variants.h"\n#include "families/mamba2/variants.h"\n#include <cstdio>\n'
                       "int main() {\n"
                       '  for (const auto& s : replayssm::mamba2::kVariants.shapes) std::printf("mamba2 %d %d\\n", s.a, s.b);\n'
                       '  for (const auto& s : replayssm::gdn::kVariants.shapes) std::printf("gdn %d %d\\n", s.a, s.b);\n'
                       "}\n")

    def rows(*flags):
        exe = tmp_path / "shapes"
        subprocess.run([cxx, "-std=c++17", "-I", str(ROOT / "csrc"), "-I", str(cuda_include), *flags, str(program),
                        "-o", str(exe)], check=True)
        return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]

    assert rows("-DREPLAYSSM_SHAPE_SUBSET=1", "-I", str(tmp_path)) == ["mamba2 80 128", "gdn 64 128", "gdn 128 128"]
    assert rows() == [f"mamba2 {a} {b}" for a, b in setup_py.table_shapes("mamba2")] + \
                     [f"gdn {a} {b}" for a, b in setup_py.table_shapes("gdn")]
