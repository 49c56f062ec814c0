"""Without the package that adds it, a command of the monorepo's packages says which package it belongs to."""

import pytest

from reinforge.cli import main


@pytest.mark.parametrize(
    ("argv", "package", "folder"),
    [
        (["report", "x"], "reinforge-report", "report"),
        (["report"], "reinforge-report", "report"),
        (["report", "runs/a", "--threshold", "x=1", "--json"], "reinforge-report", "report"),
        (["serve", "smollm2-135m-instruct"], "reinforge-backend-local", "backend-local"),
        (["online", "serve", "online.yaml"], "reinforge-online", "online"),
    ],
)
def test_a_command_of_a_package_not_installed_names_the_package(argv, package, folder, monkeypatch, capsys):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "")  # no plugin loaded: none of the packages is there
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert f"error: 'reinforge {argv[0]}' is a command of the {package} package, which is not installed" in captured.err
    assert f"pip install ./packages/{folder}" in captured.err
    assert captured.out == ""


def test_an_unknown_command_is_still_an_invalid_choice(monkeypatch, capsys):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "")
    with pytest.raises(SystemExit):
        main(["frobnicate"])
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
