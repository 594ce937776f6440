"""The ``--plot`` figure: MB/s against n_procs (needs matplotlib)."""

from __future__ import annotations

from typing import Any, Sequence

from multitables_bench.records import DEFAULT_DATA, Codec, Context, Reader, Result, Settings, make_codec
from multitables_bench.report import best_single, find_result


def plot(results: Sequence[Result], ctx: Context, path: str) -> None:
    """MB/s against n_procs, one panel per (data, complib, complevel), with the disk and single-process ceilings drawn in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    s = ctx.settings
    parts = [(data, complib) for data in s.data for complib in s.complibs]
    rows, cols = len(parts), len(s.complevels)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.0, 4.5 * cols), 3.6 * rows + 0.6), squeeze=False, sharex=True)
    xs = list(range(1, s.max_procs + 1))
    for i, (data, complib) in enumerate(parts):
        mine = [r for r in results if r.data == data]
        for j, level in enumerate(s.complevels):
            _plot_panel(axes[i][j], mine, make_codec(complib, level), s, xs)
            if s.data != (DEFAULT_DATA,):
                axes[i][j].set_title(f"{data}: {axes[i][j].get_title()}", fontsize=9)
    handles, _ = axes[0][0].get_legend_handles_labels()
    handles += [
        Line2D([], [], marker="*", linestyle="", color="grey", markersize=10, label="default n_procs"),
        Line2D([], [], marker="x", linestyle="", color="red", markersize=8, label="started warm (>1% cached)"),
    ]
    # Below the panels, where it hides no line (inside one, "best" still sat on the lines of a small panel).
    ncol = min(4, len(handles))
    legend_inches = 0.22 * -(-len(handles) // ncol) + 0.15
    fig.set_figheight(fig.get_figheight() + legend_inches)
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=ncol, frameon=False)
    fig.suptitle(f"multitables: MB/s against n_procs (cache: {ctx.cache})", fontsize=10)
    height = fig.get_figheight()
    fig.tight_layout(rect=(0.0, legend_inches / height, 1.0, 1.0 - 0.3 / height))  # the title's line kept clear
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_panel(ax: Any, results: Sequence[Result], codec: Codec, s: Settings, xs: list[int]) -> None:
    odirect = find_result(results, "main", codec, Reader("odirect"))
    best = best_single(results, "main", codec)
    if odirect is not None:
        ax.axhline(odirect.mb_per_s, color="black", linestyle="--", linewidth=1, label="disk (O_DIRECT)")
    if best is not None:
        ax.axhline(best.mb_per_s, color="grey", linestyle=":", linewidth=1.5, label=f"best 1 process ({best.reader.engine})")
    in_process = False
    for engine in s.engines:
        for mode in s.modes:
            found = [find_result(results, "main", codec, Reader("multitables", engine, mode, n)) for n in xs]
            pts = [(x, r) for x, r in zip(xs, found) if r is not None]
            if not pts:
                continue
            line = ax.plot([x for x, _ in pts], [r.mb_per_s for _, r in pts], marker="o", label=f"{engine} {mode}")[0]
            warm = [(x, r.mb_per_s) for x, r in pts if r.warm_start]
            if warm:
                ax.scatter(*zip(*warm), marker="x", s=80, color="red", zorder=3)
            default = find_result(results, "main", codec, Reader("multitables", engine, mode, None))
            if default is not None and default.n_procs_used is not None:
                in_process = in_process or default.n_procs_used == 0
                ax.scatter([default.n_procs_used], [default.mb_per_s], marker="*", s=120, color=line.get_color(), zorder=3)
    ax.set_title("uncompressed" if codec.complevel == 0 else f"{codec.complib} level {codec.complevel}", fontsize=9)
    ax.set_xlabel("n_procs")
    ax.set_ylabel("MB/s")
    # The default may read in this process (n_procs 0, NOTE [read plan]): its star goes at 0.
    ax.set_xticks(([0] if in_process else []) + xs, (["0 (in-process)"] if in_process else []) + [str(x) for x in xs])
    ax.set_ylim(bottom=0)


