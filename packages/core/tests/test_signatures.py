import asyncio
import threading

import pytest

from reinforge import JudgeOutput, WorkflowOutput
from reinforge.errors import SignatureError
from reinforge.signatures import bind


async def agentscope_workflow(task, model, auxiliary_models=None):
    return WorkflowOutput(response=(task, model, auxiliary_models))


def test_optional_parameters_are_passed_only_when_declared():
    bound = bind(agentscope_workflow, "workflow")
    out = asyncio.run(bound.call({"q": 1}, "m", auxiliary_models={"judge": "j"}, logger="log"))
    assert out.response == ({"q": 1}, "m", {"judge": "j"})

    async def with_logger(task, model, logger=None):
        return WorkflowOutput(response=logger)

    assert asyncio.run(bind(with_logger, "workflow").call({}, None, logger="L")).response == "L"


def test_sync_functions_run_in_a_thread():
    main = threading.get_ident()

    def judge(task, response):
        return JudgeOutput(reward=float(threading.get_ident() != main))

    assert asyncio.run(bind(judge, "judge").call({}, "x")).reward == 1.0


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(task): pass", "expected 'model'"),
        ("def f(model, task): pass", "parameter 1 is 'model', expected 'task'"),
        ("def f(task, model, extra): pass", "parameter 'extra'"),
    ],
)
def test_wrong_signatures_name_the_function_and_parameter(source, message):
    ns = {}
    exec(source, ns)
    with pytest.raises(SignatureError) as err:
        bind(ns["f"], "workflow")
    assert message in str(err.value) and ":f" in str(err.value)


def test_settings_fill_parameters_with_defaults_and_unknown_settings_fail():
    def judge(task, response, field="answer", scale=1.0):
        return JudgeOutput(reward=scale * (response == task[field]))

    bound = bind(judge, "judge", {"field": "gold", "scale": 2.0})
    assert asyncio.run(bound.call({"gold": "a"}, "a")).reward == 2.0
    with pytest.raises(SignatureError, match="no parameter 'feild'"):
        bind(judge, "judge", {"feild": "gold"})
    with pytest.raises(SignatureError, match="'response' is passed by reinforge"):
        bind(judge, "judge", {"response": "x"})


def test_numbers_are_accepted_from_judges_but_other_types_are_not():
    bound = bind(lambda task, response: 0.5, "judge")
    assert bound.check_output(0.5).reward == 0.5
    from reinforge.errors import RewardError

    with pytest.raises(RewardError, match="returned str"):
        bound.check_output("0.5")
