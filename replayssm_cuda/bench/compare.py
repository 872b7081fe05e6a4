"""Two builds compared: the rows of benchmark JSON files (--json output or a results file) of a base and a
new side, matched by table and configuration; per row the median µs of each side over its files, the
change, and the new side's range. Launches of one build are compared in one process with --override
sets instead; this is for what needs two builds (a kernel change against its base), run alternately on
the same machine (base, new, base, new: run-to-run noise at large batches reaches several percent, more
than many kernel changes, so one pair proves little).

    python -m replayssm_cuda bench compare --base base1.json base2.json --new new1.json new2.json
"""

from __future__ import annotations

import json
import pathlib
import statistics

from .results import row_key, split_constant


def load_rows(path) -> list[dict]:
    data = json.loads(pathlib.Path(path).read_text())
    if not isinstance(data, dict) or "rows" not in data:
        raise ValueError(f"{path}: expected a benchmark JSON file (with 'rows'), got something else")
    return [r for r in data["rows"] if not r.get("error") and r.get("us") is not None]


def side_times(paths) -> dict:
    """row key -> (config, table, [µs per file])."""
    out = {}
    for path in paths:
        for r in load_rows(path):
            entry = out.setdefault(row_key(r), (r["config"], r["table"], []))
            entry[2].append(r["us"])
    return out


def compare(base_paths, new_paths) -> str:
    """A markdown table per benchmark table of the rows both sides have."""
    base, new = side_times(base_paths), side_times(new_paths)
    common = [k for k in new if k in base]
    if not common:
        return "No row is in both sides (same table and configuration).\n"
    out = []
    tables = []
    for k in common:
        if new[k][1] not in tables:
            tables.append(new[k][1])
    for table in tables:
        keys = [k for k in common if new[k][1] == table]
        columns, constant = split_constant([new[k][0] for k in keys])
        out.append(f"## {table}\n")
        if constant:
            out.append("All rows: " + ", ".join(f"{c} {v}" for c, v in constant.items()) + ".\n")
        out.append("| " + " | ".join(columns + ["base µs", "new µs", "change", "new range", "files"]) + " |")
        out.append("|" + "---|" * (len(columns) + 5))
        for k in keys:
            config, _, b = base[k]
            n = new[k][2]
            mb, mn = statistics.median(b), statistics.median(n)
            cells = [str(config.get(c, "-")) for c in columns]
            cells += [f"{mb:.2f}", f"{mn:.2f}", f"{100 * (mn / mb - 1):+.1f}%", f"{min(n):.2f}-{max(n):.2f}",
                      f"{len(b)}/{len(n)}"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
