"""doctor/analysis/source.py: the line a non-finite constant of inline loss code was last assigned at."""

from __future__ import annotations

import textwrap

from torchdoctor.analysis.source import last_assignment_line

LOOP = textwrap.dedent('''\
    import torch


    def update(batches, policy, optimizer):
        mask = torch.full((4, 4), float("-inf")).triu(1)
        for obs, returns in batches:
            advantages = returns - returns.mean()
            advantages = advantages / (advantages.std() + 1e-8)
            weights, count = advantages.abs(), len(advantages)
            loss = -(advantages * policy(obs)).mean() + mask.triu(1).sum() * 0
            optimizer.zero_grad()
            loss.backward()
            advantages = None
''')


def _write(tmp_path) -> str:
    path = tmp_path / "loop.py"
    path.write_text(LOOP)
    return str(path)


def test_the_earliest_of_the_last_assignments_before_the_backward_is_named(tmp_path):
    path = _write(tmp_path)
    backward = LOOP.splitlines().index("        loss.backward()") + 1
    # `advantages` was last assigned (before the backward) by the normalisation, and that comes before `weights`
    found = last_assignment_line(path, "update", 4, ["weights", "advantages"], backward)
    assert found == (8, "advantages")
    assert last_assignment_line(path, "update", 4, ["weights"], backward) == (9, "weights")  # tuple unpacking


def test_a_local_that_writes_an_infinity_itself_is_not_a_culprit(tmp_path):
    path = _write(tmp_path)
    assert last_assignment_line(path, "update", 4, ["mask"], 12) is None
    assert last_assignment_line(path, "update", 4, ["mask", "weights"], 12) == (9, "weights")


def test_nothing_is_named_without_an_assignment_before_the_line(tmp_path):
    path = _write(tmp_path)
    assert last_assignment_line(path, "update", 4, ["loss"], 10) is None
    assert last_assignment_line(path, "update", 4, ["absent"], 12) is None
    assert last_assignment_line(str(tmp_path / "missing.py"), "update", 4, ["loss"], 12) is None
