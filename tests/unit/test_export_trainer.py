"""logging.stage_end_evals' names and options, checked before any job (no run here). The export of a run made
by the real trainer and the stage-end eval job: tests/multirank/test_export_trainer_multirank.py."""
from __future__ import annotations

import pytest

from launcher.stage_evals.job import validate_eval_names
from launcher.common.errors import UserError


def test_unknown_stage_eval_is_rejected_by_name():
    with pytest.raises(UserError, match="logging.stage_end_evals: unknown eval 'glue'"):
        validate_eval_names(["mlm", "glue"])
    with pytest.raises(UserError, match="bad option 'lr0=1'"):
        validate_eval_names(["inews:lr0=1"])
    with pytest.raises(UserError, match="max_train_examples must be a number"):
        validate_eval_names(["inews:max_train_examples=many"])
