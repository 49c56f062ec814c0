"""The written config through Trinity-RFT's own ``load_config`` + ``check_and_update``, on CPU.

``explore``, ``serve`` and ``bench`` validate with the ``external`` rollout engine (no GPU); ``both`` and
``train`` validate with a vLLM engine and GPU counts declared (``cluster.node_num``/``gpu_per_node`` set,
so the validator neither asks Ray nor turns ``explore`` into ``colocate``): validation only, nothing is
launched. Trinity's GPU memory check logs "NO GPU DETECTED" there and returns. Skipped without Trinity.
"""

from __future__ import annotations

import pytest
from conftest import config_of, math_run, trinity_resolve, write_run

pytest.importorskip("trinity")

CPU = {"engine_type": "external", "node_num": 1, "gpu_per_node": 1}  # the external engine uses no GPU


def _run(math_dir, tiny_model, mode: str = "explore", **backend_args) -> dict:
    run = math_run()
    run["model"]["model_path"] = tiny_model
    run["algorithm"]["eval_interval_steps"] = 10  # stated here, not taken from the example's current value
    run["backend_args"] = {"mode": mode, "output_dir": str(math_dir.parent / "runs"), **backend_args}
    return run


def test_explore_resolves_every_mapped_key(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, **CPU, runner_per_model=2, eval_on_startup=False, monitor_type="tensorboard")
    run["model"].update({"top_p": 0.9, "max_model_len": 512, "lora_rank": 4, "lora_alpha": 8})
    run["auxiliary_models"] = {"helper": {"model_path": tiny_model, "temperature": 0.3, "top_p": 0.5}}
    run["runner"] = {"rollout_timeout_s": 90, "max_retries": 3}
    run["backend_args"].update({"group": "g", "enable_thinking": False, "format": {"prompt_key": "question"}})
    run["backend_args"].update({"experience_buffer": "sql", "ray_address": "auto", "sync_interval": 1})
    config = config_of(write_run(math_dir, run))
    cfg = trinity_resolve(config, math_dir)

    root = math_dir.parent / "runs" / "checkpoints"
    assert (cfg.mode, cfg.project, cfg.group, cfg.name) == ("explore", "math", "g", "addition")
    assert cfg.checkpoint_root_dir == str(root)
    assert cfg.checkpoint_job_dir == str(root / "math" / "g" / "addition")
    assert (cfg.cluster.ray_address, cfg.cluster.node_num, cfg.cluster.gpu_per_node) == ("auto", 1, 1)
    assert cfg.monitor.monitor_type == "tensorboard"
    assert cfg.synchronizer.sync_interval == 1
    assert cfg.algorithm.algorithm_type == "grpo"
    assert cfg.algorithm.repeat_times == 8
    assert cfg.algorithm.optimizer.lr == pytest.approx(3.0e-4)
    assert cfg.model.model_path == tiny_model
    assert (cfg.model.max_model_len, cfg.model.max_response_tokens, cfg.model.max_prompt_tokens) == (512, 24, 488)
    assert (cfg.model.temperature, cfg.model.top_p, cfg.model.enable_thinking) == (0.8, 0.9, False)
    (lora,) = cfg.model.lora_configs
    assert (lora.lora_rank, lora.lora_alpha, lora.target_modules) == (4, 8, r".*\.(q_proj|k_proj|v_proj|o_proj)")
    assert cfg.explorer.rollout_model.enable_lora  # Trinity made the dummy adapter from the model's config
    rollout = cfg.explorer.rollout_model
    assert (rollout.engine_type, rollout.enable_openai_api, rollout.enable_history) == ("external", True, True)
    assert (rollout.temperature, rollout.top_p, rollout.enable_thinking) == (0.8, 0.9, False)
    assert (rollout.max_model_len, rollout.max_response_tokens) == (512, 24)
    (helper,) = cfg.explorer.auxiliary_models
    assert (helper.name, helper.model_path, helper.temperature, helper.top_p) == ("helper", tiny_model, 0.3, 0.5)
    assert helper.enable_thinking is False
    explorer = cfg.explorer
    assert (explorer.runner_per_model, explorer.eval_on_startup, explorer.eval_interval) == (2, False, 10)
    assert (explorer.max_timeout, explorer.max_retry_times) == (90, 3)
    assert cfg.trainer.save_interval == 20
    assert (cfg.buffer.batch_size, cfg.buffer.total_steps, cfg.buffer.total_epochs) == (4, 40, 1)
    assert cfg.buffer.train_batch_size == 32
    (train,) = cfg.buffer.explorer_input.tasksets
    assert (train.name, train.path, train.split, train.repeat_times) == ("train", str(math_dir / "data"), "train", 8)
    assert (train.format.prompt_key, train.total_steps, train.batch_size) == ("question", 40, 4)
    assert (train.rollout_args.temperature, train.rollout_args.top_p, train.rollout_args.max_tokens) == (0.8, 0.9, 24)
    assert train.default_workflow_type == "reinforge_backend_trinity.workflow.ReinforgeWorkflow"
    assert train.workflow_args["reinforge"]["workflow"]["ref"] == "workflow:math_workflow"
    (evaluation,) = cfg.buffer.explorer_input.eval_tasksets
    assert (evaluation.path, evaluation.split, evaluation.repeat_times, evaluation.is_eval) == (
        str(math_dir / "data"),
        "test",
        1,
        True,
    )
    buffer = cfg.buffer.trainer_input.experience_buffer
    assert buffer.storage_type == "sql" and buffer.path.startswith("sqlite:///")


@pytest.mark.parametrize("mode", ["serve", "bench"])
def test_serve_and_bench_validate_on_cpu(math_dir, tiny_model, mode) -> None:
    run = _run(math_dir, tiny_model, mode, **CPU)
    run["model"]["full_finetune"] = True
    cfg = trinity_resolve(config_of(write_run(math_dir, run)), math_dir)
    assert cfg.mode == mode
    assert cfg.model.lora_configs is None
    if mode == "serve":
        assert cfg.explorer.rollout_model.enable_openai_api
    assert cfg.cluster.explorer_gpu_num == 0


def test_both_validates_with_gpu_counts_declared(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, "both", node_num=1, gpu_per_node=4, engine_num=1, tensor_parallel_size=2)
    run["model"]["full_finetune"] = True
    run["backend_args"]["sync_method"] = "nccl"
    cfg = trinity_resolve(config_of(write_run(math_dir, run)), math_dir)
    assert cfg.mode == "both"
    assert cfg.explorer.rollout_model.engine_type == "vllm"
    assert (cfg.cluster.total_gpu_num, cfg.cluster.explorer_gpu_num, cfg.cluster.trainer_gpu_num) == (4, 2, 2)
    assert cfg.synchronizer.sync_method.value == "nccl"


def test_train_validates_with_gpu_counts_declared(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, "train", node_num=2, gpu_per_node=8, experience_buffer="sql")
    cfg = trinity_resolve(config_of(write_run(math_dir, run)), math_dir)
    assert cfg.mode == "train"
    assert (cfg.cluster.trainer_gpu_num, cfg.cluster.trainer_node_num) == (16, 2)
    assert cfg.buffer.train_batch_size == 32


def test_too_few_gpus_is_trinitys_error(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, "both", node_num=1, gpu_per_node=2, engine_num=2)
    run["model"]["full_finetune"] = True
    with pytest.raises(ValueError, match="Not enough GPUs for trainer"):
        trinity_resolve(config_of(write_run(math_dir, run)), math_dir)


# -- the five AgentScope v1.0.21 bugs, on the resolved config ------------------------------------------------


def _with_yaml(math_dir, run: dict, trinity: dict) -> dict:
    import yaml

    (math_dir / "trinity.yaml").write_text(yaml.safe_dump(trinity))
    run["config_path"] = "trinity.yaml"
    return config_of(write_run(math_dir, run))


def test_bug1_experiment_name_names_the_job(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, **CPU)
    cfg = trinity_resolve(_with_yaml(math_dir, run, {"name": "yaml-name"}), math_dir)
    assert cfg.name == "addition"
    assert cfg.checkpoint_job_dir.endswith("/math/addition")
    assert cfg.ray_namespace == "math/addition"


def test_bug2_sampling_reaches_rollout_auxiliary_models_and_tasksets(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, **CPU, enable_thinking=True)
    run["model"]["top_p"] = 0.95
    run["auxiliary_models"] = {"judge": {"model_path": tiny_model, "temperature": 0.1, "top_p": 0.6}}
    cfg = trinity_resolve(config_of(write_run(math_dir, run)), math_dir)
    rollout, (judge,) = cfg.explorer.rollout_model, cfg.explorer.auxiliary_models
    assert (rollout.temperature, rollout.top_p, rollout.enable_thinking) == (0.8, 0.95, True)
    assert (judge.temperature, judge.top_p, judge.enable_thinking) == (0.1, 0.6, True)
    (train,) = cfg.buffer.explorer_input.tasksets
    assert (train.rollout_args.temperature, train.rollout_args.top_p) == (0.8, 0.95)


def test_bug3_train_dataset_with_config_path_keeps_total_steps(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, **CPU)
    run["train_dataset"] = {"path": "data", "split": "train"}
    cfg = trinity_resolve(_with_yaml(math_dir, run, {"buffer": {"total_steps": 7}}), math_dir)
    assert cfg.buffer.total_steps == 7
    assert cfg.buffer.explorer_input.tasksets[0].total_steps == 7


def test_bug4_yaml_tasksets_without_train_dataset(math_dir, tiny_model) -> None:
    run = _run(math_dir, tiny_model, **CPU)
    del run["train_dataset"], run["eval_dataset"]
    data = str(math_dir / "data")
    tasksets = [{"name": "a", "path": data, "split": "train"}, {"name": "b", "path": data, "split": "test"}]
    cfg = trinity_resolve(_with_yaml(math_dir, run, {"buffer": {"explorer_input": {"tasksets": tasksets}}}), math_dir)
    assert [t.name for t in cfg.buffer.explorer_input.tasksets] == ["a", "b"]
    assert all(t.repeat_times == 8 for t in cfg.buffer.explorer_input.tasksets)
    assert cfg.buffer.explorer_input.tasksets[1].workflow_args["reinforge"]["judges"][0]["ref"] == "last_number"


def test_bug5_the_resolved_workflow_args_are_plain_data(math_dir, tiny_model) -> None:
    import pickle

    cfg = trinity_resolve(config_of(write_run(math_dir, _run(math_dir, tiny_model, **CPU))), math_dir)
    args = cfg.buffer.explorer_input.tasksets[0].workflow_args
    spec = args["reinforge"]

    def plain(value: object) -> bool:
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (str, int, float, bool))

    assert plain(args)
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec["workflow"]["ref"] == "workflow:math_workflow"


def test_our_value_lists_are_trinitys() -> None:
    from trinity.common.constants import StorageType, SyncMethod
    from trinity.utils.monitor import MONITOR

    from reinforge_backend_trinity import settings

    assert sorted(MONITOR._default_mapping) == sorted(settings.MONITOR_TYPES)
    assert sorted(s.value for s in StorageType) == sorted(settings.STORAGE_TYPES)
    assert sorted(s.value for s in SyncMethod) == sorted(settings.SYNC_METHODS)
    from trinity.common.config import FormatConfig

    assert set(settings.FORMAT_KEYS) <= set(FormatConfig.__dataclass_fields__)
