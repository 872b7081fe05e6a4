"""Which step kernels a source change touches, without a GPU: compiles the same explicit instantiations
of each family's step_kernel from a base commit and from the working tree, and prints per kernel whether
its PTX is byte-identical, whether its machine code (SASS: the cubin's .text section) is, how many
instructions differ, and ptxas's registers and spill bytes on both sides (sm_90a).

    python3 tools/codegen_diff.py                 # base = HEAD (the uncommitted change), both families
    python3 tools/codegen_diff.py --base 65ea5a5  # any commit
    python3 tools/codegen_diff.py --family gdn    # Mamba-2's or GDN's (and KDA's) step kernels only
    python3 tools/codegen_diff.py --no-ptxas      # PTX only (~10 s a side on two cores)

Why: a replay step's speed can move by a few percent with code changes confined to another branch of
its kernel (the fold), because ptxas lays out the whole kernel again. A kernel whose SASS is "same"
cannot have moved, so an A/B on the GPU need only watch the others; and a refactor that claims the
machine code unchanged can show it for every function, not for a disassembly's first lines. PTX can
differ where the SASS does not (renumbered virtual registers), so the SASS column is the one that
decides. The instantiations are the kernels the benchmark's rows and the tests' odd shapes run
(FAMILIES below; a template signature change makes the compile fail, which says to update the list).
Needs nvcc and the CUTLASS/CuTe headers of the nvidia-cutlass package (found as the build finds them,
or --cutlass-include).
"""

import argparse
import concurrent.futures
import difflib
import importlib.util
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

# Per family: the kernel header, its namespace, the kernel's parameter list, the pattern of its template
# arguments in a mangled name, and the kernels: a short label and the template arguments.
# Mamba-2: step_kernel<P, N, checkpoint, copy?, read copy, activations, stochastic rounding?, ordered?,
# tf32 replay? [, two groups?]>. GDN: step_kernel<K, V, checkpoint, copy?, read copy, activations,
# vector gate? (KDA)>.
FAMILIES = {
    "mamba2": {
        "header": "families/mamba2/step_kernel.cuh",
        "namespace": "replayssm::mamba2",
        "params": "const Mamba2Params, const Mamba2StepLaunch",
        "mangled": r"step_kernelILi(\d+)ELi(\d+)ELNS_5DTypeE(\d+)ELb(\d)ELS2_(\d+)ELS2_(\d+)ELb(\d)ELb(\d)ELb(\d)ELb(\d)E",
        "args": 10,
        "kernels": [
            ("P80 N128 fp8 copy", "80,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false"),
            ("P80 N128 fp8 copy, two groups", "80,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false,true"),
            ("P80 N128 fp8 copy, ordered", "80,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,true,false"),
            ("P80 N128 bf16 ckpt + SR, fp8 copy", "80,128,D::kBFloat16,true,D::kFloat8E4M3,D::kBFloat16,true,false,false"),
            ("P80 N128 bf16 copy", "80,128,D::kFloat32,true,D::kBFloat16,D::kBFloat16,false,false,false"),
            ("P80 N128 fp16 copy, fp16 act", "80,128,D::kFloat32,true,D::kFloat16,D::kFloat16,false,false,false"),
            ("P80 N128 no copy, tf32", "80,128,D::kFloat32,false,D::kFloat32,D::kBFloat16,false,false,true"),
            ("P80 N128 bf16 ckpt + SR, no copy", "80,128,D::kBFloat16,false,D::kBFloat16,D::kBFloat16,true,false,false"),
            ("P64 N128 fp8 copy", "64,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false"),
            ("P64 N128 fp8 copy, two groups", "64,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false,true"),
            ("P64 N128 bf16 copy", "64,128,D::kFloat32,true,D::kBFloat16,D::kBFloat16,false,false,false"),
            ("P64 N128 no copy, tf32", "64,128,D::kFloat32,false,D::kFloat32,D::kBFloat16,false,false,true"),
            ("P128 N128 fp8 copy", "128,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false"),
            ("P128 N128 bf16 ckpt, no copy", "128,128,D::kBFloat16,false,D::kBFloat16,D::kBFloat16,false,false,false"),
            ("P80 N64 fp8 copy", "80,64,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false"),
            ("P128 N64 fp8 copy", "128,64,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false,false,false"),
        ],
    },
    "gdn": {
        "header": "families/gdn/step_kernel.cuh",
        "namespace": "replayssm::gdn",
        "params": "const GdnParams, const bool, const bool, const int, const bool, const int, const bool",
        "mangled": r"step_kernelILi(\d+)ELi(\d+)ELNS_5DTypeE(\d+)ELb(\d)ELS2_(\d+)ELS2_(\d+)ELb(\d)E",
        "args": 7,
        "kernels": [
            ("K128 V128 no copy", "128,128,D::kFloat32,false,D::kFloat32,D::kBFloat16,false"),
            ("K128 V128 bf16 copy", "128,128,D::kFloat32,true,D::kBFloat16,D::kBFloat16,false"),
            ("K128 V128 bf16 copy, fp16 act", "128,128,D::kFloat32,true,D::kBFloat16,D::kFloat16,false"),
            ("K128 V128 fp8 copy", "128,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false"),
            ("K128 V128 fp8 copy, fp16 act", "128,128,D::kFloat32,true,D::kFloat8E4M3,D::kFloat16,false"),
            ("K128 V128 bf16 ckpt, no copy", "128,128,D::kBFloat16,false,D::kBFloat16,D::kBFloat16,false"),
            ("K128 V128 bf16 ckpt, fp8 copy", "128,128,D::kBFloat16,true,D::kFloat8E4M3,D::kBFloat16,false"),
            ("K64 V64 fp8 copy", "64,64,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,false"),
            ("KDA K128 V128 no copy", "128,128,D::kFloat32,false,D::kFloat32,D::kBFloat16,true"),
            ("KDA K128 V128 fp8 copy", "128,128,D::kFloat32,true,D::kFloat8E4M3,D::kBFloat16,true"),
        ],
    },
}


def instantiation_source(family: str) -> str:
    f = FAMILIES[family]
    lines = [f'#include "{f["header"]}"', f"namespace {f['namespace']} {{", "using D = DType;"]
    lines += [f"template __global__ void step_kernel<{args}>({f['params']});" for _, args in f["kernels"]]
    return "\n".join(lines + ["}"]) + "\n"


def cutlass_include() -> str | None:
    """The CUTLASS/CuTe include folder of the nvidia-cutlass package, as setup.py and CMakeLists.txt find it."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    include = pathlib.Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    return str(include) if (include / "cute").is_dir() else None


def compile_side(root: str, src: str, out: str, ptxas: bool, cutlass: str) -> tuple[str, str, dict]:
    """(PTX text, ptxas -v log or '', {kernel: its SASS bytes} or {}) of the instantiations against root's csrc."""
    nvcc = ["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", f"-I{root}/csrc", f"-I{cutlass}"]
    ptx = os.path.join(out, "k.ptx")
    subprocess.run(nvcc + ["-arch=sm_90a", "-ptx", src, "-o", ptx], check=True, capture_output=True, text=True)
    log, sass = "", {}
    if ptxas:
        cubin = os.path.join(out, "k.cubin")
        log = subprocess.run(nvcc + ["-arch=sm_90a", "-cubin", src, "-o", cubin, "-Xptxas", "-v"],
                             check=True, capture_output=True, text=True).stderr
        sass = kernel_text_sections(cubin)
    with open(ptx) as f:
        return f.read(), log, sass


def kernel_text_sections(cubin: str) -> dict:
    """{mangled kernel name: the bytes of its .text.<name> section} of a cubin (ELF64, little-endian):
    the kernel's machine code, read without cuobjdump (not every toolkit install has it)."""
    with open(cubin, "rb") as f:
        elf = f.read()
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + k * shentsize) for k in range(shnum)]
    names_at = sections[shstrndx][4]   # sh_offset of the section-name table

    def name(sh):
        end = elf.index(b"\0", names_at + sh[0])
        return elf[names_at + sh[0]:end].decode()
    return {name(sh)[len(".text."):]: elf[sh[4]:sh[4] + sh[5]] for sh in sections if name(sh).startswith(".text.")}


def changed_instructions(base: bytes, new: bytes) -> str:
    """How much of a kernel's machine code differs: "a / b" instructions (16 bytes each on sm_90) of the
    base / new side outside the runs the two share, in order. A few instructions means a local change
    (an instruction added at the kernel's start moves 3-33); hundreds mean ptxas scheduled the kernel
    again, which is what has moved replay steps by percents before."""
    a = [base[i:i + 16] for i in range(0, len(base), 16)]
    b = [new[i:i + 16] for i in range(0, len(new), 16)]
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return f"{sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag != 'equal')} / {sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag != 'equal')} of {len(b)} instr."


def ptx_entries(ptx: str) -> dict:
    """{mangled name: its PTX text} (a PTX file lists each kernel after `.visible .entry`)."""
    parts = re.split(r"(?m)^\.visible \.entry ", ptx)
    return {part.split("(")[0]: part for part in parts[1:]}


DTYPES = {"D::kFloat32": 0, "D::kBFloat16": 1, "D::kFloat16": 2, "D::kFloat8E4M3": 3}  # DType's values


def template_key(args: str, count: int) -> tuple:
    """A kernel's template arguments as integers, trailing defaulted flags (Mamba-2's two groups) filled
    in as the mangled name has them."""
    values = [int(DTYPES.get(a, {"true": 1, "false": 0}.get(a, a))) for a in (x.strip() for x in args.split(","))]
    return tuple(values + [0] * (count - len(values)))


def mangled_key(name: str, family: str):
    m = re.search(FAMILIES[family]["mangled"], name)
    return tuple(int(g) for g in m.groups()) if m else None


def ptxas_usage(log: str) -> dict:
    """{mangled name: (registers, spill store bytes)} from ptxas -v."""
    usage, name, spill = {}, None, 0
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name, spill = m.group(1), 0
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            usage[name] = (int(m.group(1)), spill)
            name = None
    return usage


def compare_family(family: str, base_root: str, repo: str, tmp: str, ptxas: bool, cutlass: str) -> int | None:
    """Prints the family's table; returns how many kernels changed, None when the compile or the kernel
    lookup failed (said on stderr)."""
    kernels, count = FAMILIES[family]["kernels"], FAMILIES[family]["args"]
    src = os.path.join(tmp, f"{family}_instantiations.cu")
    with open(src, "w") as f:
        f.write(instantiation_source(family))
    outs = {side: os.path.join(tmp, f"{family}_{side}") for side in ("base", "new")}
    for d in outs.values():
        os.makedirs(d)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {side: pool.submit(compile_side, root, src, outs[side], ptxas, cutlass)
                for side, root in (("base", base_root), ("new", repo))}
        try:
            (base_ptx, base_log, base_sass), (new_ptx, new_log, new_sass) = jobs["base"].result(), jobs["new"].result()
        except subprocess.CalledProcessError as e:
            print(f"{family}: compile failed ({' '.join(e.cmd[:3])} ...):\n{e.stderr[-3000:]}", file=sys.stderr)
            return None
    base_k, new_k = ptx_entries(base_ptx), ptx_entries(new_ptx)
    base_u, new_u = ptxas_usage(base_log), ptxas_usage(new_log)
    # Each listed kernel on each side, found by its template arguments in the mangled names (a template
    # flag added with a default changes the names, not the kernels they name).
    base_by_key = {mangled_key(n, family): n for n in base_k}
    new_by_key = {mangled_key(n, family): n for n in new_k}
    pairs = [(base_by_key.get(template_key(a, count)), new_by_key.get(template_key(a, count))) for _, a in kernels]
    if any(None in pair for pair in pairs):
        print(f"{family}: expected its {len(kernels)} listed kernels on both sides, found {len(base_k)} / {len(new_k)}",
              file=sys.stderr)
        return None
    print(f"| {family} step kernel | PTX | SASS | registers | spill bytes |")
    print("|---|---|---|---|---|")
    changed = 0
    for (label, _), (name, new_name) in zip(kernels, pairs):
        same_ptx = base_k[name] == new_k[new_name].replace(new_name, name)
        same_sass = same_ptx if not ptxas else name in base_sass and base_sass[name] == new_sass.get(new_name)
        changed += not same_sass
        regs = spill = "-"
        if name in base_u and new_name in new_u:
            (rb, sb), (rn, sn) = base_u[name], new_u[new_name]
            regs, spill = f"{rb} -> {rn}", f"{sb} -> {sn}"
        sass = "-" if not ptxas else "same" if same_sass else f"CHANGED ({changed_instructions(base_sass.get(name, b''), new_sass.get(new_name, b''))})"
        print(f"| {label} | {'same' if same_ptx else 'CHANGED'} | {sass} | {regs} | {spill} |")
    print()
    return changed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD", help="the commit to compare the working tree with")
    ap.add_argument("--family", choices=[*FAMILIES, "all"], default="all", help="whose step kernels (default all)")
    ap.add_argument("--no-ptxas", action="store_true", help="compare PTX only (no registers / spills)")
    ap.add_argument("--cutlass-include", default=None, help="the folder holding cute/ and cutlass/ (default: the "
                    "nvidia-cutlass package's, as the build finds it)")
    args = ap.parse_args()
    if shutil.which("nvcc") is None:
        print("codegen_diff.py needs nvcc (the CUDA toolkit)", file=sys.stderr)
        return 2
    cutlass = args.cutlass_include or cutlass_include()
    if cutlass is None:
        print("codegen_diff.py needs the CUTLASS/CuTe headers: pip install --no-deps nvidia-cutlass==4.2.0.0 in this "
              "Python, or --cutlass-include <folder holding cute/ and cutlass/>", file=sys.stderr)
        return 2
    families = list(FAMILIES) if args.family == "all" else [args.family]
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True).stdout.strip()
    print(f"step kernels, {args.base} -> working tree (sm_90a)\n")
    changed = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        base_root = os.path.join(tmp, "base")
        os.makedirs(base_root)
        archive = subprocess.run(["git", "-C", repo, "archive", args.base, "csrc"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base_root], input=archive, check=True)
        for family in families:
            n = compare_family(family, base_root, repo, tmp, not args.no_ptxas, cutlass)
            if n is None:
                return 1
            changed += n
            total += len(FAMILIES[family]["kernels"])
    print(f"{changed} of {total} kernels' {'PTX' if args.no_ptxas else 'machine code'} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
