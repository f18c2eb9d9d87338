"""Training-curve plots from Tune trial folders (synthetic progress.csv / result.json)."""

from __future__ import annotations

import argparse
import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from r3_rllib.eval.plot import (
    DEFAULT_METRICS,
    _short_trial_name,
    add_plot_args,
    build_figure,
    find_trial_dirs,
    load_runs,
    plot_runs,
    run_plot,
)

ALL_COLUMNS = [
    "training_iteration",
    "time_total_s",
    "rollout/accuracy",
    "rollout/reward_mean",
    "rollout/zero_adv_frac",
    "rollout/response_len_mean",
    "eval/accuracy",
    "trial_id",
]


def write_progress(
    trial_dir: Path, n_iters: int, slope: float, columns=ALL_COLUMNS, eval_every: int = 2
) -> Path:
    """A progress.csv as Tune writes it: one row per iteration, empty cells for keys a row lacks."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    with open(trial_dir / "progress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for it in range(1, n_iters + 1):
            row = {
                "training_iteration": it,
                "time_total_s": 1.5 * it,
                "rollout/accuracy": min(1.0, slope * it),
                "rollout/reward_mean": slope * it - 0.5,
                "rollout/zero_adv_frac": 1.0 / it,
                "rollout/response_len_mean": 100 + 10 * it,
                "eval/accuracy": slope * it if it % eval_every == 0 else "",
                "trial_id": "abc_00000",
            }
            writer.writerow({k: row[k] for k in columns})
    return trial_dir


def all_axes_text(fig) -> tuple[list[str], list[str], list[str]]:
    axes = fig.get_axes()
    return [a.get_title() for a in axes], [a.get_xlabel() for a in axes], [a.get_ylabel() for a in axes]


@pytest.mark.slow
def test_two_runs_png_and_axes(tmp_path):
    run_a = write_progress(tmp_path / "run_a", 8, 0.1)
    run_b = write_progress(tmp_path / "run_b", 6, 0.05)
    out = plot_runs([run_a, run_b], tmp_path / "figs" / "curves.png")
    assert out == tmp_path / "figs" / "curves.png" and out.is_file()

    import matplotlib.image as mpimg

    img = mpimg.imread(out)
    # 5 metric columns x 4.2 in, 6.6 in tall, at 100 dpi.
    assert img.shape[:2] == (660, 2100)
    assert float(np.var(img[..., :3])) > 1e-3, "the PNG is blank"

    runs = load_runs([run_a, run_b])
    assert [r.label for r in runs] == ["run_a", "run_b"]
    assert "trial_id" not in runs[0].columns  # text columns are dropped
    np.testing.assert_allclose(runs[0].columns["time_total_s"], 1.5 * np.arange(1, 9))
    assert np.isnan(runs[0].columns["eval/accuracy"][0]) and runs[0].columns["eval/accuracy"][
        1
    ] == pytest.approx(0.2)

    fig = build_figure(runs)
    titles, xlabels, ylabels = all_axes_text(fig)
    assert len(fig.get_axes()) == 10
    assert xlabels == ["training_iteration"] * 5 + ["time_total_s"] * 5
    assert (
        ylabels == list(DEFAULT_METRICS[:5]) * 2
    )  # no critic in these runs: its panel is left out, unwarned
    assert titles[0] == "rollout/accuracy vs iteration" and titles[5] == "rollout/accuracy vs time (s)"
    # One line per run in each panel; the sparse eval curve keeps only the rows that have a value.
    top_left = fig.get_axes()[0]
    assert len(top_left.get_lines()) == 2
    eval_line = fig.get_axes()[4].get_lines()[0]
    np.testing.assert_allclose(eval_line.get_xdata(), [2, 4, 6, 8])
    np.testing.assert_allclose(fig.get_axes()[5].get_lines()[1].get_xdata(), 1.5 * np.arange(1, 7))


def test_missing_metric_is_skipped_with_warning(tmp_path):
    cols = ["training_iteration", "time_total_s", "rollout/accuracy"]
    run = write_progress(tmp_path / "run", 4, 0.2, columns=cols)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = build_figure(load_runs([run]))
    skipped = sorted(str(w.message).split("'")[1] for w in caught)
    assert skipped == ["rollout/response_len_mean", "rollout/reward_mean", "rollout/zero_adv_frac"]
    assert [a.get_ylabel() for a in fig.get_axes()] == ["rollout/accuracy", "rollout/accuracy"]


def test_eval_accuracy_absent_is_silent(tmp_path):
    cols = [c for c in ALL_COLUMNS if c != "eval/accuracy"]
    run = write_progress(tmp_path / "run", 4, 0.2, columns=cols)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = build_figure(load_runs([run]))
    assert len(fig.get_axes()) == 8


@pytest.mark.parametrize(
    "columns",
    [
        ("learner/critic_vf_explained_var",),
        ("learner/critic_vf_explained_var", "r3/reward_kl_penalty"),
        ("learner/critic_vf_explained_var", "learner/vespo_phi_mean"),
    ],
)
def test_a_ppo_run_draws_its_critics_explained_variance_and_its_kl_in_the_reward(tmp_path, columns):
    """A PPO run draws its critic's explained variance; with use_kl_in_reward also verl's current_kl, and a VESPO
    run its mean kernel weight (each an optional panel: a run without it draws none)."""
    run = write_progress(tmp_path / "run", 4, 0.2)
    text = (run / "progress.csv").read_text().splitlines()
    rows = [",".join([text[0], *columns])] + [
        ",".join([line, *[f"{0.1 * i}"] * len(columns)]) for i, line in enumerate(text[1:])
    ]
    (run / "progress.csv").write_text("\n".join(rows) + "\n")
    fig = build_figure(load_runs([run]))
    _, _, ylabels = all_axes_text(fig)
    drawn = [
        m
        for m in DEFAULT_METRICS
        if m not in ("r3/reward_kl_penalty", "learner/vespo_phi_mean") or m in columns
    ]
    assert ylabels == drawn * 2


def test_the_accuracy_before_training_starts_the_eval_curve_at_iteration_zero(tmp_path):
    """eval_before_train: the first row's eval_start/accuracy is the eval/accuracy curve's point at iteration 0 and
    time 0, before the periodic evaluations (every 2nd iteration here); a run without it starts at its first one."""
    import csv

    run = write_progress(tmp_path / "run", 4, 0.2)
    rows = list(csv.DictReader(open(run / "progress.csv")))
    for i, row in enumerate(rows):
        row["eval_start/accuracy"] = "0.125" if i == 0 else ""
    with open(run / "progress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plain = write_progress(tmp_path / "plain", 4, 0.2)
    fig = build_figure(load_runs([run, plain]))
    by_axis = {(a.get_ylabel(), a.get_xlabel()): a for a in fig.get_axes()}
    for x_key in ("training_iteration", "time_total_s"):
        started, other = by_axis[("eval/accuracy", x_key)].get_lines()
        assert list(started.get_xdata())[0] == 0.0 and list(started.get_ydata()) == pytest.approx(
            [0.125, 0.4, 0.8]
        )
        assert list(other.get_ydata()) == pytest.approx([0.4, 0.8])
    # Other curves do not get it.
    assert list(by_axis[("rollout/accuracy", "training_iteration")].get_lines()[0].get_xdata()) == [
        1,
        2,
        3,
        4,
    ]


def test_no_metric_at_all_is_clear_error(tmp_path):
    run = write_progress(tmp_path / "run", 3, 0.2, columns=["training_iteration", "time_total_s"])
    with (
        pytest.warns(UserWarning, match="in no run"),
        pytest.raises(
            ValueError, match=r"none of the metrics .* columns there: time_total_s, training_iteration"
        ),
    ):
        plot_runs([run], tmp_path / "x.png", metrics=["rollout/accuracy"])
    assert not (tmp_path / "x.png").exists()


def test_experiment_folder_and_result_json(tmp_path):
    # An experiment folder with two trials; one has only result.json (nested keys), with checkpoints inside.
    exp = tmp_path / "exp"
    long_name = "R3_arith_00000_0_lr=0.001," + "x" * 60 + "_2026-11-22_00-39-45"  # as Tune names trials
    write_progress(exp / long_name, 5, 0.1)
    trial_b = exp / "R3_trial_00001"
    (trial_b / "checkpoint_000000").mkdir(parents=True)
    with open(trial_b / "result.json", "w") as f:
        for it in range(1, 4):
            f.write(
                json.dumps(
                    {"training_iteration": it, "time_total_s": 2.0 * it, "rollout": {"accuracy": 0.3 * it}}
                )
            )
            f.write("\n")
        f.write('{"training_iteration": 4, "rollo')  # a partial line from a killed trial
    assert find_trial_dirs(exp) == [exp / long_name, trial_b]
    with pytest.warns(UserWarning, match="not JSON"):
        runs = load_runs([exp], labels=["grpo"])
    # Labels drop Tune's date suffix and are capped at 60 characters.
    assert [r.label for r in runs] == ["grpo/" + long_name[:57] + "...", "grpo/R3_trial_00001"]
    assert _short_trial_name(Path("R3_a_00001_1_k=2_2026-11-22_00-39-45")) == "R3_a_00001_1_k=2"
    np.testing.assert_allclose(runs[1].columns["rollout/accuracy"], [0.3, 0.6, 0.9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = build_figure(runs, metrics=["rollout/accuracy"])
    lines = fig.get_axes()[1].get_lines()
    np.testing.assert_allclose(lines[1].get_xdata(), [2.0, 4.0, 6.0])


def test_nested_column_suffix_match(tmp_path):
    # Metrics nested one level deeper by the framework are still found by their own name.
    run = write_progress(
        tmp_path / "run", 3, 0.2, columns=["training_iteration", "time_total_s", "rollout/accuracy"]
    )
    text = (run / "progress.csv").read_text().replace("rollout/accuracy", "info/rollout/accuracy")
    (run / "progress.csv").write_text(text)
    fig = build_figure(load_runs([run]), metrics=["rollout/accuracy"])
    np.testing.assert_allclose(fig.get_axes()[0].get_lines()[0].get_ydata(), [0.2, 0.4, 0.6])


def test_bad_paths_and_labels(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_runs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no progress.csv or result.json"):
        load_runs([tmp_path / "empty"])
    run = write_progress(tmp_path / "run", 2, 0.2)
    with pytest.raises(ValueError, match="2 labels given for 1 run folders"):
        load_runs([run], labels=["a", "b"])


def test_cli(tmp_path, capsys):
    run_a = write_progress(tmp_path / "a", 3, 0.2)
    parser = add_plot_args(argparse.ArgumentParser())
    args = parser.parse_args([str(run_a), "--out", str(tmp_path / "c.png"), "--metrics", "rollout/accuracy"])
    assert run_plot(args) == 0 and (tmp_path / "c.png").is_file()
    args = parser.parse_args([str(tmp_path / "missing"), "--out", str(tmp_path / "d.png")])
    assert run_plot(args) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_named_metric_no_run_has_is_warned_about_with_the_columns_there(tmp_path, capsys):
    """`--metrics eval/accuracy` on a run without it: a warning naming the metric and the run's columns, eval/accuracy
    included (only the default list leaves it out quietly: evaluation may be off)."""
    cols = [c for c in ALL_COLUMNS if c != "eval/accuracy"]
    run = write_progress(tmp_path / "run", 4, 0.2, columns=cols)
    parser = add_plot_args(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            str(run),
            "--out",
            str(tmp_path / "c.png"),
            "--metrics",
            "rollout/accuracy,eval/accuracy,rollout/acuracy",
        ]
    )
    assert run_plot(args) == 0 and (tmp_path / "c.png").is_file()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(
        "r3 plot: warning: metric 'eval/accuracy' is in no run; skipping it. Columns there: "
    )
    assert err[0].endswith("rollout/reward_mean, rollout/zero_adv_frac, time_total_s, training_iteration")
    assert err[1].startswith(
        "r3 plot: warning: metric 'rollout/acuracy' is in no run; skipping it (closest: rollout/accuracy"
    )
    assert len(err) == 2
    # The default list: no warning for eval/accuracy.
    args = parser.parse_args([str(run), "--out", str(tmp_path / "d.png")])
    assert run_plot(args) == 0 and capsys.readouterr().err == ""
    with pytest.warns(
        UserWarning, match=r"'eval/accuracy' is in no run; skipping it\. Columns there: rollout/"
    ):
        build_figure(load_runs([run]), metrics=["rollout/accuracy", "eval/accuracy"], optional=frozenset())


def test_warnings_not_the_plots_keep_their_usual_route(tmp_path, capsys, monkeypatch):
    """Only the plot's own warnings (UserWarning) become "r3 plot: warning" lines: a ResourceWarning of an object
    that another part of the process left behind, collected while the plot ran, goes the usual way (Python's
    filters; pytest records it here), not onto the command's stderr."""
    import r3_rllib.eval.plot as plot_module

    run = write_progress(tmp_path / "run", 3, 0.2)
    real = plot_module.plot_runs

    def plot_runs(*args, **kwargs):
        warnings.warn(
            "unclosed event loop <_UnixSelectorEventLoop debug=False>", ResourceWarning, stacklevel=1
        )
        warnings.warn("a column of the plot's own", UserWarning, stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(plot_module, "plot_runs", plot_runs)
    args = add_plot_args(argparse.ArgumentParser()).parse_args([str(run), "--out", str(tmp_path / "e.png")])
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        assert run_plot(args) == 0
    assert capsys.readouterr().err == "r3 plot: warning: a column of the plot's own\n"
