"""The figures' rules (distmb/core/plotting.py): log axes only for spans >= 10x, panels wrapped
into rows, labelled reference lines, and the report's figure built by them."""

from __future__ import annotations

import math

import pytest

from distmb.core.plotting import (
    axis_scale,
    bar_axis,
    grid_shape,
    panels,
    reference_line,
    set_scale,
)


@pytest.mark.parametrize(
    ("values", "scale"),
    [
        ([1.0, 9.99], "linear"),  # < 10x
        ([1.0, 10.0], "log"),  # exactly 10x
        ([0.003, 0.5, 2.0], "log"),
        ([5, 7, None, math.nan, math.inf], "linear"),  # missing and non-finite ignored
        ([0.0, 100.0], "linear"),  # zero or negative: log impossible
        ([-1.0, 50.0], "linear"),
        ([], "linear"),
        ([42.0], "linear"),
    ],
)
def test_axis_scale(values, scale):
    assert axis_scale(values) == scale


@pytest.mark.parametrize(
    ("count", "columns", "shape"),
    [
        (1, 3, (1, 1)),
        (3, 3, (1, 3)),
        (4, 3, (2, 3)),
        (6, 3, (2, 3)),
        (7, 3, (3, 3)),
        (5, 2, (3, 2)),
    ],  # fmt: skip
)
def test_grid_shape_wraps_into_rows(count, columns, shape):
    rows, cols = grid_shape(count, columns)
    assert (rows, cols) == shape
    assert rows * cols >= count > (rows - 1) * cols  # no empty row


def test_grid_shape_refuses_nothing():
    with pytest.raises(ValueError):
        grid_shape(0)


def test_panels_removes_unused_cells_and_sets_scales():
    import matplotlib.pyplot as plt

    fig, axes = panels(4)
    try:
        assert len(axes) == 4 and len(fig.axes) == 4  # the 2x3 grid's two spare cells removed
        assert {ax.get_subplotspec().rowspan.start for ax in axes} == {0, 1}
        assert set_scale(axes[0], [1, 2, 3]) == "linear" and axes[0].get_yscale() == "linear"
        assert set_scale(axes[1], [1, 1000], axis="x") == "log" and axes[1].get_xscale() == "log"
        line = reference_line(axes[2], 1.0, "1x")
        assert line.get_label() == "1x"
    finally:
        plt.close(fig)


def test_bar_axis_is_linear_from_zero_whatever_the_span():
    """Bars 65M and 137M long (2.1x) on an axis set to log first: bar_axis makes it linear
    from 0, so the drawn lengths keep the values' ratio."""
    import matplotlib.pyplot as plt

    fig, (vertical, horizontal) = panels(2)
    try:
        vertical.bar(["a", "b"], [6.5e7, 1.37e8])
        vertical.set_yscale("log")
        bar_axis(vertical)
        assert vertical.get_yscale() == "linear" and vertical.get_ylim()[0] == 0
        assert vertical.get_ylim()[1] >= 1.37e8
        horizontal.barh(["a", "b"], [1.0, 1000.0])  # a span the line rule would draw on log
        horizontal.set_xscale("log")
        bar_axis(horizontal, axis="x")
        assert horizontal.get_xscale() == "linear" and horizontal.get_xlim()[0] == 0
        with pytest.raises(ValueError, match="axis must be 'x' or 'y'"):
            bar_axis(vertical, axis="z")
    finally:
        plt.close(fig)


def test_report_wraps_panels_and_labels_every_line(tmp_path, monkeypatch):
    """distmb.report's figure of a multi-rank, out-of-core run: 5 panels in 2 rows, every
    drawn line in a legend, the loss axis linear (its values span < 10x)."""
    import matplotlib.pyplot as plt

    from distmb.cli import report

    records = [
        {"epoch": e, "loss": 2.0 - 0.3 * e, "train_acc": 0.3 + 0.1 * e, "val_acc": 0.5,
         "test_acc": 0.5, "mbc": 0.1, "load_wait": 0.01, "fwd": 0.2, "bwd": 0.3, "ared": 0.05,
         "opt": 0.01, "eval_time": 0.1, "hec_hit_rate": [None, 0.3, 0.4],
         "feature_cache": {"hit_rate": 0.6, "policy": "lru", "memory_bytes": 2**20}}
        for e in range(4)
    ]  # fmt: skip
    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.append(fig))
    report.plot(records, tmp_path / "r.png", "title")
    (fig,) = figures
    try:
        axes = fig.axes
        assert len(axes) == 5
        assert sorted({ax.get_subplotspec().rowspan.start for ax in axes}) == [0, 1]
        assert axes[0].get_yscale() == "linear"
        for ax in axes[1:]:
            labels = [line.get_label() for line in ax.get_lines()]
            assert labels and not any(label.startswith("_") for label in labels), labels
            assert ax.get_legend() is not None
    finally:
        plt.close(fig)
