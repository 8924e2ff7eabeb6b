"""`lox plot`'s axes and labels: --logy, --ylim, --label, the default y limits that a diverged
run does not blow up, non-finite values, and runs chosen from the table of runs by --where and
--best (lox_backends/tools/plot.py; its other options are tested through the command in
test_cli.py)."""

import warnings

import matplotlib
import numpy as np
import pytest

import lox
from lox_backends.tools.cli import main
from lox_backends.tools.plot import PlotNote, default_ylim, plot_figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend that needs no display

STEPS = np.arange(100)


def save_runs(folder, runs: dict[str, tuple[np.ndarray, dict]]):
    """One run per name, logging `loss` (its values against STEPS) with its metadata."""
    logger = lox.loggers.SaveLogger(folder)
    for name, (loss, metadata) in runs.items():
        state = logger.init(name=name, **metadata)
        logger.log(state, lox.logdict({"loss": np.asarray(loss, float)}, {"step": {"loss": STEPS[:len(loss)]}}))
        logger.finish(state)
    logger.close()


def figure_of(*args, **kwargs):
    """plot_figure's figure, closed once read; the PlotNote warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlotNote)
        figure = plot_figure(*args, **kwargs)
    plt.close(figure)
    return figure, [str(w.message) for w in caught if issubclass(w.category, PlotNote)]


def legend(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


def curves(figure) -> dict[str, object]:
    """The drawn curves by label (those left out of the legend start with "_"), not the edge marks."""
    return {line.get_label(): line for line in figure.axes[0].get_lines() if line.get_label() != "_leaves"}


def edge_marks(figure) -> list[tuple[str, float, float, str]]:
    return [(line.get_marker(), float(line.get_xdata()[0]), float(line.get_ydata()[0]), line.get_color())
            for line in figure.axes[0].get_lines() if line.get_label() == "_leaves"]


def cli(capsys, *args):
    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def decaying(start=3.0, end=0.1, rate=0.05, n=100):
    return end + (start - end) * np.exp(-rate * np.arange(n))


# --- --logy and --ylim ----------------------------------------------------------------------

def test_logy_forces_the_scale_and_refuses_values_at_or_below_zero(tmp_path):
    save_runs(tmp_path / "pos", {"a": (decaying(), {})})
    assert figure_of(tmp_path / "pos")[0].axes[0].get_yscale() == "log"  # positive: log by default
    assert figure_of(tmp_path / "pos", logy=False)[0].axes[0].get_yscale() == "linear"
    # A NaN or an infinite value does not turn the default log scale off (it is a gap, or leaves the plot).
    with_nan = decaying()
    with_nan[[10, 20]] = [np.nan, np.inf]
    save_runs(tmp_path / "nan", {"a": (with_nan, {})})
    assert figure_of(tmp_path / "nan")[0].axes[0].get_yscale() == "log"
    reward = np.r_[np.linspace(1.0, 0.5, 50), -np.linspace(0.25, 1.0, 50)]  # at or below 0 from step 50
    save_runs(tmp_path / "signed", {"ok": (decaying(), {}), "reward": (reward, {})})
    assert figure_of(tmp_path / "signed")[0].axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match=r"^a log y axis \(--logy\) cannot show values <= 0, and reward has -0\.25 "
                                         r"at step 50; plot on a linear axis \(--no-logy\), or leave the run out "
                                         r"\(--run, --where\)\.$"):
        figure_of(tmp_path / "signed", logy=True)
    figure, _ = figure_of(tmp_path / "signed", logy=True, runs=["ok"])
    assert figure.axes[0].get_yscale() == "log"


def test_ylim_sets_the_limits_and_bad_limits_are_refused(tmp_path):
    save_runs(tmp_path / "runs", {"a": (decaying(), {}), "b": (decaying(start=5.0), {})})
    figure, notes = figure_of(tmp_path / "runs", ylim=(0.5, 2.0))
    axes = figure.axes[0]
    assert axes.get_ylim() == (0.5, 2.0) and axes.get_yscale() == "log" and notes == []
    # Both curves start above 2 and end below 0.5: each is marked where it first leaves, on that edge.
    a, b = decaying(), decaying(start=5.0)
    assert sorted(edge_marks(figure)) == sorted([
        ("^", 0.0, 2.0, "C0"), ("v", float(np.argmax(a < 0.5)), 0.5, "C0"),
        ("^", 0.0, 2.0, "C1"), ("v", float(np.argmax(b < 0.5)), 0.5, "C1"),
    ])
    # Limits at or below 0 make the default scale linear; a log axis refuses them.
    assert figure_of(tmp_path / "runs", ylim=(-1, 4))[0].axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match=r"^a log y axis \(--logy\) cannot start at -1: give --ylim a LO above 0, "
                                         r"or plot on a linear axis \(--no-logy\)\.$"):
        figure_of(tmp_path / "runs", ylim=(-1, 4), logy=True)
    for bad in ((2.0, 2.0), (3.0, 1.0), (0.0, float("inf")), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match=r"^the y limits \(--ylim LO HI\) must be finite with LO below HI, "
                                             rf"got {bad[0]:g} {bad[1]:g}\.$"):
            figure_of(tmp_path / "runs", ylim=bad)
    with pytest.raises(ValueError, match=r"^the y limits \(--ylim LO HI\) are two numbers, got \('a', 1\)\.$"):
        figure_of(tmp_path / "runs", ylim=("a", 1))


# --- --label: colours and legend by a metadata value ----------------------------------------

def test_label_gives_one_colour_and_legend_entry_per_metadata_value(tmp_path):
    runs = {  # the learning rates out of order, two runs sharing one, one run without it
        "r10": (decaying(rate=0.10), {"config": {"lr": 10, "opt": "sgd"}}),
        "r9a": (decaying(rate=0.09), {"config": {"lr": 9, "opt": "adam"}}),
        "bare": (decaying(rate=0.02), {"seed": 1}),
        "r9b": (decaying(rate=0.08), {"config": {"lr": 9, "opt": "adam"}}),
    }
    save_runs(tmp_path / "runs", runs)
    figure, _ = figure_of(tmp_path / "runs", label="config.lr")
    axes = figure.axes[0]
    assert legend(figure) == ["9", "10", "not set"]  # numbers in numeric order, runs without the key last
    assert axes.get_legend().get_title().get_text() == "config.lr"
    lines = curves(figure)
    assert set(lines) == {"9", "_r9b", "10", "not set"}  # r9b shares 9's entry: named, out of the legend
    assert lines["9"].get_color() == lines["_r9b"].get_color() == "C0" and lines["10"].get_color() == "C1"
    assert lines["not set"].get_color() == "grey"
    np.testing.assert_array_equal(lines["9"].get_ydata(), runs["r9a"][0])
    np.testing.assert_array_equal(lines["_r9b"].get_ydata(), runs["r9b"][0])
    np.testing.assert_array_equal(lines["not set"].get_ydata(), runs["bare"][0])
    # Strings in their order; a key's last part names it where no other key ends so.
    figure, _ = figure_of(tmp_path / "runs", label="opt", runs=["r10", "r9a", "r9b"])
    assert legend(figure) == ["adam", "sgd"] and figure.axes[0].get_legend().get_title().get_text() == "config.opt"
    with pytest.raises(LookupError, match=r"^no run plotted from .* has the metadata key 'config\.momentum' "
                                          r"\(--label\); their metadata keys are: config\.lr, config\.opt, name, seed "
                                          r"\(nested keys joined with dots, e\.g\. config\.lr\)\.$"):
        figure_of(tmp_path / "runs", label="config.momentum")


def test_label_spreads_many_values_along_a_colour_map(tmp_path):
    save_runs(tmp_path / "runs", {f"lr{i}": (decaying(rate=0.01 * (i + 1)), {"lr": 0.01 * (i + 1)})
                                  for i in range(12)})
    figure, _ = figure_of(tmp_path / "runs", label="lr")
    assert legend(figure) == [str(0.01 * (i + 1)) for i in range(12)]
    colours = [line.get_color() for line in curves(figure).values()]
    assert len(set(colours)) == 12  # twelve values, twelve colours (the ten cycled ones would repeat)
    assert colours[0] == matplotlib.colors.to_hex(matplotlib.colormaps["viridis"](0.0))
    assert colours[-1] == matplotlib.colors.to_hex(matplotlib.colormaps["viridis"](1.0))


# --- default limits: a diverged run --------------------------------------------------------

def test_a_diverged_run_leaves_the_plot_instead_of_flattening_the_others(tmp_path):
    normal = {f"seed-{i}": decaying(start=3.0 + i, end=0.1 + 0.05 * i) for i in range(3)}
    diverged = decaying(start=3.0).copy()
    diverged[60:] = 2e36  # a loss that blew up at step 60
    diverged[70] = np.inf
    diverged[71] = np.nan
    save_runs(tmp_path / "runs", {**{name: (loss, {}) for name, loss in normal.items()},
                                  "seed-3": (diverged, {})})
    figure, notes = figure_of(tmp_path / "runs")
    axes = figure.axes[0]
    low, high = axes.get_ylim()
    assert axes.get_yscale() == "log"
    # Every value of the normal runs, and of the diverged one before step 60, is inside; the limits hug them
    # (within the 5 % padding, in decades), where matplotlib's own would reach 2e36.
    shown = np.concatenate([*normal.values(), diverged[:60]])
    assert low <= shown.min() and high >= shown.max()
    assert np.log10(high / shown.max()) < 0.1 and np.log10(shown.min() / low) < 0.1
    # The diverged run is drawn whole, and marked where it leaves the plot, on the top edge, in its colour.
    np.testing.assert_array_equal(curves(figure)["seed-3"].get_ydata(), diverged)
    assert edge_marks(figure) == [("^", 60.0, high, "C3")]
    assert notes == [f"the y axis shows {low:.3g} to {high:.3g}, where most values are; these curves leave it: "
                     "seed-3 (up to inf, from step 60). Choose the limits with --ylim LO HI."]


def test_default_limits_leave_out_only_values_far_from_the_rest():
    # A loss falling fast by almost 4 decades (9 to 0.001) is shown whole: nothing is far, matplotlib's limits are
    # kept. A value 11 decades above most is not: the limits are those of the rest, padded by 5 % in decades.
    fast = 0.001 + 9 * np.exp(-np.arange(1000) / 5.0)
    assert default_ylim([fast, fast * 1.05], log=True) is None
    low, high = np.log10(fast.min()), np.log10(fast.max() * 1.05)
    pad = 0.05 * (high - low)
    np.testing.assert_allclose(default_ylim([fast, np.r_[fast[:-1], 1e8] * 1.05], log=True),
                               (10 ** (low - pad), 10 ** (high + pad)), rtol=1e-12)
    # By hand, on a log axis: values 3, 1, 0.5 and 3, 1, 2e36 (each curve weighing the same). The middle half
    # spans log10 1 = 0 to log10 3; the reach is 4 decades beyond it, which 2e36 is far past: the limits are 0.5
    # to 3, padded by 5 % of that span in decades.
    span = np.log10(3) - np.log10(0.5)
    expected = (10 ** (np.log10(0.5) - 0.05 * span), 10 ** (np.log10(3) + 0.05 * span))
    np.testing.assert_allclose(default_ylim([np.array([3.0, 1.0, 0.5]), np.array([3.0, 1.0, 2e36])], log=True),
                               expected, rtol=1e-12)
    # On a linear axis, a reward from -1 to 1 with one run diving to -1e30: out, the rest whole.
    rewards = [np.linspace(-1, 1, 50), np.linspace(-0.5, 1, 50), np.r_[np.linspace(-1, 1, 40), [-1e30] * 10]]
    np.testing.assert_allclose(default_ylim(rewards), (-1.1, 1.1), rtol=1e-12)
    # Each curve weighs the same: a run logging more often, diverged for most of its points, is still left out
    # (60 % of all points are at 1e30, but only 15 % of the weight).
    long_run = np.r_[np.linspace(2.0, 1.0, 400), [1e30] * 600]
    short_runs = [np.linspace(2.0, 1.0, 10) for _ in range(3)]
    low, high = default_ylim([*short_runs, long_run], log=True)
    np.testing.assert_allclose((low, high), (10 ** (-0.05 * np.log10(2)), 10 ** (1.05 * np.log10(2))), rtol=1e-12)
    # Only non-finite values, or none: nothing to reckon from.
    assert default_ylim([np.array([np.nan, np.inf])]) is None and default_ylim([]) is None


# --- the command line -------------------------------------------------------------------------

def test_the_command_takes_logy_ylim_label_and_notes_a_diverged_run(capsys, tmp_path):
    diverged = decaying()
    diverged[50:] = 1e30
    save_runs(tmp_path / "runs", {"a": (decaying(), {"lr": 0.1}), "b": (decaying(start=4.0), {"lr": 0.1}),
                                  "c": (decaying(start=5.0), {"lr": 0.2}), "d": (diverged, {"lr": 1.0})})
    output = tmp_path / "out.png"
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--label", "lr", "-o", str(output))
    assert (status, out) == (0, f"{output}\n")
    assert err.startswith("lox plot: note: the y axis shows ") and err.endswith(
        "these curves leave it: d (up to 1e+30, from step 50). Choose the limits with --ylim LO HI.\n")
    with open(output, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # Limits chosen: no note.
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--logy", "--ylim", "0.01", "1e31",
                           "-o", str(output))
    assert (status, out, err) == (0, f"{output}\n", "")
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--no-logy", "--ylim", "1", "0", "-o", str(output))
    assert (status, out) == (2, "") and err == (
        "lox plot: error: the y limits (--ylim LO HI) must be finite with LO below HI, got 1 0.\n")
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--label", "momentum")
    assert status == 2 and err.startswith("lox plot: error: no run plotted from ")
    assert "has the metadata key 'momentum' (--label); their metadata keys are: lr, name (nested keys" in err


def test_help_says_what_the_new_options_do(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--logy, --no-logy a log y axis (refused where a value is <= 0), or with --no-logy a linear one "
            "(default: log where every finite value is positive)") in text
    assert ("--ylim LO HI the y axis' limits (default: those of most values; a curve far from the rest, such as a "
            "diverged run, leaves the plot, marked on its edge and named on stderr)") in text
    assert ("--label KEY colour and label the curves by this metadata key's value, one colour per value (nested "
            "keys with dots, e.g. config.lr)") in text
    assert ("--where CONDITION plot only the runs whose row in the table of runs (lox runs) meets this, e.g. "
            "\"lr < 0.1 and status == 'finished'\"") in text
    assert "--best N COLUMN plot only the N runs of least COLUMN in the table of runs, e.g. --best 3 loss.min" in text


# --- --where and --best: runs chosen by the table of runs -------------------------------------

def test_where_and_best_choose_the_runs_a_by_hand_reading_of_their_values_chooses(capsys, tmp_path):
    rng = np.random.default_rng(3)
    lrs = [0.3, 0.001, 0.05, 0.01, 1.0, 0.002]
    losses = {f"lr{lr}": decaying(start=3.0, end=rng.uniform(0.05, 1.0), rate=0.05) for lr in lrs}
    save_runs(tmp_path / "runs", {name: (loss, {"config": {"lr": lr}}) for (name, loss), lr in zip(losses.items(),
                                                                                                   lrs, strict=True)})
    by_lr = dict(zip(losses, lrs, strict=True))

    def plotted(**kwargs):
        return list(curves(figure_of(tmp_path / "runs", **kwargs)[0]))

    assert plotted(where="lr < 0.04") == [name for name in losses if by_lr[name] < 0.04]  # oldest first
    least = sorted(losses, key=lambda name: losses[name].min())
    assert plotted(best=(3, "loss.min")) == least[:3]  # best first
    among_small = [name for name in least if by_lr[name] <= 0.05]
    assert plotted(where="config.lr <= 0.05", best=(2, "loss.min")) == among_small[:2]
    assert plotted(best=(2, "loss.min"), runs=least[1:]) == least[1:3]  # --run narrows them too
    # With --label: the chosen runs only, their values in the legend.
    figure, _ = figure_of(tmp_path / "runs", best=(2, "loss.min"), label="lr")
    assert legend(figure) == sorted((str(by_lr[name]) for name in least[:2]), key=float)
    # What chooses nothing, or cannot be read, is an error naming it.
    with pytest.raises(LookupError, match=r"^no run under .* matches --where 'lr > 5'; `lox runs .*` shows the "
                                          r"runs' columns and values\.$"):
        figure_of(tmp_path / "runs", where="lr > 5")
    with pytest.raises(ValueError, match=r"best: the runs have no column 'acc\.max'; their columns are run_id, "):
        figure_of(tmp_path / "runs", best=(2, "acc.max"))
    # The command line.
    output = tmp_path / "best.png"
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--where", "lr < 0.5", "--best", "2", "loss.min",
                           "-o", str(output))
    assert (status, out, err) == (0, f"{output}\n", "")
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--best", "two", "loss.min")
    assert (status, out) == (2, "") and err == (
        "lox plot: error: --best takes how many runs and a column, e.g. --best 3 loss.min; got 'two' runs.\n")


# --- kinds that are not curves ------------------------------------------------------------------

def save_media_run(folder):
    """A run logging a loss, an image, a histogram and a text at steps 0..2."""
    logger = lox.loggers.SaveLogger(folder)
    state = logger.init(name="media")
    steps = np.arange(3)
    counts, edges = np.ones((3, 2), np.int32), np.tile(np.array([0.0, 0.5, 1.0]), (3, 1))
    logger.log(state, lox.logdict(
        {"loss": np.array([3.0, 2.0, 1.0]), "img": lox.image(np.zeros((3, 4, 4, 1), np.uint8)),
         "h": lox.histogram(np.zeros(1), bins=2).replace_arrays([counts, edges])},
        {"step": {"loss": steps, "img": steps, "h": steps}}))
    logger.log(state, {"note": "hello"}, step=2)
    logger.finish(state)
    logger.close()


def test_media_and_text_are_left_out_with_a_note_and_asking_for_one_is_an_error(capsys, tmp_path):
    save_media_run(tmp_path / "runs")
    figure, notes = figure_of(tmp_path / "runs", logy=False)
    assert notes == ["left out, not curves: img (image), h (histogram), note (text)"]
    (line,) = curves(figure).values()
    assert line.get_ydata().tolist() == [3.0, 2.0, 1.0]
    output = tmp_path / "loss.png"
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "-o", str(output))
    assert (status, out) == (0, f"{output}\n")
    assert err == "lox plot: note: left out, not curves: img (image), h (histogram), note (text)\n"
    for key, what in (("img", "an image (logged as lox.image(...))"), ("h/counts", "a histogram"),
                      ("note", "text")):
        status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--key", key)
        assert status == 2 and err.startswith(f"lox plot: error: {key!r} holds {what}")
        assert err.endswith("which lox plot does not draw as a curve; see it in a tracker (TensorBoard, W&B...) "
                            "or read it with lox.load. The keys lox plot draws: loss.\n")
