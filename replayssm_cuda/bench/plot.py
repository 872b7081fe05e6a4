"""PNG plots of a run: per dims, time and % of the copy bandwidth against batch, one line per
configuration (the row's configuration without dims and batch). matplotlib is optional: install it with
`pip install "replayssm-cuda[bench]"` (or `pip install matplotlib`)."""

from __future__ import annotations

import pathlib

from .results import split_constant

MISSING = ("--plot needs matplotlib, which is not installed: pip install \"replayssm-cuda[bench]\" "
           "(or pip install matplotlib)")


def series(rows: list[dict]) -> dict:
    """{dims: {line label: [(batch, µs, % copy or None)]}} of the rows that have a batch and a time."""
    rows = [r for r in rows if "batch" in r["config"] and r.get("us") is not None and not r.get("error")]
    columns, _ = split_constant([r["config"] for r in rows])
    line_keys = [c for c in columns if c not in ("dims", "batch")]
    out = {}
    for r in rows:
        c = r["config"]
        label = ", ".join(str(c[k]) for k in line_keys if str(c.get(k, "-")) != "-") or r["table"]
        out.setdefault(str(c.get("dims", "")), {}).setdefault(label, []).append((int(c["batch"]), r["us"],
                                                                                 r.get("copy_pct")))
    for lines in out.values():
        for points in lines.values():
            points.sort()
    return out


def plot(rows: list[dict], path, title: str) -> pathlib.Path:
    """Write the plot; RuntimeError with MISSING when matplotlib is not installed, ValueError when no row has a
    batch (nothing to plot against)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(MISSING) from exc
    data = series(rows)
    if not data:
        raise ValueError("--plot: no row of this run has a batch to plot against")
    fig, axes = plt.subplots(len(data), 2, figsize=(13, 4.2 * len(data)), squeeze=False)
    for (dims, lines), (ax_t, ax_c) in zip(data.items(), axes):
        for label, points in lines.items():
            batches = [p[0] for p in points]
            line, = ax_t.plot(batches, [p[1] for p in points], marker="o", label=label)
            pct = [(b, p[2]) for b, p in zip(batches, points) if p[2] is not None]
            if pct:
                ax_c.plot([b for b, _ in pct], [v for _, v in pct], marker="o", color=line.get_color(), label=label)
        ticks = sorted({p[0] for points in lines.values() for p in points})
        for ax in (ax_t, ax_c):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("batch")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("µs")
        ax_c.set_ylabel("% of copy bandwidth")
        ax_c.set_ylim(bottom=0)
        ax_t.set_title(f"{title}: {dims}" if dims else title)
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    path = pathlib.Path(path)
    if path.parent != pathlib.Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
