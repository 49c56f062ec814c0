"""The run -> Trinity config mapping as plain data (no Trinity needed): every key, the merge, the AgentScope bugs."""

from __future__ import annotations

import pytest
import yaml
from conftest import config_of, math_run, write_run

from reinforge.plugin import ConfigError
from reinforge_backend_trinity.mapping import ADAPTER_WORKFLOW, merge


def _full_run() -> dict:
    run = math_run()
    run["model"].update({"max_model_len": 512, "top_p": 0.9, "lora_rank": 8, "lora_alpha": 16, "seed": 7})
    run["model"]["dtype"] = "bfloat16"
    run["algorithm"]["eval_interval_steps"] = 10  # stated here, not taken from the example's current value
    run["auxiliary_models"] = {
        "critic": {"model_path": "Qwen/Qwen3-0.6B", "temperature": 0.3, "top_p": 0.5, "max_tokens": 64},
        "api": {"model_path": "gpt-4o-mini", "api_base": "https://api.example/v1", "api_key_env": "KEY"},
    }
    run["runner"] = {"rollout_timeout_s": 90, "max_retries": 3}
    run["eval"] = {"group_size": 2}
    run["backend_args"] = {
        "mode": "explore",
        "ray_address": "ray://head:10001",
        "node_num": 2,
        "gpu_per_node": 8,
        "engine_type": "vllm",
        "engine_num": 2,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.8,
        "enforce_eager": True,
        "enable_thinking": False,
        "auxiliary_engine_num": 1,
        "auxiliary_tensor_parallel_size": 1,
        "runner_per_model": 4,
        "eval_on_startup": False,
        "sync_method": "checkpoint",
        "sync_interval": 2,
        "monitor_type": "wandb",
        "experience_buffer": "sql",
        "format": {"prompt_key": "question", "response_key": "answer"},
        "group": "ablation",
        "checkpoint_root_dir": "ckpt",
        "output_dir": "out",
    }
    return run


def test_every_key_of_the_run_lands_in_the_trinity_config(math_dir, monkeypatch) -> None:
    monkeypatch.setenv("KEY", "secret")
    config = config_of(write_run(math_dir, _full_run()))
    cwd = math_dir.parent
    assert (config["project"], config["group"], config["name"], config["mode"]) == (
        "math",
        "ablation",
        "addition",
        "explore",
    )
    assert config["checkpoint_root_dir"] == str(cwd / "ckpt")
    assert config["cluster"] == {"ray_address": "ray://head:10001", "node_num": 2, "gpu_per_node": 8}
    assert config["monitor"] == {"monitor_type": "wandb"}
    assert config["synchronizer"] == {"sync_method": "checkpoint", "sync_interval": 2}
    assert config["algorithm"] == {"algorithm_type": "grpo", "repeat_times": 8, "optimizer": {"lr": 3.0e-4}}
    model = config["model"]
    assert model["model_path"] == "smollm2-135m-instruct"
    assert (model["max_model_len"], model["max_response_tokens"]) == (512, 24)
    assert (model["temperature"], model["top_p"], model["enable_thinking"]) == (0.8, 0.9, False)
    assert model["lora_configs"] == [
        {"name": "reinforge", "lora_rank": 8, "lora_alpha": 16, "target_modules": r".*\.(q_proj|k_proj|v_proj|o_proj)"}
    ]
    rollout = config["explorer"]["rollout_model"]
    assert rollout == {
        "enable_openai_api": True,
        "enable_history": True,
        "dtype": "bfloat16",
        "seed": 7,
        "engine_type": "vllm",
        "engine_num": 2,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.8,
        "enforce_eager": True,
        "temperature": 0.8,
        "top_p": 0.9,
        "enable_thinking": False,
    }
    # the auxiliary model Trinity serves gets its own sampling; the API one is the adapter's, not an engine
    assert config["explorer"]["auxiliary_models"] == [
        {
            "name": "critic",
            "model_path": "Qwen/Qwen3-0.6B",
            "max_model_len": 4096,
            "max_response_tokens": 64,
            "temperature": 0.3,
            "top_p": 0.5,
            "engine_type": "vllm",
            "engine_num": 1,
            "tensor_parallel_size": 1,
            "enable_thinking": False,
        }
    ]
    explorer = config["explorer"]
    assert (explorer["runner_per_model"], explorer["eval_on_startup"], explorer["eval_interval"]) == (4, False, 10)
    assert (explorer["max_timeout"], explorer["max_retry_times"]) == (90, 3)
    assert config["trainer"] == {"save_interval": 20}
    buffer = config["buffer"]
    assert (buffer["batch_size"], buffer["total_epochs"], buffer["total_steps"]) == (4, 1, 40)
    assert buffer["trainer_input"] == {"experience_buffer": {"storage_type": "sql", "name": "experience_buffer"}}
    inputs = buffer["explorer_input"]
    assert inputs["default_workflow_type"] == ADAPTER_WORKFLOW
    train, (evaluation,) = inputs["taskset"], inputs["eval_tasksets"]
    data = str(math_dir / "data")
    fmt = {"prompt_key": "question", "response_key": "answer"}
    assert {k: train[k] for k in ("name", "storage_type", "path", "split", "format")} == {
        "name": "train",
        "storage_type": "file",
        "path": data,
        "split": "train",
        "format": fmt,
    }
    assert (evaluation["path"], evaluation["split"], evaluation["repeat_times"], evaluation["format"]) == (
        data,
        "test",
        2,
        fmt,
    )
    spec = train["workflow_args"]["reinforge"]
    assert spec == evaluation["workflow_args"]["reinforge"]
    assert spec["workflow"]["ref"] == "workflow:math_workflow"
    assert [j["name"] for j in spec["judges"]] == ["correct_gate", "correct", "format", "concise"]
    assert spec["base_dir"] == str(math_dir)
    assert list(spec["auxiliary_models"]) == ["api"]
    assert "api_key" not in spec["auxiliary_models"]["api"]


def test_dataset_fields_become_taskset_keys(math_dir) -> None:
    run = math_run()
    run["train_dataset"] = {"path": "data/train.jsonl", "split": "test", "shuffle": True, "seed": 3}
    run["eval_dataset"] = {"path": "data", "name": "default"}
    config = config_of(write_run(math_dir, run))
    inputs = config["buffer"]["explorer_input"]
    # one file is the "train" split of load_dataset(path); shuffle is Trinity's shuffle selector
    assert inputs["taskset"]["path"] == str(math_dir / "data" / "train.jsonl")
    assert inputs["taskset"]["split"] == "train"
    assert inputs["taskset"]["data_selector"] == {"selector_type": "shuffle", "seed": 3}
    (evaluation,) = inputs["eval_tasksets"]
    assert (evaluation["split"], evaluation["subset_name"]) == ("test", "default")  # eval.split's default
    assert "total_steps" not in config["buffer"]


def test_full_finetune_has_no_lora_and_all_linear_passes_as_is(math_dir) -> None:
    run = math_run()
    run["model"]["full_finetune"] = True
    assert config_of(write_run(math_dir, run))["model"]["lora_configs"] is None
    run["model"].update({"full_finetune": False, "lora_target_modules": ["all-linear"]})
    assert config_of(write_run(math_dir, run))["model"]["lora_configs"][0]["target_modules"] == "all-linear"


def test_a_trinity_workflow_type_replaces_the_adapter(math_dir) -> None:
    run = math_run()
    run["backend_args"] = {"workflow_type": "math_workflow", "reward_fn_type": "math_reward"}
    config = config_of(write_run(math_dir, run))
    inputs = config["buffer"]["explorer_input"]
    assert (inputs["default_workflow_type"], inputs["default_reward_fn_type"]) == ("math_workflow", "math_reward")
    assert "workflow_args" not in inputs["taskset"]
    assert "enable_history" not in config["explorer"]["rollout_model"]


def test_a_train_run_gets_the_train_batch_size_trinity_requires(math_dir) -> None:
    run = math_run()
    run["backend_args"] = {"mode": "train"}
    assert config_of(write_run(math_dir, run))["buffer"]["train_batch_size"] == 4 * 8


# -- config_path: the hand-written YAML under the run's keys ------------------------------------------------


def _with_yaml(math_dir, trinity: dict, run: dict | None = None) -> dict:
    (math_dir / "trinity.yaml").write_text(yaml.safe_dump(trinity))
    run = run or math_run()
    run["config_path"] = "trinity.yaml"
    return config_of(write_run(math_dir, run))


def test_config_path_keeps_what_the_run_does_not_set_and_the_run_wins_where_it_does(math_dir) -> None:
    trinity = {
        "project": "yaml-project",
        "name": "yaml-name",
        "model": {"temperature": 0.2, "max_model_len": 2048, "custom_chat_template": "{{ x }}"},
        "algorithm": {"algorithm_type": "dapo", "repeat_times": 4, "optimizer": {"lr": 1e-6, "weight_decay": 0.2}},
        "explorer": {"runner_per_model": 16, "rollout_model": {"engine_num": 4, "temperature": 0.2}},
        "trainer": {"save_interval": 50, "grad_clip": 0.5},
    }
    run = math_run()
    del run["project_name"]  # left at reinforge's default: the YAML's project stays
    config = _with_yaml(math_dir, trinity, run)
    # the run file sets these: they win
    assert config["name"] == "addition"
    assert config["model"]["temperature"] == 0.8
    assert config["explorer"]["rollout_model"]["temperature"] == 0.8
    assert config["algorithm"]["algorithm_type"] == "grpo"
    assert config["algorithm"]["repeat_times"] == 8
    assert config["algorithm"]["optimizer"] == {"lr": 3.0e-4, "weight_decay": 0.2}
    assert config["trainer"] == {"save_interval": 20, "grad_clip": 0.5}
    # the run leaves these at reinforge's defaults: the YAML's values stay
    assert config["project"] == "yaml-project"
    assert config["model"]["max_model_len"] == 2048
    assert config["model"]["custom_chat_template"] == "{{ x }}"
    assert config["explorer"]["runner_per_model"] == 16
    assert config["explorer"]["rollout_model"]["engine_num"] == 4


def test_backend_args_config_path_is_the_same_as_the_top_level_key(math_dir) -> None:
    (math_dir / "trinity.yaml").write_text(yaml.safe_dump({"trainer": {"grad_clip": 0.5}}))
    run = math_run()
    run["backend_args"] = {"config_path": "trinity.yaml"}
    assert config_of(write_run(math_dir, run))["trainer"]["grad_clip"] == 0.5
    (math_dir / "other.yaml").write_text("{}")
    run["config_path"] = "other.yaml"
    with pytest.raises(ConfigError, match="config_path and backend_args.config_path name different files"):
        config_of(write_run(math_dir, run))


def test_a_config_path_that_is_not_a_mapping_is_an_error_naming_it(math_dir) -> None:
    with pytest.raises(ConfigError, match=r"trinity.yaml must hold a mapping \(a Trinity config\), got list"):
        _with_yaml(math_dir, [1, 2])  # type: ignore[arg-type]


# -- the five AgentScope v1.0.21 bugs --------------------------------------------------------------------------


def test_bug1_experiment_name_applies(math_dir) -> None:
    config = _with_yaml(math_dir, {"name": "from-yaml"})
    assert config["name"] == "addition"
    assert config["project"] == "math"


def test_bug2_temperature_and_top_p_reach_the_rollout_and_auxiliary_models(math_dir) -> None:
    run = math_run()
    run["model"]["top_p"] = 0.9
    run["auxiliary_models"] = {"helper": {"model_path": "m", "temperature": 0.1, "top_p": 0.7}}
    run["backend_args"] = {"enable_thinking": True}
    config = config_of(write_run(math_dir, run))
    rollout, (helper,) = config["explorer"]["rollout_model"], config["explorer"]["auxiliary_models"]
    assert (rollout["temperature"], rollout["top_p"], rollout["enable_thinking"]) == (0.8, 0.9, True)
    assert (helper["temperature"], helper["top_p"], helper["enable_thinking"]) == (0.1, 0.7, True)


def test_bug3_train_dataset_with_config_path_keeps_the_yamls_total_steps(math_dir) -> None:
    run = math_run()
    run["train_dataset"] = {"path": "data", "split": "train"}  # no total_steps of its own
    config = _with_yaml(math_dir, {"buffer": {"total_steps": 123, "total_epochs": 3}}, run)
    assert config["buffer"]["total_steps"] == 123
    assert config["buffer"]["total_epochs"] == 3
    assert config["buffer"]["explorer_input"]["taskset"]["path"] == str(math_dir / "data")


def test_bug4_a_yaml_with_tasksets_and_no_train_dataset_works(math_dir) -> None:
    run = math_run()
    del run["train_dataset"], run["eval_dataset"]
    tasksets = [
        {"name": "gsm", "path": "/data/gsm8k", "split": "train"},
        {"name": "own", "path": "/data/own", "default_workflow_type": "math_workflow"},
    ]
    config = _with_yaml(math_dir, {"buffer": {"explorer_input": {"tasksets": tasksets}}}, run)
    gsm, own = config["buffer"]["explorer_input"]["tasksets"]
    assert (gsm["name"], gsm["path"], own["name"]) == ("gsm", "/data/gsm8k", "own")
    assert "taskset" not in config["buffer"]["explorer_input"]
    # the taskset without a workflow of its own runs on the adapter, so it gets the run's references
    assert gsm["workflow_args"]["reinforge"]["workflow"]["ref"] == "workflow:math_workflow"
    assert "workflow_args" not in own

    run["train_dataset"] = {"path": "data"}
    with pytest.raises(ConfigError, match="config_path YAML sets buffer.explorer_input.tasksets; set train_dataset"):
        _with_yaml(math_dir, {"buffer": {"explorer_input": {"tasksets": tasksets}}}, run)


def test_no_tasks_at_all_is_an_error_for_an_exploring_mode(math_dir) -> None:
    run = math_run()
    del run["train_dataset"]
    with pytest.raises(ConfigError, match="train_dataset: mode 'both' explores tasks; set train_dataset"):
        config_of(write_run(math_dir, run))
    run["backend_args"] = {"mode": "serve"}
    assert config_of(write_run(math_dir, run))["mode"] == "serve"


def test_bug5_workflow_args_hold_references_never_live_callables(math_dir) -> None:
    config = config_of(write_run(math_dir, math_run()))
    text = yaml.safe_dump(config)  # plain data only: safe_dump refuses Python objects
    assert yaml.safe_load(text) == config
    spec = config["buffer"]["explorer_input"]["taskset"]["workflow_args"]["reinforge"]
    assert [j["ref"] for j in spec["judges"]] == [
        "last_number",
        "last_number",
        "judges:just_the_number",
        "length_penalty",
    ]


def test_bug5_a_function_that_workers_cannot_import_is_an_error(math_dir, monkeypatch) -> None:
    from reinforge import RunConfig, WorkflowOutput
    from reinforge_backend_trinity.mapping import workflow_spec

    async def local_workflow(task, model):
        return WorkflowOutput(response="x")

    run = RunConfig(workflow=local_workflow, train_dataset={"path": str(math_dir / "data")})
    with pytest.raises(ConfigError, match=r"local_workflow cannot be imported by path on Trinity's Ray workers"):
        workflow_spec(run)
    from reinforge_backend_trinity import extra

    run = RunConfig(workflow=extra.trinity_installed, train_dataset={"path": str(math_dir / "data")})
    assert workflow_spec(run)["workflow"]["ref"] == "reinforge_backend_trinity.extra:trinity_installed"


def test_merge_merges_mappings_and_replaces_the_rest() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge(base, {"a": {"c": [3]}, "e": None}) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": None}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}
