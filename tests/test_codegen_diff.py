"""tools/codegen_diff.py's parts that need no compiler (CPU): the instantiation source names each family's
kernel header and lists its kernels with the kernel's parameters, and every listed kernel's template
arguments match the mangled name nvcc gives that kernel (names taken from sm_90a cubins of this tree), so
the tool pairs the base's and the working tree's kernels; the .text reader finds a kernel's section in a
hand-made ELF."""

import importlib.util
import os
import struct

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "tools", "codegen_diff.py")
ROOT = os.path.join(os.path.dirname(__file__), "..")


def load_tool():
    spec = importlib.util.spec_from_file_location("codegen_diff", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()

# Mangled names as cuobjdump lists them (the fp16-checkpoint fp8-copy kernels, one a family).
MAMBA2_NAME = ("_ZN9replayssm6mamba211step_kernelILi64ELi128ELNS_5DTypeE2ELb1ELS2_3ELS2_2ELb0ELb1ELb0ELb0EEEvNS_12"
               "Mamba2ParamsENS_16Mamba2StepLaunchE")
GDN_NAME = "_ZN9replayssm3gdn11step_kernelILi128ELi128ELNS_5DTypeE2ELb1ELS2_3ELS2_2ELb0EEEvNS_9GdnParamsEbbibib"


@pytest.mark.parametrize("family", sorted(tool.FAMILIES))
def test_instantiation_source_lists_every_kernel_of_the_family(family):
    f = tool.FAMILIES[family]
    src = tool.instantiation_source(family)
    assert f'#include "{f["header"]}"' in src
    assert os.path.isfile(os.path.join(ROOT, "csrc", f["header"])), "the header the tool includes exists"
    for _, args in f["kernels"]:
        assert f"step_kernel<{args}>({f['params']});" in src
    assert len({args for _, args in f["kernels"]}) == len(f["kernels"]), "no kernel listed twice"


def test_template_arguments_match_the_mangled_names():
    assert tool.mangled_key(MAMBA2_NAME, "mamba2") == (64, 128, 2, 1, 3, 2, 0, 1, 0, 0)
    assert tool.template_key("64,128,D::kFloat16,true,D::kFloat8E4M3,D::kFloat16,false,true,false", 10) == \
        tool.mangled_key(MAMBA2_NAME, "mamba2"), "the two-group flag defaults to false in the key"
    assert tool.mangled_key(GDN_NAME, "gdn") == (128, 128, 2, 1, 3, 2, 0)
    assert tool.template_key("128,128,D::kFloat16,true,D::kFloat8E4M3,D::kFloat16,false", 7) == \
        tool.mangled_key(GDN_NAME, "gdn")
    assert tool.mangled_key(GDN_NAME, "mamba2") is None, "a GDN name is no Mamba-2 kernel"


def test_listed_kernels_have_the_family_argument_count():
    for family, f in tool.FAMILIES.items():
        for label, args in f["kernels"]:
            n = len(args.split(","))
            assert n <= f["args"] and (n == f["args"] or family == "mamba2"), (family, label)


def test_text_sections_of_a_hand_made_elf(tmp_path):
    # A 64-bit ELF with a null section, .shstrtab and one .text.<kernel> section of 32 bytes.
    names = b"\0.shstrtab\0.text.k\0"
    code = bytes(range(32))
    header_size, entry = 64, 64
    names_at = header_size
    code_at = names_at + len(names)
    shoff = code_at + len(code)
    sections = [
        struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_at, len(names), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, code_at, len(code), 0, 0, 16, 0),
    ]
    header = bytearray(header_size)
    header[:4] = b"\x7fELF"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, entry, len(sections), 1)
    path = tmp_path / "k.cubin"
    path.write_bytes(bytes(header) + names + code + b"".join(sections))
    assert tool.kernel_text_sections(str(path)) == {"k": code}
