"""The per-shape instantiation files (csrc/families/<family>/instantiations/) are what
tools/generate_instantiations.py writes from the families' variants tables: a shape added to or removed
from a table without running the tool fails here."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_instantiation_files_match_the_variants_tables():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "generate_instantiations.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_table_shape_has_its_files():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import generate_instantiations as gen
    finally:
        sys.path.pop(0)
    for family, macro, dims, example in (("mamba2", "REPLAYSSM_MAMBA2_SHAPES", "pn", (80, 128)),
                                         ("gdn", "REPLAYSSM_GDN_SHAPES", "kv", (128, 128))):
        shapes = gen.table_shapes(ROOT / "csrc" / "families" / family / "variants.h", macro)
        assert example in shapes and len(set(shapes)) == len(shapes)
        files = {p.name for p in (ROOT / "csrc" / "families" / family / "instantiations").glob("*.cu")}
        assert files == {f"{op}_{dims[0]}{a}_{dims[1]}{b}.cu" for op in ("step", "verify", "fold") for a, b in shapes}
