"""What the dashboard's panels hold: rewards only on reward axes, and a note for a quantity the run switched off."""

import json

import pytest

from reinforge_report import Thresholds, load_metrics, write_report
from reinforge_report.page import metric_summary
from reinforge_report.plot import dashboard_panels

STEPS = 6


def demo_like_run(tmp_path, *, kl=0.0, clip_frac=0.0, algorithm=None, dims=("correct", "format", "concise")):
    """The shape of the README demo's metrics: `length_penalty` (dimension `concise`) logs its `length` metric too."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = []
    for step in range(1, STEPS + 1):
        line = {"kind": "train", "step": step, "reward/mean": 0.1 * step, "reward/std": 0.2}
        for dim in dims:
            line[f"reward/{dim}/mean"] = 0.5 + 0.01 * step
            line[f"reward/{dim}/std"] = 0.1
        line["reward/concise/length/mean"] = 30.0 - step  # characters: what the judge measured, not a reward
        line["reward/concise/length/std"] = 4.0
        line.update({"response_length/mean": 12.0 - step, "kl": kl, "clip_frac": clip_frac, "loss": 0.1})
        lines.append(line)
    lines.append({"kind": "eval", "step": STEPS, "reward/mean": 0.5, "reward/concise/length/mean": 20.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if algorithm is not None:
        (run_dir / "config.json").write_text(json.dumps({"algorithm": algorithm}))
    return run_dir


def config_of(run_dir):
    path = run_dir / "config.json"
    return json.loads(path.read_text()) if path.exists() else None


def panels(run_dir):
    return dashboard_panels(load_metrics(run_dir), Thresholds(), config_of(run_dir))


def keys_by_title(run_dir):
    return {p.title: [line.key for line in p.lines] for p in panels(run_dir)}


def test_a_judge_metric_is_not_a_reward_dimension_and_gets_no_reward_panel(tmp_path):
    run_dir = demo_like_run(tmp_path)
    data = load_metrics(run_dir)
    assert data.dimensions() == ["correct", "format", "concise"]
    assert data.judge_metrics() == ["concise/length"]
    shown = keys_by_title(run_dir)
    assert "Reward dimension: concise/length" not in shown
    assert shown["Reward dimension: concise"] == ["reward/concise/mean"]
    assert shown["Response length"] == ["response_length/mean"]
    assert not any("reward/concise/length/mean" in keys for keys in shown.values())


def test_many_dimensions_share_a_panel_without_the_judge_metrics(tmp_path):
    run_dir = demo_like_run(tmp_path, dims=("concise", *(f"d{i}" for i in range(7))))
    (shared,) = [p for p in panels(run_dir) if p.title == "Reward dimensions"]
    assert {line.key for line in shared.lines} == {"reward/concise/mean", *(f"reward/d{i}/mean" for i in range(7))}


def test_the_metrics_table_gives_a_judge_metric_no_best(tmp_path):
    rows = {(r["kind"], r["metric"]): r for r in metric_summary(load_metrics(demo_like_run(tmp_path)))}
    assert "best" not in rows["train", "reward/concise/length/mean"]  # the longest reply is not the best
    assert "best" not in rows["validation", "reward/concise/length/mean"]
    assert rows["train", "reward/concise/mean"]["best_step"] == STEPS
    assert "best" in rows["train", "reward/mean"]


OFF = [
    ({"kl_coef": 0}, "KL divergence to reference", "off: kl_coef is 0 (no KL term in the loss)"),
    ({"kl_coef": 0.0, "ppo_epochs": 1}, "PPO clip fraction", "off: ppo_epochs is 1 (one update per batch"),
    ({}, "KL divergence to reference", "off: 0 at every step and kl_coef is not set"),
    (None, "PPO clip fraction", "off: 0 at every step and ppo_epochs is not set"),  # no config.json
]


@pytest.mark.parametrize(("algorithm", "title", "note"), OFF)
def test_a_switched_off_quantity_says_so_instead_of_a_flat_zero(tmp_path, algorithm, title, note):
    (panel,) = [p for p in panels(demo_like_run(tmp_path, algorithm=algorithm)) if p.title == title]
    assert panel.off is not None and panel.off.startswith(note)
    assert panel.lines == []


@pytest.mark.parametrize(
    ("values", "algorithm"),
    [
        ({"kl": 0.0}, {"kl_coef": 0.05}),  # on: a KL of zero is a measurement
        ({"kl": 0.01}, {"kl_coef": 0}),  # a backend that logs KL anyway: draw what it logged
        ({"clip_frac": 0.0}, {"ppo_epochs": 4}),
        ({"clip_frac": 0.003}, {"ppo_epochs": 1}),  # stale samples: clipping happens with one epoch
    ],
)
def test_a_quantity_that_is_on_or_not_zero_is_drawn(tmp_path, values, algorithm):
    (key,) = values
    drawn = {p.title: p for p in panels(demo_like_run(tmp_path, algorithm=algorithm, **values))}
    (panel,) = [p for p in drawn.values() if [line.key for line in p.lines] == [key]]
    assert panel.off is None


def test_the_dashboard_draws_the_note_and_no_line_on_an_off_panel(tmp_path):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from reinforge_report.plot import _draw_panel

    run_dir = demo_like_run(tmp_path, algorithm={"kl_coef": 0})
    (panel,) = [p for p in panels(run_dir) if p.title == "KL divergence to reference"]
    fig, ax = plt.subplots()
    try:
        _draw_panel(ax, panel, load_metrics(run_dir), [], (0, STEPS))
        assert len(ax.lines) == 0 and len(ax.collections) == 0  # no line, no band
        assert [t.get_text().replace("\n", " ") for t in ax.texts] == ["off: kl_coef is 0 (no KL term in the loss)"]
    finally:
        plt.close(fig)
    assert write_report(run_dir).png.stat().st_size > 0
