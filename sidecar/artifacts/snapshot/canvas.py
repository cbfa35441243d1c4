"""The matplotlib figure a dashboard is drawn on, addressed in pixels from the top left as Grafana lays out panels.

matplotlib is an optional dependency (the ``dashboards`` extra): it is imported when a :class:`Canvas`
is made, never when this module is imported, so ``kv-sidecar --help`` does not load it. The Agg
backend is bound to the figure alone (no pyplot, no process-wide backend switch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...atomic_write import write_atomically_with
from .colors import BACKGROUND
from .layout import Box

#: Dots per inch of the figure: at 100, a size in pixels is a size in hundredths of an inch.
DPI = 100


class Canvas:
    """A matplotlib figure addressed in pixels from the top left, as Grafana lays out panels."""

    def __init__(self, width: float, height: float) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.width, self.height = width, height
        self.fig: Any = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor=BACKGROUND)
        # the Agg backend, bound to this figure only (no pyplot, no process-wide backend switch)
        agg: Any = FigureCanvasAgg(self.fig)
        self.renderer = agg.get_renderer()

    def rect(self, box: Box) -> list[float]:
        """``box`` in figure fractions ``[left, bottom, width, height]``."""
        return [
            box.left / self.width,
            1 - (box.top + box.height) / self.height,
            box.width / self.width,
            box.height / self.height,
        ]

    def axes(self, box: Box, **kwargs: Any) -> Any:
        return self.fig.add_axes(self.rect(box), **kwargs)

    def text(self, x: float, y: float, s: str, *, fit: float | None = None, **kwargs: Any) -> Any:
        """Text at pixel (x, y) from the top left; cut with an ellipsis to ``fit`` pixels wide when given."""
        text = self.fig.text(x / self.width, 1 - y / self.height, s, **kwargs)
        if fit is not None:
            width = text.get_window_extent(renderer=self.renderer).width
            while width > fit and len(s) > 1:
                s = s[: max(1, min(len(s) - 1, int(len(s) * fit / width) - 1))]
                text.set_text(s + "…")
                width = text.get_window_extent(renderer=self.renderer).width
        return text

    def shrink_to(self, text: Any, width: float) -> None:
        """Make ``text``'s font smaller until it is at most ``width`` pixels wide."""
        extent = text.get_window_extent(renderer=self.renderer).width
        if extent > width:
            text.set_fontsize(text.get_fontsize() * width / extent)

    def fill(self, box: Box, color: str, *, edge: str | None = None, alpha: float = 1.0) -> None:
        """A filled rectangle behind everything drawn on axes."""
        from matplotlib.patches import Rectangle

        left, bottom, width, height = self.rect(box)
        self.fig.patches.append(
            Rectangle(
                (left, bottom),
                width,
                height,
                transform=self.fig.transFigure,
                facecolor=color,
                edgecolor=edge or color,
                linewidth=0.8,
                alpha=alpha,
                zorder=-10,  # under the axes (zorder 0) drawn on it
            )
        )

    def save(self, out: Path) -> None:
        """Write the PNG with the package's atomic writer: a reader never sees half a picture."""
        write_atomically_with(out, lambda f: self.fig.savefig(f, format="png", dpi=DPI, facecolor=BACKGROUND))


def fit_text(text: str, width_px: float, font_px: float) -> str:
    """``text`` shortened with an ellipsis to about ``width_px`` at ``font_px`` (average glyph 0.58 em)."""
    room = max(1, int(width_px / (font_px * 0.58)))
    return text if len(text) <= room else text[: max(1, room - 1)] + "…"


def font_points(px: float) -> float:
    """A font size in points for ``px`` pixels at :data:`DPI`."""
    return px * 72 / DPI
