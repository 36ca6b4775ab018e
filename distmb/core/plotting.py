"""The figures' shared rules (``distmb.report`` and ``benchmarks/*.py``):

- panels wrap into rows of at most :data:`MAX_COLUMNS` (:func:`grid_shape`, :func:`panels`),
  laid out by matplotlib's constrained layout, so titles, tick labels and legends do not
  overlap;
- an axis is logarithmic only when its positive values span at least :data:`LOG_SPAN`
  (10x), else linear (:func:`axis_scale`, :func:`set_scale`);
- bars are read by their lengths, so a bar's value axis is linear and starts at zero
  whatever its values span (:func:`bar_axis`): on a log or cut axis a 2x difference can be
  drawn as any ratio of lengths;
- every reference line has a legend label (:func:`reference_line`);
- long category labels are rotated (:func:`rotate_labels`).

matplotlib is imported only inside the functions that draw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

#: Most panels side by side; more wrap into further rows.
MAX_COLUMNS = 3
#: Smallest max/min ratio of an axis's positive values drawn on a log scale.
LOG_SPAN = 10.0
#: Width and height of one panel, inches.
PANEL_SIZE = (5.0, 4.0)

Scale = Literal["linear", "log"]


def axis_scale(values: Iterable[float | None]) -> Scale:
    """``"log"`` when the finite values are all > 0 and ``max / min >= LOG_SPAN``, else
    ``"linear"`` (``None``, NaN and infinities are ignored; no values: linear)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite or min(finite) <= 0:
        return "linear"
    return "log" if max(finite) / min(finite) >= LOG_SPAN else "linear"


def set_scale(ax: Any, values: Iterable[float | None], axis: str = "y") -> Scale:
    """Set ``ax``'s ``axis`` (``"x"`` or ``"y"``) to :func:`axis_scale` of ``values``;
    returns the scale."""
    scale = axis_scale(values)
    (ax.set_yscale if axis == "y" else ax.set_xscale)(scale)
    return scale


def bar_axis(ax: Any, axis: str = "y", end: float | None = None) -> None:
    """Make ``ax``'s value axis of bars (``"y"`` for vertical bars, ``"x"`` for horizontal
    ones) linear from zero; call it after drawing the bars.

    Args:
        end: the axis's far end, in data units (e.g. room above the bars for a legend or
            labels); default: matplotlib's.

    Raises:
        ValueError: ``axis`` is neither ``"x"`` nor ``"y"``.
    """
    if axis == "y":
        ax.set_yscale("linear")
        ax.set_ylim(bottom=0, top=end)
    elif axis == "x":
        ax.set_xscale("linear")
        ax.set_xlim(left=0, right=end)
    else:
        raise ValueError(f"bar_axis: axis must be 'x' or 'y', got {axis!r}")


def grid_shape(count: int, max_columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """``(rows, columns)`` of ``count`` panels wrapped into rows of at most ``max_columns``
    (``count >= 1``)."""
    if count < 1 or max_columns < 1:
        raise ValueError(f"grid_shape: need count >= 1 and max_columns >= 1, got {count}")
    columns = min(count, max_columns)
    return -(-count // columns), columns


def panels(
    count: int,
    max_columns: int = MAX_COLUMNS,
    panel_size: tuple[float, float] = PANEL_SIZE,
) -> tuple[Any, list[Any]]:
    """A figure of ``count`` panels in :func:`grid_shape` rows (constrained layout; unused
    cells of the last row removed).

    Returns:
        ``(figure, axes)``, ``len(axes) == count``, row by row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, columns = grid_shape(count, max_columns)
    fig, grid = plt.subplots(
        rows,
        columns,
        figsize=(panel_size[0] * columns, panel_size[1] * rows),
        squeeze=False,
        layout="constrained",
    )
    axes = list(grid.flat)
    for ax in axes[count:]:
        ax.remove()
    return fig, axes[:count]


def reference_line(ax: Any, y: float, label: str, **style: Any) -> Any:
    """A horizontal reference line at ``y`` with a legend ``label`` (grey dotted unless
    ``style`` says otherwise)."""
    style = {"color": "grey", "linestyle": ":", "linewidth": 1.0, **style}
    return ax.axhline(y, label=label, **style)


def rotate_labels(ax: Any, degrees: float = 30.0) -> None:
    """Rotate the x tick labels (right-aligned), for long category names."""
    for label in ax.get_xticklabels():
        label.set_rotation(degrees)
        label.set_horizontalalignment("right")
