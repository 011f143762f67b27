"""`roformer export --average-last N` of the real trainer's run (the session's `trainer_run`: 2 ranks, ZeRO-2,
3 checkpoints kept): the averaged export's weights are the mean of the single exports' weights, and the
export lists what it averaged. No training here: only exports of the fixture's checkpoints."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from launcher.cli import main as cli_main
from launcher.export.exporter import export_checkpoint
from launcher.common.io import file_sha256


def test_average_of_checkpoints_is_the_mean_of_their_single_exports(trainer_run, tmp_path, capsys):
    tags = sorted((p.name for p in (trainer_run / "checkpoints").iterdir() if (p / "sidecar.json").is_file()),
                  key=lambda tag: int(tag.removeprefix("global_step")))
    assert len(tags) == 3, tags
    singles = [load_file(export_checkpoint(trainer_run, tmp_path / tag, tag=tag, verify=False) / "model.safetensors")
               for tag in tags]

    out = tmp_path / "averaged"
    assert cli_main(["export", str(trainer_run), "--average-last", "3", "--out", str(out)]) == 0  # parity-checked
    assert f"exported the mean of {', '.join(tags)} (newest at step 16" in capsys.readouterr().out
    averaged = load_file(out / "model.safetensors")

    assert set(averaged) == set(singles[0])
    moved = 0
    for name, tensor in averaged.items():
        stacked = torch.stack([single[name] for single in singles])
        mean = stacked.to(torch.float64).mean(0).to(torch.float32)
        torch.testing.assert_close(tensor, mean, rtol=1e-6, atol=1e-7, msg=name)
        moved += not torch.equal(stacked[0], stacked[-1])
    assert moved > 10  # the checkpoints differ, so the mean is none of them

    info = json.loads((out / "export_info.json").read_text())
    assert [a["tag"] for a in info["averaged"]] == tags and info["tag"] == tags[-1]
    assert [a["step"] for a in info["averaged"]] == [int(t.removeprefix("global_step")) for t in tags]
    for entry in info["averaged"]:
        assert entry["sidecar_sha256"] == file_sha256(trainer_run / "checkpoints" / entry["tag"] / "sidecar.json")
    card = (out / "README.md").read_text()
    assert f"at the mean of 3 checkpoints (`{tags[0]}`" in card and "## Averaged checkpoints" in card
    assert all(f"| {tag} |" in card for tag in tags)

    # --average with the same tags, in any order, is the same export.
    again = tmp_path / "named"
    assert cli_main(["export", str(trainer_run), "--average", ",".join(reversed(tags)), "--out", str(again),
                     "--no-verify"]) == 0
    named = load_file(again / "model.safetensors")
    assert named.keys() == averaged.keys() and all(torch.equal(named[k], averaged[k]) for k in averaged)
