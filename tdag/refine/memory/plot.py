"""``tdag cost --memory --plot memory.png``: the bytes live after each scheduled node, the
peak marked."""
from __future__ import annotations

from tdag.errors import TdagError
from tdag.refine.memory.report import MemoryReport


def plot(report: MemoryReport, path: str) -> None:
    """Draw ``report.timeline()`` (every size bound) with the peak marked, to ``path``."""
    try:
        import matplotlib  # noqa: PLC0415  (the optional extra "plot": only --plot draws)
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise TdagError("--plot needs matplotlib: pip install 'tdag[plot]'") from None
    values = [v for _, v in report.timeline()]
    if not all(isinstance(v, int) for v in values):
        raise TdagError("--plot needs every size bound: --size NAME=INT")
    top = max(range(len(values)), key=values.__getitem__)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(len(values)), [v / 2 ** 20 for v in values], lw=1)
    ax.scatter([top], [values[top] / 2 ** 20], color="red", zorder=3)
    peak = values[top] / 2 ** 20
    ax.annotate(f"peak {peak:.2f} MiB\n{report.peak_at}", (top, peak),
                fontsize=7, xytext=(4, -18), textcoords="offset points")
    ax.set(xlabel="scheduled node", ylabel="MiB live", title="memory over the schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["plot"]
