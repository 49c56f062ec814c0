"""Built by core, the react workflow looks tools up with the run's plugins and imports them next to the run file."""

from pathlib import Path

from reinforge import hookimpl
from reinforge.plugin import ComponentSpec, RunConfig, build_job, get_plugin_manager, load_run
from reinforge_rollouts_react import tool


@tool
def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: The text.
    """
    return text.upper()


class ShoutTools:
    @hookimpl
    def register_tools(self, register):
        register(shout)


def test_tool_names_are_looked_up_with_the_runs_plugin_manager():
    pm = get_plugin_manager()
    pm.register(ShoutTools(), name="shout-tools")  # a plugin of this run only, not installed
    run = RunConfig(workflow=ComponentSpec(ref="react", args={"tools": ["shout", "calculator"]}))
    job = build_job(run, pm)
    assert [t.name for t in job.workflow.func.tools] == ["shout", "calculator"]
    job.close()


def test_module_attr_tools_import_from_the_run_files_folder(tmp_path: Path):
    (tmp_path / "my_tools_for_react.py").write_text(
        "from reinforge_rollouts_react import tool\n\n"
        "@tool\ndef echo(text: str) -> str:\n"
        '    """Echo a text.\n\n    Args:\n        text: The text.\n    """\n    return text\n'
    )
    (tmp_path / "run.yaml").write_text("workflow: {name: react, args: {tools: ['my_tools_for_react:echo']}}\n")
    job = build_job(load_run(tmp_path / "run.yaml"))
    assert [t.name for t in job.workflow.func.tools] == ["echo"]
    job.close()
