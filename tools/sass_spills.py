"""Where ptxas spilled: the source lines of every local-memory store and load (STL / LDL) in the SASS
of the kernels whose mangled name contains --match (all kernels without it), from a build's object files (cuobjdump and
nvdisasm of the CUDA toolkit; the build's -lineinfo gives the lines). For register-pressure work
(ptxas -v says how many bytes, not where).

    python3 tools/sass_spills.py build/temp*/csrc/kernels/mamba2_step_p80_n128.o --match Lb1EEEvN
"""

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("objects", nargs="+")
    ap.add_argument("--match", default="", help="a substring of the kernels' mangled names")
    args = ap.parse_args()
    for obj in args.objects:
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(["cuobjdump", "-xelf", "all", os.path.abspath(obj)], cwd=d, check=True,
                           capture_output=True)
            for cubin in sorted(glob.glob(os.path.join(d, "*.cubin"))):
                sass = subprocess.run(["nvdisasm", "--print-line-info", cubin], capture_output=True, text=True,
                                      check=True).stdout
                func, line = None, "?"
                spills = collections.defaultdict(collections.Counter)
                for text in sass.splitlines():
                    m = re.match(r"\s*\.text\.(\S+):", text)
                    if m:
                        func = m.group(1)
                        continue
                    m = re.search(r'line (\d+)', text)
                    if m and "//##" in text:
                        line = m.group(1) + " " + text.split("File")[-1].split(",")[0].strip().strip('"').split("/")[-1]
                        continue
                    if func and args.match in func and re.search(r"\b(STL|LDL)\b", text):
                        spills[func][("STL" if "STL" in text else "LDL") + " @ " + line] += 1
                for func, counts in spills.items():
                    print(f"{os.path.basename(obj)} {func[-90:]}")
                    for where, n in counts.most_common():
                        print(f"   {n:3d} x {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
