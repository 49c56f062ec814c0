"""Run configuration: dataclass checks, the YAML loader and DatasetConfig over real local files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from reinforge.config import (
    AlgorithmConfig,
    ComponentSpec,
    DatasetConfig,
    ModelConfig,
    RunConfig,
    RunnerConfig,
    ScoreConfig,
    TunerModelConfig,
    as_component,
    from_dict,
)
from reinforge.errors import ConfigError, ResolveError, SignatureError
from reinforge.plugin import Backend, Registry, Settings, at_least
from reinforge.runfile import build_run, check_sections, dump_run, load_run, to_dict

ROWS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 4 + 4?", "answer": "8"}]
TEST_ROWS = [{"question": "What is 1 + 1?", "answer": "2"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "my_dataset" / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "my_dataset" / "test.jsonl", TEST_ROWS)
    return tmp_path / "my_dataset"


def write_run(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def write_module(directory: Path, source: str) -> str:
    """A uniquely named module in ``directory``; returns its name."""
    name = f"cfgmod_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return name


USER_FUNCS = """
async def workflow(task, model, temperature=0.5):
    return None

def judge(task, response, tolerance=0.1):
    return 1.0

def other_judge(task, response):
    return 0.0
"""


# --------------------------------------------------------------------------- DatasetConfig


def test_dataset_folder_splits_load(dataset_dir: Path) -> None:
    assert DatasetConfig(path=str(dataset_dir)).rows() == ROWS
    assert DatasetConfig(path=str(dataset_dir), split="test").rows() == TEST_ROWS
    assert len(DatasetConfig(path=str(dataset_dir)).load()) == 2


def test_dataset_preview_prints_indented_json(dataset_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = DatasetConfig(path=str(dataset_dir), split="train").preview(n=1)
    assert rows == ROWS[:1]
    out = capsys.readouterr().out
    assert json.loads(out) == ROWS[:1]
    assert '\n  {\n    "question": "What is 2 + 2?",' in out


def test_dataset_preview_n_larger_than_dataset(dataset_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert DatasetConfig(path=str(dataset_dir), split="test").preview(n=10) == TEST_ROWS


def test_dataset_single_jsonl_file_is_the_requested_split(tmp_path: Path) -> None:
    file = write_jsonl(tmp_path / "tasks.jsonl", ROWS)
    assert DatasetConfig(path=str(file)).rows() == ROWS
    assert DatasetConfig(path=str(file), split="test").rows() == ROWS


def test_dataset_csv_and_tsv_files(tmp_path: Path) -> None:
    (tmp_path / "tasks.csv").write_text("question,answer\nWhat is 2 + 2?,four\nWhat is 4 + 4?,eight\n")
    (tmp_path / "tasks.tsv").write_text("question\tanswer\nWhat is 2, plus 2?\tfour\n")
    assert DatasetConfig(path=str(tmp_path / "tasks.csv")).rows() == [
        {"question": "What is 2 + 2?", "answer": "four"},
        {"question": "What is 4 + 4?", "answer": "eight"},
    ]
    assert DatasetConfig(path=str(tmp_path / "tasks.tsv")).rows() == [
        {"question": "What is 2, plus 2?", "answer": "four"}
    ]


def test_dataset_csv_folder(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.csv").write_text("q,a\nx,1\ny,2\n")
    (tmp_path / "d" / "test.csv").write_text("q,a\nz,3\n")
    assert DatasetConfig(path=str(tmp_path / "d"), split="test").rows() == [{"q": "z", "a": 3}]


def test_dataset_saved_to_disk_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "saved"))
    assert DatasetConfig(path=str(tmp_path / "saved")).rows() == ROWS


def test_dataset_limit_and_shuffle(tmp_path: Path) -> None:
    rows = [{"i": i} for i in range(20)]
    file = write_jsonl(tmp_path / "many.jsonl", rows)
    assert DatasetConfig(path=str(file), limit=3).rows() == rows[:3]
    shuffled = DatasetConfig(path=str(file), shuffle=True, seed=1).rows()
    assert shuffled != rows and sorted(r["i"] for r in shuffled) == list(range(20))
    assert DatasetConfig(path=str(file), shuffle=True, seed=1).rows() == shuffled
    limited = DatasetConfig(path=str(file), limit=5, shuffle=True).rows()
    assert sorted(r["i"] for r in limited) == list(range(5))


def test_dataset_relative_path_is_taken_from_cwd(dataset_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(dataset_dir.parent)
    assert DatasetConfig(path="my_dataset").rows() == ROWS


def test_dataset_unknown_split_lists_available(dataset_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        DatasetConfig(path=str(dataset_dir), split="validation").load()
    msg = str(info.value)
    assert "split" in msg and "'validation'" in msg
    assert "train" in msg and "test" in msg


def test_dataset_missing_local_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "train.jsonl"
    with pytest.raises(ConfigError) as info:
        DatasetConfig(path=str(missing)).load()
    assert str(missing) in str(info.value) and "does not exist" in str(info.value)


def test_dataset_unknown_file_format(tmp_path: Path) -> None:
    (tmp_path / "tasks.xml").write_text("<x/>")
    with pytest.raises(ConfigError, match=r"tasks\.xml"):
        DatasetConfig(path=str(tmp_path / "tasks.xml")).load()


def test_dataset_hub_not_found_names_key(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def not_found(*args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError("Dataset 'someone/missing' doesn't exist on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", not_found)
    run = from_dict(RunConfig, {"workflow": "m:f", "train_dataset": {"path": "someone/missing"}})
    with pytest.raises(ConfigError) as info:
        run.train_dataset.load()
    assert "train_dataset.path" in str(info.value) and "someone/missing" in str(info.value)


def test_dataset_hub_id_is_passed_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    seen = []

    def fake(path, name=None, split=None, **kwargs):
        seen.append((path, name, split))
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    monkeypatch.setattr("reinforge.dataset_io._hub_unreachable", lambda: None)  # no network needed: the call is faked
    assert DatasetConfig(path="openai/gsm8k", name="main", split="test").rows() == ROWS
    assert seen == [("openai/gsm8k", "main", "test")]


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"path": ""}, "path"),
        ({"path": "d", "total_epochs": 0}, "total_epochs"),
        ({"path": "d", "limit": 0}, "limit"),
        ({"path": "d", "total_steps": "many"}, "total_steps"),
        ({"path": 3}, "path"),
    ],
)
def test_dataset_bad_values_name_the_field(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        DatasetConfig(**kwargs)


# --------------------------------------------------------------------------- dataclasses in Python


def test_defaults_and_alias() -> None:
    assert TunerModelConfig is ModelConfig
    model = ModelConfig(model_path="Qwen/Qwen3-0.6B", max_model_len=16384)
    assert model.sampling() == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512}
    assert model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    algo = AlgorithmConfig(algorithm_type="multi_step_grpo", group_size=8, batch_size=32, learning_rate=1)
    assert algo.learning_rate == 1.0 and isinstance(algo.learning_rate, float)


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda: AlgorithmConfig(group_size=0), "group_size"),
        (lambda: AlgorithmConfig(learning_rate=0), "learning_rate"),
        (lambda: AlgorithmConfig(group_size=True), "group_size"),
        (lambda: ModelConfig(model_path="m", top_p=1.5), "top_p"),
        (lambda: ModelConfig(model_path="m", max_tokens=8192, max_model_len=4096), "max_tokens"),
        (lambda: ModelConfig(model_path="m", dtype="fp8"), "dtype"),
        (lambda: ModelConfig(model_path="m", lora_target_modules="q_proj"), "lora_target_modules"),
        (lambda: RunnerConfig(max_concurrency=0), "max_concurrency"),
        (lambda: ScoreConfig(empty=float("nan")), "empty"),
        (lambda: ComponentSpec(ref="j", kind="llm"), "kind"),
        (lambda: ComponentSpec(ref=42), "ref"),
    ],
)
def test_python_construction_checks_name_the_field(make, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        make()


@dataclass
class _ClipSettings(Settings):
    clip_range: float = 0.2

    def check(self) -> None:
        at_least("clip_range", self.clip_range, 0.0, strict=True)


class _ToyBackend(Backend):
    name = "toy"
    algorithms = {"grpo": _ClipSettings, "sft": None}
    algorithm_aliases = {"group_relative": "grpo"}


def test_core_keeps_no_algorithm_list_the_backend_checks_names_and_keys() -> None:
    algo = AlgorithmConfig(algorithm_type="my_algo", clip_range=0.1)  # core accepts any name and keeps the keys
    assert algo.options == {"clip_range": 0.1} and algo.clip_range == 0.1
    backend = _ToyBackend()
    with pytest.raises(ConfigError) as info:
        backend.check_algorithm(AlgorithmConfig(algorithm_type="gpro"), where="run.yaml")
    assert "algorithm_type" in str(info.value) and "'grpo'" in str(info.value) and "grpo, sft" in str(info.value)
    assert backend.algorithm_name(AlgorithmConfig(algorithm_type="group_relative"), where="x") == "grpo"
    assert backend.check_algorithm(AlgorithmConfig(clip_range=0.5), where="x").clip_range == 0.5
    with pytest.raises(ConfigError, match=r"^run\.yaml: algorithm\.clip_range: expected a number, got str"):
        backend.check_algorithm(AlgorithmConfig(clip_range="wide"), where="run.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.clip_range'"):
        backend.check_algorithm(AlgorithmConfig(algorithm_type="sft", clip_range=0.5), where="run.yaml")


def test_run_config_accepts_shorthand_in_python() -> None:
    def my_judge(task, response):
        return 1.0

    run = RunConfig(workflow="pkg:wf", judges=my_judge, algorithm={"group_size": 4})
    assert run.workflow == ComponentSpec(ref="pkg:wf")
    assert [j.ref for j in run.judges] == [my_judge]
    assert run.algorithm.group_size == 4
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.grop_size' \(did you mean 'group_size'\?\)"):
        _ToyBackend().check_algorithm(RunConfig(workflow="pkg:wf", algorithm={"grop_size": 4}).algorithm, where="r")


def test_metric_names() -> None:
    def accuracy(task, response):
        return 1.0

    assert ComponentSpec(ref="pkg.mod:Judges.exact").metric_name == "exact"
    assert ComponentSpec(ref="math_judge").metric_name == "math_judge"
    assert ComponentSpec(ref=accuracy).metric_name == "accuracy"
    assert ComponentSpec(ref=accuracy, name="acc").metric_name == "acc"


def test_duplicate_judge_metric_names_rejected() -> None:
    with pytest.raises(ConfigError, match=r"judges\[1\].*'exact'"):
        RunConfig(workflow="m:w", judges=["a:exact", "b:exact"])
    run = RunConfig(workflow="m:w", judges=["a:exact", {"ref": "b:exact", "name": "exact_b"}])
    assert [j.metric_name for j in run.judges] == ["exact", "exact_b"]


def test_strict_weights() -> None:
    judges = [{"ref": "m:a", "weight": 0.5}, {"ref": "m:b", "weight": 0.2}, {"ref": "m:g", "gate": True}]
    assert len(RunConfig(workflow="m:w", judges=judges).judges) == 3
    with pytest.raises(ConfigError, match=r"judges: weights sum to 0\.7"):
        RunConfig(workflow="m:w", judges=judges, reward={"strict_weights": True})
    judges[1]["weight"] = 0.5
    assert RunConfig(workflow="m:w", judges=judges, reward={"strict_weights": True}).reward.strict_weights


def test_min_group_size_cannot_exceed_group_size() -> None:
    with pytest.raises(ConfigError, match="runner.min_group_size"):
        RunConfig(workflow="m:w", algorithm={"group_size": 2}, runner={"min_group_size": 3})


def test_api_key_from_env_and_never_serialized(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REINFORGE_TEST_KEY", "sk-from-env")
    model = ModelConfig(model_path="gpt-4o-mini", api_key_env="REINFORGE_TEST_KEY")
    assert model.resolved_api_key() == "sk-from-env"
    monkeypatch.delenv("REINFORGE_TEST_KEY")
    with pytest.raises(ConfigError, match="REINFORGE_TEST_KEY"):
        model.resolved_api_key()
    secret = ModelConfig(model_path="gpt-4o-mini", api_key="sk-secret")
    assert secret.resolved_api_key() == "sk-secret"
    assert "sk-secret" not in repr(secret)
    assert "api_key" not in to_dict(secret)
    dump_run(RunConfig(workflow="m:w", model=secret), tmp_path / "out.yaml")
    assert "sk-secret" not in (tmp_path / "out.yaml").read_text()
    with pytest.raises(ConfigError, match="api_key"):
        ModelConfig(model_path="m", api_key="k", api_key_env="K")


def test_as_component() -> None:
    def fn(task, response):
        return 0.0

    assert as_component("mod:fn") == ComponentSpec(ref="mod:fn")
    assert as_component(fn).ref is fn
    assert as_component({"name": "math_judge", "weight": 0.5}) == ComponentSpec(
        ref="math_judge", name="math_judge", weight=0.5
    )
    assert as_component({"name": "judges:fmt", "metric": "format", "weight": 0.2}) == ComponentSpec(
        ref="judges:fmt", name="format", weight=0.2
    )
    with pytest.raises(ConfigError, match="metric"):
        as_component({"ref": "j", "name": "a", "metric": "b"})
    with pytest.raises(ConfigError, match=r"tune\(judges\): unknown key 'wieght' \(did you mean 'weight'\?\)"):
        as_component({"ref": "j", "wieght": 1}, where="tune(judges)")
    with pytest.raises(ConfigError, match="tune.*got int 5"):
        as_component(5, where="tune(judge_func)")


def test_build_run_merges_options_and_names_the_caller() -> None:
    run = build_run(
        {"workflow": "m:w", "judges": [], "algorithm": AlgorithmConfig(group_size=4)},
        options={"runner": {"max_retries": 0}},
    )
    assert run.runner.max_retries == 0 and run.algorithm.group_size == 4
    # a key core does not know may be a plugin's section: it is checked against the run's registry
    typo = build_run({"workflow": "m:w"}, options={"runer": {}})
    with pytest.raises(ConfigError, match=r"tune\(\): unknown key 'runer' \(did you mean 'runner'\?\)"):
        check_sections(typo, Registry())
    with pytest.raises(ConfigError, match="given twice"):
        build_run({"workflow": "m:w", "backend": "local"}, options={"backend": "trinity"})


# --------------------------------------------------------------------------- from_dict


def test_from_dict_unknown_key_with_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(RunConfig, {"workflow": "m:w", "model": {"model_path": "m", "max_tokns": 8}})
    assert str(info.value) == "run.yaml: unknown key 'model.max_tokns' (did you mean 'max_tokens'?)"


def test_from_dict_top_level_unknown_key() -> None:
    with pytest.raises(ConfigError, match=r"exp\.yaml: unknown key 'judgez' \(did you mean 'judges'\?\)"):
        from_dict(RunConfig, {"workflow": "m:w", "judgez": []}, where="exp.yaml")


@pytest.mark.parametrize(
    "data, key, expected, got",
    [
        ({"algorithm": {"group_size": "eight"}}, "algorithm.group_size", "an integer", "str 'eight'"),
        ({"algorithm": {"learning_rate": "fast"}}, "algorithm.learning_rate", "a number", "str 'fast'"),
        ({"runner": {"drop_incomplete_groups": "yes"}}, "runner.drop_incomplete_groups", "true or false", "str"),
        ({"judges": [{"ref": "m:j", "weight": "heavy"}]}, "judges[0].weight", "a number", "str 'heavy'"),
        ({"judges": {"ref": "m:j"}}, "judges", "a list", "dict"),
        ({"model": {"model_path": 5}}, "model.model_path", "a string", "int 5"),
        (
            {"auxiliary_models": {"judge": {"model_path": "x", "top_p": [1]}}},
            "auxiliary_models.judge.top_p",
            "a number",
            "list",
        ),
        ({"algorithm": 3}, "algorithm", "a mapping", "int 3"),
        ({"train_dataset": {"path": "d", "limit": 1.5}}, "train_dataset.limit", "an integer or null", "float 1.5"),
    ],
)
def test_from_dict_wrong_types_name_key_expected_and_got(data: dict, key: str, expected: str, got: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(RunConfig, {"workflow": "m:w", **data})
    msg = str(info.value)
    assert msg.startswith(f"run.yaml: {key}: expected {expected}"), msg
    assert f"got {got}" in msg


def test_from_dict_missing_required_keys() -> None:
    with pytest.raises(ConfigError, match="run.yaml: missing required key 'workflow'"):
        from_dict(RunConfig, {})
    with pytest.raises(ConfigError, match=r"missing required key 'judges\[0\]\.ref'"):
        from_dict(RunConfig, {"workflow": "m:w", "judges": [{"weight": 1}]})
    with pytest.raises(ConfigError, match="missing required key 'model.model_path'"):
        from_dict(RunConfig, {"workflow": "m:w", "model": {}})


def test_from_dict_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="run.yaml: the top level must be a mapping"):
        from_dict(RunConfig, ["workflow"])


def test_from_dict_key_prefix() -> None:
    with pytest.raises(ConfigError, match=r"run.yaml: algorithm\.group_size: must be at least 1"):
        from_dict(AlgorithmConfig, {"group_size": 0}, key_prefix="algorithm")


def test_from_dict_judge_shorthand() -> None:
    run = from_dict(RunConfig, {"workflow": "m:w", "judge": "m:j"})
    assert run.judges == [ComponentSpec(ref="m:j")]
    with pytest.raises(ConfigError, match="judge"):
        from_dict(RunConfig, {"workflow": "m:w", "judge": "m:j", "judges": ["m:k"]})


def test_source_and_base_dir_are_not_yaml_keys() -> None:
    with pytest.raises(ConfigError, match="unknown key 'source'"):
        from_dict(RunConfig, {"workflow": "m:w", "source": "x.yaml"})


# --------------------------------------------------------------------------- load_run


def test_load_run_full_file_and_round_trip(tmp_path: Path, dataset_dir: Path) -> None:
    module = write_module(tmp_path, USER_FUNCS)
    path = write_run(
        tmp_path,
        f"""
        project_name: demo
        experiment_name: exp1
        workflow: {{ref: "{module}:workflow", args: {{temperature: 0.2}}}}
        judges:
          - {{ref: "{module}:judge", weight: 0.7, args: {{tolerance: 0.5}}, kind: rule}}
          - {{ref: "{module}:other_judge", weight: 0.3, metric_weights: {{exact: 2}}}}
        train_dataset: {{path: my_dataset, split: train, total_epochs: 2}}
        eval_dataset: {{path: my_dataset/test.jsonl, split: test}}
        model: {{model_path: Qwen/Qwen3-0.6B, max_model_len: 16384, api_key_env: OPENAI_API_KEY}}
        auxiliary_models:
          judge_model: {{model_path: gpt-4o-mini, api_base: "http://localhost:8000/v1"}}
        algorithm: {{algorithm_type: multi_step_grpo, learning_rate: 1e-6, group_size: 4, batch_size: 8}}
        runner: {{max_concurrency: 4, rollout_timeout_s: 30}}
        reward: {{strict_weights: true, scores: {{empty: -1, truncated: 0}}}}
        eval: {{accuracy_key: exact, threshold: 0.5}}
        """,
    )
    run = load_run(path)
    assert run.source == str(path.resolve()) and run.base_dir == str(tmp_path.resolve())
    assert run.algorithm.learning_rate == 1e-6 and run.runner.rollout_timeout_s == 30.0
    assert run.judges[0].args == {"tolerance": 0.5} and run.judges[1].metric_weights == {"exact": 2.0}
    assert run.reward.scores.empty == -1.0 and run.reward.scores.truncated == 0.0
    assert run.train_dataset.rows() == ROWS and run.eval_dataset.rows() == TEST_ROWS
    assert run.model.max_model_len == 16384 and run.auxiliary_models["judge_model"].api_base.endswith("/v1")

    copy = tmp_path / "elsewhere" / "copy.yaml"
    copy.parent.mkdir()
    dump_run(run, copy)
    again = load_run(copy)
    assert to_dict(again) == to_dict(run)
    assert again.train_dataset.rows() == ROWS


def test_load_run_relative_paths_follow_the_run_file(
    tmp_path: Path, dataset_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = write_module(tmp_path, USER_FUNCS)
    path = write_run(tmp_path, f"workflow: {module}:workflow\ntrain_dataset: {{path: my_dataset}}\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    before = list(sys.path)
    run = load_run(path)
    assert sys.path == before
    assert Path(run.train_dataset.path) == dataset_dir.resolve()
    assert run.train_dataset.rows() == ROWS


def test_load_run_missing_dataset_path_names_file_and_key(tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: m:w\ntrain_dataset: {path: data/missing.jsonl}\n")
    with pytest.raises(ConfigError) as info:
        load_run(path)
    msg = str(info.value)
    assert str(path) in msg and "train_dataset.path" in msg and "'data/missing.jsonl' does not exist" in msg


def test_load_run_unknown_split_names_file(tmp_path: Path, dataset_dir: Path) -> None:
    module = write_module(tmp_path, USER_FUNCS)
    path = write_run(tmp_path, f"workflow: {module}:workflow\neval_dataset: {{path: my_dataset, split: dev}}\n")
    run = load_run(path)
    with pytest.raises(ConfigError) as info:
        run.eval_dataset.load()
    msg = str(info.value)
    assert "eval_dataset.split" in msg and str(path) in msg and "train, test" in msg


def test_load_run_unknown_key_names_file(tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: m:w\nrunner:\n  max_retrys: 8\n")
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert str(info.value) == f"{path}: unknown key 'runner.max_retrys' (did you mean 'max_retries'?)"


def test_load_run_wrong_type_names_file(tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: m:w\nalgorithm: {group_size: eight}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: algorithm\.group_size: expected an integer, got str 'eight'"):
        load_run(path)


def test_load_run_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: m:w\nalgorithm:\n  group_size: [8\n  batch_size: 2\n")
    with pytest.raises(ConfigError) as info:
        load_run(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:") and "invalid YAML" in msg
    line = int(msg[len(str(path)) + 1 :].split(":")[0])
    assert 3 <= line <= 5


def test_load_run_duplicate_key_names_line(tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: m:w\nalgorithm: {group_size: 2}\nalgorithm: {group_size: 4}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3:1: invalid YAML: duplicate key 'algorithm'"):
        load_run(path)


def test_load_run_empty_or_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="empty"):
        load_run(write_run(tmp_path, "# nothing\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_run(write_run(tmp_path, "- workflow\n", name="list.yaml"))


def test_load_run_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_run(tmp_path / "nope.yaml")


def test_load_run_ref_that_does_not_import(tmp_path: Path) -> None:
    path = write_run(tmp_path, "workflow: not_a_module_xyz:workflow\n")
    with pytest.raises(ResolveError) as info:
        load_run(path)
    msg = str(info.value)
    assert str(path) in msg and "workflow" in msg and "'not_a_module_xyz'" in msg


def test_load_run_ref_with_missing_attribute(tmp_path: Path) -> None:
    module = write_module(tmp_path, USER_FUNCS)
    path = write_run(tmp_path, f"workflow: {module}:workflow\njudge: {module}:jduge\n")
    with pytest.raises(ResolveError) as info:
        load_run(path)
    msg = str(info.value)
    assert str(path) in msg and "judges[0]" in msg and "'jduge'" in msg and module in msg
    assert "did you mean 'judge'" in msg


def test_load_run_bad_args_name_the_function(tmp_path: Path) -> None:
    module = write_module(tmp_path, USER_FUNCS)
    path = write_run(
        tmp_path, f"workflow: {module}:workflow\njudge: {{ref: '{module}:judge', args: {{tolerence: 1}}}}\n"
    )
    with pytest.raises(SignatureError) as info:
        load_run(path)
    msg = str(info.value)
    assert str(path) in msg and "judges[0]" in msg and "'tolerence'" in msg and f"{module}:judge" in msg


def test_load_run_unknown_registered_name_with_registry(tmp_path: Path) -> None:
    from reinforge.plugins import Component, Registry

    registry = Registry()
    registry.components["workflows"]["react"] = Component("workflows", "react", lambda task, model: None, "x")
    path = write_run(tmp_path, "workflow: reakt\n")
    assert load_run(path).workflow.ref == "reakt"  # names are checked only against a registry
    with pytest.raises(ResolveError) as info:
        load_run(path, registry=registry)
    assert str(path) in str(info.value) and "'reakt'" in str(info.value) and "react" in str(info.value)


def test_load_run_warns_about_inline_api_key(tmp_path: Path) -> None:
    module = write_module(tmp_path, USER_FUNCS)
    path = write_run(tmp_path, f"workflow: {module}:workflow\nmodel: {{model_path: m, api_key: sk-x}}\n")
    with pytest.warns(UserWarning, match="api_key_env"):
        load_run(path)


def test_import_does_not_load_extras() -> None:
    code = "import sys, reinforge.config; print(sorted(m for m in ('yaml', 'datasets') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
