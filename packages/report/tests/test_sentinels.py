"""Live sentinels: the report's checks as observers, driven through the hooks with scripted metric sequences."""

from types import SimpleNamespace

import pytest
from report_testlib import divergence, entropy_collapse, healthy, length_explosion, records

import reinforge_report.plugin
from reinforge.plugin import ConfigError, RunContext
from reinforge_report import DIVERGENCE, ENTROPY, LENGTH, SentinelSettings, Thresholds
from reinforge_report.observers import STATE_KEY
from reinforge_report.sentinels import Sentinel, load_sentinel_settings


@pytest.fixture
def pm(reinforge_pm):
    reinforge_pm.register(reinforge_report.plugin, name="reinforge-report")
    return reinforge_pm


def new_run(sentinels=None, *, source="run.yaml", kind="tune"):
    return RunContext(config=SimpleNamespace(sections={"sentinels": sentinels}, source=source), kind=kind)


def drive(pm, run, pattern, *, kinds=("train", "eval"), **kw):
    """Send a synthetic run's records through ``on_step_end``; the step at which a stop was first requested."""
    pm.hook.on_run_start(run=run)
    stopped_at = None
    for record in (r for r in records(pattern, **kw) if r["kind"] in kinds):
        metrics = {k: v for k, v in record.items() if k not in ("kind", "step")}
        pm.hook.on_step_end(step=record["step"], metrics=metrics, kind=record["kind"], run=run)
        if stopped_at is None and run.stop_requested:
            stopped_at = record["step"]
    return stopped_at


def sentinel_lines(err):
    return [line for line in err.splitlines() if line.startswith("reinforge: sentinel: ")]


# -- settings ---------------------------------------------------------------------------------------------------


def test_settings_default_when_the_run_file_has_no_sentinels_key():
    for data in (None, {}):
        settings = load_sentinel_settings(data, where="run.yaml")
        assert settings == SentinelSettings(enabled=True, halt=False, every=1, thresholds={})
        assert settings.detector_thresholds() == Thresholds()


def test_threshold_overrides_become_thresholds_with_whole_numbers_as_ints():
    settings = load_sentinel_settings(
        {"halt": True, "every": 5, "thresholds": {"length_window": 6, "entropy_floor": 0}}, where="run.yaml"
    )
    th = settings.detector_thresholds()
    assert th == Thresholds(length_window=6, entropy_floor=0.0)
    assert isinstance(th.length_window, int) and settings.halt and settings.every == 5


@pytest.mark.parametrize(
    ("data", "key", "hint"),
    [
        ({"hlat": True}, "sentinels.hlat", "halt"),
        ({"halt": "yes"}, "sentinels.halt", "true or false"),
        ({"every": 0}, "sentinels.every", "at least 1"),
        ({"every": 2.5}, "sentinels.every", "integer"),
        ({"thresholds": {"entropy_flor": 0.1}}, "sentinels.thresholds.entropy_flor", "entropy_floor"),
        ({"thresholds": {"entropy_floor": -1}}, "sentinels.thresholds.entropy_floor", ">= 0"),
        ({"thresholds": {"length_window": 1}}, "sentinels.thresholds.length_window", ">= 2"),
        ({"thresholds": {"min_consecutive": 1.5}}, "sentinels.thresholds.min_consecutive", "whole number"),
        ({"thresholds": {"entropy_floor": "low"}}, "sentinels.thresholds.entropy_floor", "number"),
        ([1, 2], "sentinels", "mapping"),
    ],
)
def test_bad_settings_name_the_file_and_the_dotted_key(data, key, hint):
    with pytest.raises(ConfigError) as info:
        load_sentinel_settings(data, where="run.yaml")
    message = str(info.value)
    assert message.startswith("run.yaml: ") and key in message and hint in message


def test_bad_settings_stop_the_run_at_its_start(pm):
    run = new_run({"hlat": True}, source="runs/run.yaml")
    with pytest.raises(ConfigError, match=r"^runs/run.yaml: .*sentinels\.hlat"):
        pm.hook.on_run_start(run=run)
    run = new_run({"every": 0}, source=None)  # a run built in Python: the message says so
    with pytest.raises(ConfigError, match=r"^tune\(\): .*sentinels\.every"):
        pm.hook.on_run_start(run=run)


# -- halting and printing ---------------------------------------------------------------------------------------


def test_entropy_collapse_with_halt_requests_a_stop_naming_the_warning(pm, capsys):
    run = new_run({"halt": True})
    stopped_at = drive(pm, run, entropy_collapse)
    # 1.2 * exp(-t/6) is below 15 % of its initial value from step 12 on; two consecutive points are needed
    assert stopped_at is not None and 12 <= stopped_at <= 16
    assert run.stop_reason.startswith(f"sentinel {ENTROPY}: entropy fell to ")
    lines = sentinel_lines(capsys.readouterr().err)
    assert len(lines) == 1  # the collapse goes on to the last step, but is new only once
    assert lines[0].startswith(f"reinforge: sentinel: {ENTROPY} at steps ")


def test_entropy_collapse_without_halt_only_prints(pm, capsys):
    run = new_run({"halt": False})
    assert drive(pm, run, entropy_collapse) is None
    assert not run.stop_requested and run.stop_reason is None
    lines = sentinel_lines(capsys.readouterr().err)
    assert len(lines) == 1 and ENTROPY in lines[0] and "exploration has stopped" in lines[0]


def test_train_validation_divergence_with_halt_requests_a_stop(pm, capsys):
    run = new_run({"halt": True})
    stopped_at = drive(pm, run, divergence)
    # validation peaks at step 15 and falls after; the evaluations at 20, 25... show it
    assert stopped_at is not None and 20 <= stopped_at <= 35
    assert run.stop_reason.startswith(f"sentinel {DIVERGENCE}: training reward/mean +")
    assert "validation" in run.stop_reason
    lines = sentinel_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"reinforge: sentinel: {DIVERGENCE} at steps ")


def test_train_validation_divergence_without_halt_only_prints(pm, capsys):
    run = new_run({})
    assert drive(pm, run, divergence) is None
    assert not run.stop_requested
    assert [DIVERGENCE in line for line in sentinel_lines(capsys.readouterr().err)] == [True]


def test_length_growth_is_watched_too(pm, capsys):
    run = new_run({"halt": True})
    assert drive(pm, run, length_explosion) is not None
    assert run.stop_reason.startswith(f"sentinel {LENGTH}: response length +")


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_healthy_run_is_left_alone(pm, capsys, noise):
    run = new_run({"halt": True})
    assert drive(pm, run, healthy, noise=noise) is None
    assert sentinel_lines(capsys.readouterr().err) == []


def test_the_first_reason_is_kept_when_several_warnings_fire(pm, capsys):
    def both(step):
        row = divergence(step)
        row["entropy"] = entropy_collapse(step)["entropy"]
        return row

    run = new_run({"halt": True})
    drive(pm, run, both)
    lines = sentinel_lines(capsys.readouterr().err)
    assert {ENTROPY, DIVERGENCE} <= {line.split()[2] for line in lines}
    first = lines[0].split()[2]
    assert run.stop_reason.startswith(f"sentinel {first}: ")


def test_thresholds_from_the_run_file_apply(pm, capsys):
    run = new_run({"halt": True, "thresholds": {"entropy_collapse_frac": 0, "entropy_floor": 0}})
    assert drive(pm, run, entropy_collapse) is None
    assert sentinel_lines(capsys.readouterr().err) == []


def test_every_runs_the_checks_on_multiples_of_that_step(pm, capsys):
    assert drive(pm, new_run({"halt": True}), entropy_collapse, kinds=("train",)) == 16  # checked every step
    run = new_run({"halt": True, "every": 10})
    assert drive(pm, run, entropy_collapse, kinds=("train",)) == 20  # the first multiple of 10 after that
    assert sentinel_lines(capsys.readouterr().err)[-1].startswith(f"reinforge: sentinel: {ENTROPY} at steps 15-20: ")
    run = new_run({"halt": True, "every": 10})
    assert drive(pm, run, entropy_collapse) == 20  # an evaluation (at 20 here) runs them too


def test_enabled_false_turns_the_live_checks_off(pm, capsys):
    run = new_run({"enabled": False, "halt": True})
    assert drive(pm, run, entropy_collapse) is None
    assert sentinel_lines(capsys.readouterr().err) == []


# -- per-run state ----------------------------------------------------------------------------------------------


def test_state_lives_in_the_run_not_the_module(pm, capsys):
    first, second = new_run({"halt": True}), new_run({"halt": True})
    drive(pm, first, entropy_collapse)
    assert isinstance(first.state[STATE_KEY], Sentinel) and first.stop_requested
    drive(pm, second, healthy)  # the same process, the same plugin: nothing of the first run leaks in
    assert not second.stop_requested
    assert second.state[STATE_KEY] is not first.state[STATE_KEY]
    assert max(second.state[STATE_KEY].metrics.train) == 40


def test_a_broken_check_is_printed_and_switched_off_not_raised(pm, capsys, monkeypatch):
    import reinforge_report.sentinels as sentinels

    def boom(*args, **kwargs):
        raise RuntimeError("bug in a check")

    monkeypatch.setattr(sentinels, "detect_warnings", boom)
    run = new_run({"halt": True})
    assert drive(pm, run, entropy_collapse) is None
    err = capsys.readouterr().err
    assert err.count("the checks failed") == 1 and "RuntimeError: bug in a check" in err


def test_sentinel_observe_reports_each_warning_once():
    sentinel = Sentinel.from_settings(SentinelSettings())
    fired = []
    for record in records(entropy_collapse):
        metrics = {k: v for k, v in record.items() if k not in ("kind", "step")}
        fired += sentinel.observe(record["step"], metrics, record["kind"])
    assert [w.kind for w in fired] == [ENTROPY]
    assert sentinel.raised[0][0] == ENTROPY and sentinel.raised[0][2] == 40  # widened as the collapse went on


def test_window_lookup_by_bisection_matches_a_scan():
    import random

    from reinforge_report.detectors import _span

    rng = random.Random(1)
    steps = sorted(rng.sample(range(200), 60))
    for _ in range(500):
        lo = rng.randrange(-5, 205)
        hi = lo + rng.randrange(0, 60)
        assert list(_span(steps, lo, hi)) == [i for i, s in enumerate(steps) if lo <= s <= hi]
