"""A training run killed at a chosen step, for resume tests: ``train(..., on_step=kill_at(n))`` raises
:class:`Killed` once step ``n`` is done (after its checkpoint, if one falls there)."""


class Killed(Exception):
    pass


def kill_at(n):
    def hook(step, model):
        if step == n:
            raise Killed

    return hook
