"""Without reinforge-report installed, ``reinforge report`` says which package to install."""

import pytest

from reinforge.cli import main


@pytest.mark.parametrize("argv", [["report", "x"], ["report"], ["report", "runs/a", "--threshold", "x=1", "--json"]])
def test_report_without_the_package_names_it(argv, monkeypatch, capsys):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "")  # no plugin loaded: reinforge-report is not there
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "error: 'reinforge report' needs the reinforge-report package: pip install reinforge-report" in captured.err
    assert captured.out == ""
