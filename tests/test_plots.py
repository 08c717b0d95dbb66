"""Pictures: atomic PNG writes, the epochs.csv reader, and drawing without every column."""

from dlperf.plots import read_epochs_csv, save_figure, training_curves

PNG = b"\x89PNG\r\n\x1a\n"


def test_read_epochs_csv_keeps_the_last_row_of_a_redone_epoch(tmp_path):
    f = tmp_path / "epochs.csv"
    f.write_text("epoch,step,loss,top1\n0,5,2.0,\n1,10,1.5,0.4\n1,10,1.4,0.5\n2,15,1.2,0.6\n")
    rows = read_epochs_csv(f)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert rows[1]["loss"] == 1.4 and rows[1]["top1"] == 0.5  # the resumed run's row
    assert "top1" not in rows[0]  # blank cell: no value, not zero


def test_training_curves_draw_with_missing_columns_and_write_atomically(tmp_path):
    rows = [{"epoch": 0.0, "loss": 2.0, "lr": 0.1, "img_per_s": 100.0},
            {"epoch": 1.0, "loss": 1.0, "lr": 0.05, "img_per_s": 110.0, "top1": 0.5}]
    path = training_curves(rows, tmp_path / "curves.png", title="t")
    assert path.read_bytes()[:8] == PNG
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary left behind
    assert training_curves([], tmp_path / "none.png") is None


def test_save_figure_leaves_no_partial_file_when_drawing_fails(tmp_path):
    class Broken:
        def savefig(self, f, format):
            f.write(b"partial")
            raise RuntimeError("renderer failed")

    target = tmp_path / "x.png"
    try:
        save_figure(Broken(), target)
    except RuntimeError:
        pass
    assert list(tmp_path.iterdir()) == []


def test_validation_scatter_has_a_ratio_panel_and_a_legend_beside_them(tmp_path):
    # twelve groups (more than matplotlib's ten default colours), clean and flagged points:
    # the picture is the log-log scatter and the predicted / measured panel side by side with
    # the legend outside both, so it is far wider than tall (PNG: width, height at 16-24)
    import struct

    from dlperf.plots import predicted_vs_measured

    points = [(f"group {i}", 100.0 * (i + 1), 100.0 * (i + 1) * (1 + 0.01 * i), i % 3 != 0)
              for i in range(12)]
    path = predicted_vs_measured(tmp_path / "v.png", points, "measured", "predicted", "t")
    data = path.read_bytes()
    assert data[:8] == PNG
    width, height = struct.unpack(">II", data[16:24])
    assert width > 2.2 * height
    assert predicted_vs_measured(tmp_path / "none.png", [], "m", "p", "t") is None
