"""backend_args and algorithms, checked by core before anything loads (no Trinity needed, except where said)."""

from __future__ import annotations

import pytest
from conftest import build, math_run, write_run

from reinforge.plugin import ConfigError
from reinforge.testing import check_entry_point
from reinforge_backend_trinity import algorithms, extra
from reinforge_backend_trinity.algorithms import TO_TRINITY, TrinityAlgorithmSettings


def test_the_entry_point_registers_the_trinity_backend() -> None:
    check_entry_point("reinforge-backend-trinity", backends=["trinity"])


def test_importing_the_plugin_does_not_import_trinity() -> None:
    import subprocess
    import sys

    code = (
        "import sys, reinforge_backend_trinity.plugin, reinforge_backend_trinity.backend; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('trinity', 'ray', 'torch', 'verl')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"mode": "explorer"}, "backend_args.mode: must be one of explore, train, both, serve, bench, colocate"),
        ({"engine_type": "vlm"}, "backend_args.engine_type: must be one of vllm, sglang, tinker, external"),
        ({"monitor_type": "tb"}, "backend_args.monitor_type: must be one of"),
        ({"experience_buffer": "sqlite"}, "backend_args.experience_buffer: must be one of queue, sql, file"),
        ({"node_num": 0}, "backend_args.node_num: must be at least 1"),
        ({"format": {"prompt_kye": "question"}}, "backend_args.format.prompt_kye: must be one of"),
        ({"mode": "both", "gpu_per_node": 0}, "backend_args.gpu_per_node: mode 'both' trains on GPUs"),
        ({"gpu_per_node": "two"}, "backend_args.gpu_per_node: expected an integer"),
        ({"ray_adress": "auto"}, "unknown key 'backend_args.ray_adress'"),
    ],
)
def test_bad_backend_args_name_the_key_and_the_file(math_dir, args, message) -> None:
    run = {**math_run(), "backend_args": args}
    path = write_run(math_dir, run)
    with pytest.raises(ConfigError) as info:
        build(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("grpo", "grpo"),
        ("ppo", "ppo"),
        ("rloo", "rloo"),
        ("reinforce_pp", "reinforceplusplus"),
        ("reinforce++", "reinforceplusplus"),
        ("multi_step_grpo", "multi_step_grpo"),
        ("dapo", "dapo"),  # a Trinity name passes through
    ],
)
def test_algorithm_names_map_onto_trinitys(math_dir, ours, theirs) -> None:
    from conftest import config_of

    run = math_run()
    run["algorithm"]["algorithm_type"] = ours
    config = config_of(write_run(math_dir, run))
    assert config["algorithm"]["algorithm_type"] == theirs


def test_without_trinity_an_unknown_name_passes_to_be_checked_at_run_time(math_dir, monkeypatch) -> None:
    monkeypatch.setattr(algorithms, "trinity_installed", lambda: False)
    run = math_run()
    run["algorithm"]["algorithm_type"] = "my_pkg.algos.MyAlgorithm"
    job = build(write_run(math_dir, run))
    try:
        assert job.algorithm_name == "my_pkg.algos.MyAlgorithm"
    finally:
        job.close()


def test_with_trinity_an_unknown_name_lists_trinitys_algorithms(math_dir) -> None:
    pytest.importorskip("trinity")
    run = math_run()
    run["algorithm"]["algorithm_type"] = "grpoo"
    with pytest.raises(ConfigError) as info:
        build(write_run(math_dir, run))
    text = str(info.value)
    assert "algorithm.algorithm_type: Trinity-RFT has no algorithm 'grpoo'" in text
    assert "did you mean" in text and "dapo" in text and "reinforce_pp" in text


def test_the_static_algorithm_list_is_trinitys_registry() -> None:
    pytest.importorskip("trinity")
    assert algorithms.registry_names() == sorted(algorithms.TRINITY_ALGORITHMS)
    assert set(TO_TRINITY.values()) <= set(algorithms.registry_names())


def test_trinity_algorithm_keys_are_checked_and_passed_through(math_dir) -> None:
    from conftest import config_of

    run = math_run()
    run["algorithm"].update(
        {"kl_loss_fn": "none", "loss_agg_mode": "seq-mean-token-mean", "optimizer": {"weight_decay": 0.1}}
    )
    config = config_of(write_run(math_dir, run))
    assert config["algorithm"]["kl_loss_fn"] == "none"
    assert config["algorithm"]["loss_agg_mode"] == "seq-mean-token-mean"
    assert config["algorithm"]["optimizer"] == {"lr": 3.0e-4, "weight_decay": 0.1}

    run["algorithm"]["loss_agg_mode"] = "mean"
    with pytest.raises(ConfigError, match="algorithm.loss_agg_mode: must be one of token-mean"):
        build(write_run(math_dir, run))
    del run["algorithm"]["loss_agg_mode"]
    run["algorithm"]["kl_coeff"] = 0.1
    with pytest.raises(ConfigError, match="unknown key 'algorithm.kl_coeff'"):
        build(write_run(math_dir, run))
    with pytest.raises(ConfigError, match="optimizer.lr: set algorithm.learning_rate instead"):
        TrinityAlgorithmSettings(optimizer={"lr": 1.0})


def test_running_without_trinity_says_which_extra_to_install(math_dir, monkeypatch) -> None:
    import sys

    from reinforge.plugin import MissingExtraError

    job = build(write_run(math_dir, math_run()))
    monkeypatch.setitem(sys.modules, "trinity", None)  # `import trinity` now raises ImportError
    try:
        with pytest.raises(MissingExtraError, match=r"pip install 'reinforge-backend-trinity\[trinity\]'"):
            job.backend.run(job)
    finally:
        job.close()
    assert extra.INSTALL_HINT.startswith("pip install 'reinforge-backend-trinity[trinity]'")
