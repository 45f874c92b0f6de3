"""eval_run_bugs.py's bookkeeping (no torchdoctor run): which heldout bugs are not blind.

    .venv/bin/python -m pytest bench/realcode/run_bugs/test_eval_run_bugs.py -p no:xdist
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eval_run_bugs  # noqa: E402


def test_a_heldout_bug_sharing_a_dev_bugs_source_is_not_blind() -> None:
    bugs = [
        {"id": "dev_a", "split": "dev", "source": "https://github.com/o/r/pull/49"},
        {"id": "held_same", "split": "heldout", "source": "https://github.com/O/R/pull/49/#issuecomment-1"},
        {"id": "held_other", "split": "heldout", "source": "https://github.com/o/r/pull/50"},
        {"id": "held_none", "split": "heldout"},
    ]
    assert eval_run_bugs.shared_sources(bugs) == {"held_same"}


def test_the_real_label_file_is_consistent() -> None:
    bugs = eval_run_bugs.load_bugs(eval_run_bugs.HERE / "bugs.jsonl")
    assert eval_run_bugs.check_markers(bugs) == []
    shared = eval_run_bugs.shared_sources(bugs)
    assert shared <= {b["id"] for b in bugs if b["split"] == "heldout"}
