"""`roformer export --max-positions`: how long an input transformers' RoFormer accepts.

On the stored run (tests/fixtures, trained at up to 64 tokens; no process is started): the default
table, an explicit longer one at which transformers' RoFormerForMaskedLM runs with our logits, the
exact limit (one token more raises), the model card and the command's last line saying so."""
from __future__ import annotations

import json

import pytest
import torch

from launcher.export.exporter import MIN_MAX_POSITIONS, export_checkpoint
from launcher.common.errors import UserError
from roformer.hf_interop import load_pretrained
from tests.support.helpers import roformer

TRAINED_LENGTH = 64  # the stored run's longest stage
LONG = 2112  # past transformers' old 1536 limit, and 33x the trained length


def _config(export_dir) -> dict:
    return json.loads((export_dir / "config.json").read_text(encoding="utf-8"))


def _logits_both_ways(export_dir, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    import transformers

    hf = transformers.RoFormerForMaskedLM.from_pretrained(str(export_dir)).eval()
    ours = load_pretrained(export_dir).eval()
    input_ids = torch.randint(5, ours.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return ours(input_ids).logits, hf(input_ids=input_ids).logits


def test_default_table_is_the_larger_of_1536_and_4x_the_trained_length(stored_export):
    info = json.loads((stored_export / "export_info.json").read_text(encoding="utf-8"))
    assert info["max_seq_len_trained"] == TRAINED_LENGTH
    expected = max(MIN_MAX_POSITIONS, 4 * TRAINED_LENGTH)
    assert info["max_positions"] == _config(stored_export)["max_position_embeddings"] == expected


def test_transformers_runs_at_max_positions_with_our_logits_and_not_one_token_more(stored_run, tmp_path):
    out = export_checkpoint(stored_run, tmp_path / "long", max_positions=LONG)
    assert _config(out)["max_position_embeddings"] == LONG
    ours, theirs = _logits_both_ways(out, LONG)
    assert ours.shape == theirs.shape == (1, LONG, ours.shape[-1])
    assert (ours - theirs).abs().max().item() <= 1e-5
    # The card's claim, exactly: one token past the table is where transformers stops.
    import transformers

    hf = transformers.RoFormerForMaskedLM.from_pretrained(str(out)).eval()
    with pytest.raises(IndexError, match="index out of range"), torch.no_grad():
        hf(input_ids=torch.full((1, LONG + 1), 7))
    with torch.no_grad():  # ours has no limit: the same export one token (and 2x) longer
        assert load_pretrained(out)(torch.full((1, 2 * LONG), 7)).logits.shape[1] == 2 * LONG
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"accepts inputs of up to **{LONG:,} tokens**" in card
    assert "raises `IndexError: index out of range in self`" in card
    assert f"trained at up to {TRAINED_LENGTH} tokens" in card
    assert "no maximum length" in card and "roformer eval-mlm" in card


def test_a_table_shorter_than_the_trained_length_is_refused(stored_run, tmp_path):
    with pytest.raises(UserError, match=rf"--max-positions 32: shorter than the {TRAINED_LENGTH} tokens"):
        export_checkpoint(stored_run, tmp_path / "short", max_positions=32)
    assert not (tmp_path / "short").exists()


def test_the_command_names_tag_step_stage_and_limit_without_deepspeed_chatter(stored_run, tmp_path):
    proc = roformer("export", str(stored_run), "--out", str(tmp_path / "cli"), "--max-positions", "3000",
                    timeout=300)
    assert proc.returncode == 0, proc.stderr
    sidecar = json.loads((stored_run / "checkpoints/global_step5/sidecar.json").read_text(encoding="utf-8"))
    stage = f"stage {sidecar['stage_index'] + 1} '{sidecar['stage_name']}'"
    assert proc.stdout.splitlines() == [
        f"exported global_step5 (step 5, {stage}) -> {tmp_path / 'cli'}; transformers' RoFormer accepts inputs "
        f"of up to 3,000 tokens (--max-positions)"]
    # zero_to_fp32's "Processing zero checkpoint ..." lines and its shard-loading bar stay out of sight.
    assert "zero checkpoint" not in proc.stderr and "Loading checkpoint shards" not in proc.stderr, proc.stderr
