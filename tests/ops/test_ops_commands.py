"""``kinterval ops`` wiring: ``verify``'s exit status and the flags of the table."""

import pytest

from kinterval import cli
from kinterval.ops import commands, verify


@pytest.mark.parametrize("status", [0, 1])
def test_ops_verify_exits_with_the_status_of_the_check(monkeypatch, status):
    monkeypatch.setattr(verify, "main", lambda argv: status)
    assert cli.main(["ops", "verify"]) == status


def test_ops_table_passes_its_flags(monkeypatch, capsys):
    seen = {}
    real = commands.attention_probs

    def probs(s, spec, **kw):
        seen.setdefault("T", s.shape[-1])
        seen.setdefault("s", s.clone())
        if not isinstance(spec, str):
            seen.setdefault("specs", []).append(spec.full_name)
        return real(s, spec, **kw)

    monkeypatch.setattr(commands, "attention_probs", probs)
    argv = ["ops", "--operators", "softmax,lerp-k4", "--T", "4", "--scale", "2", "--seed", "3"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "T=4, score sd 2" in out and seen["T"] == 4 and seen["specs"] == ["softmax", "lerp-k4"]
    first = seen.pop("s")
    seen.clear()
    assert cli.main([*argv[:-1], "4"]) == 0  # another --seed: other scores
    assert not first.equal(seen["s"])
    seen.clear()
    assert cli.main(["ops", "--operators", "fwm-prob-k4", "--T", "2", "--range-grad", "detach"]) == 0
    assert seen["specs"] == ["fwm-prob-k4[range_grad=detach]"]  # --range-grad reaches the spec
