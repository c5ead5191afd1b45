"""``kinterval.atomic.check_target``: the one check that every ``--json FILE`` flag makes before its work."""

import pytest

from kinterval import atomic
from kinterval.cli import main


def test_a_folder_or_a_missing_parent_is_refused_by_the_flag_it_came_from(tmp_path):
    atomic.check_target(tmp_path / "x.json")  # a new file in an existing folder: fine
    with pytest.raises(ValueError, match=r"^--json .*: is a directory; give a file name$"):
        atomic.check_target(tmp_path)
    with pytest.raises(ValueError, match=r"^--out .*x\.json: the folder .*no does not exist$"):
        atomic.check_target(tmp_path / "no" / "x.json", flag="--out")


@pytest.mark.parametrize(
    "argv",
    [
        ["ops", "--T", "8"],
        ["ops", "consistency", "--T", "3"],
        ["data", "overlap", "DATA"],
        ["probes-compare", "a.json", "b.json"],
    ],
)
def test_every_json_flag_refuses_a_folder_before_its_work(tmp_path, capsys, argv):
    argv = [str(tmp_path / "nothing-here") if a == "DATA" else a for a in argv]
    assert main([*argv, "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path}: is a directory; give a file name" in capsys.readouterr().err
