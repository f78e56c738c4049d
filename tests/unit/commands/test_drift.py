"""The read-only drift command's usage and refusals (the report itself: tests/engine/test_drift.py)."""

from talos_proxmox.commands import drift
from tests.paths import STACKS


def test_an_unknown_stack_is_bad_usage(capsys):
    assert drift.main(["--stack", "nope", "--secrets", "/dev/null", "--stacks-dir", str(STACKS)]) == 2
    assert "--stack 'nope'" in capsys.readouterr().err


def test_without_a_bundle_it_says_what_it_needs(capsys):
    assert drift.main(["--stack", "dev", "--stacks-dir", str(STACKS)]) == 2
    assert "--secrets FILE is needed" in capsys.readouterr().err


def test_a_bundle_that_is_not_one_is_named(tmp_path, capsys):
    bad = tmp_path / "secrets.yaml"
    bad.write_text("not: a bundle\n")
    assert drift.main(["--stack", "dev", "--secrets", str(bad), "--stacks-dir", str(STACKS)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not: a bundle" not in err
