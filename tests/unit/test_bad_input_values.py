"""Bad values and broken files get one line naming the flag, file or row, exit 2, and change nothing the
user owns (docs/bad_inputs.md): dependency errors (gzip, SentencePiece, datasets) in our words, sizes that
cannot fit refused with the estimate. Real commands in this process; the stored run's export (no DeepSpeed job)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from launcher.cli import main as cli_main
from tests.support.bad_inputs import refused
from tests.support.corpus_files import chinese_paragraphs, english_paragraphs
from tests.support.helpers import run_config_dict, write_schedule, write_yaml

ONE_STAGE = [{"name": "one", "max_seq_len": 32, "global_batch_size": 8, "steps": 2}]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """A user's files: English text, a short text, a corrupt .jsonl.gz, labelled CSV / JSONL files."""
    root = tmp_path_factory.mktemp("texts")
    lines = [" ".join(p.split()) for p in english_paragraphs(4)]
    (root / "good.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "short.txt").write_text(" ".join(lines[0].split()[:40]) + "\n", encoding="utf-8")
    packed = bytearray(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in lines).encode()))
    packed[200:260] = bytes(b ^ 0x55 for b in packed[200:260])  # damaged inside the deflate stream
    (root / "corrupt.jsonl.gz").write_bytes(bytes(packed))
    rows = [(f"{lines[i][:80]}", "pos" if i % 2 else "neg") for i in range(8)]
    (root / "train.csv").write_text("text,label\n" + "".join(f'"{t}",{label}\n' for t, label in rows))
    (root / "empty.csv").write_text("text,label\n")
    return root


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --- row 7: data without a validation split ------------------------------------------------------------


def test_data_without_a_validation_split_is_named_by_plan(capsys, texts, tiny_data, tmp_path):
    out = tmp_path / "no_valid"
    rc = cli_main(["data", "prepare", "--input", str(texts / "good.txt"), "--out", str(out), "--tokenizer",
                   str(tiny_data / "tokenizer" / "spm.model"), "--valid-fraction", "0"])
    err = capsys.readouterr().err
    assert rc == 0 and "warning: --valid-fraction 0: no validation split; `roformer pretrain` refuses" in err
    schedule = write_schedule(tmp_path / "schedule.yaml", ONE_STAGE)
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=out, schedule_file=schedule))
    line = refused(capsys, ["plan", "--world-size", "1", "--config", config], [out, texts])
    assert f"{out / 'manifest.json'}: no validation split (prepared with --valid-fraction 0)" in line
    assert "corpus too small" not in line


# --- row 8: warm-up as long as the run -----------------------------------------------------------------


def test_warmup_as_long_as_the_run_is_a_note(capsys, tiny_data, tmp_path):
    schedule = write_schedule(tmp_path / "schedule.yaml", ONE_STAGE)
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data, schedule_file=schedule,
                                                               optimizer={"warmup_steps": 40}))
    capsys.readouterr()
    assert cli_main(["plan", "--world-size", "1", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert (f"roformer plan: note: {config}: optimizer.warmup_steps 40 is not shorter than the run (2 steps): the "
            f"whole run is warm-up") in err


# --- row 11: sizes that cannot fit ---------------------------------------------------------------------


def test_sizes_that_cannot_fit_are_refused_with_the_estimate(capsys, stored_run, stored_export, texts, tmp_path):
    out = tmp_path / "export"
    line = refused(capsys, ["export", stored_run, "--out", out, "--max-positions", "100000000"], [stored_run, tmp_path])
    assert "--max-positions 100,000,000: needs about " in line and "GiB of memory (transformers builds its RoPE table" \
        in line and "available on this machine" in line
    assert not list(tmp_path.iterdir())  # no .export.tmp-* left
    line = refused(capsys, ["eval-mlm", stored_export, "--input", texts / "good.txt", "--seq-lens", "64,100000000"],
                   [stored_export, texts])
    assert "--seq-lens 100,000,000: needs about " in line and "attention scores" in line


# --- row 12: labels that break a numeric column; dict and list cells -----------------------------------


def test_broken_numeric_labels_and_nested_cells_are_named(capsys, stored_export, texts, tmp_path):
    text = [" ".join(p.split())[:60] for p in english_paragraphs(1)[:8]]
    scores = [{"text": t, "label": 0.5 + i} for i, t in enumerate(text)]
    owned = [texts, stored_export]

    def fails(records, name):
        path = _jsonl(tmp_path / name, records)
        return path, refused(capsys, ["finetune", stored_export, "--train", path, "--dev", texts / "train.csv"],
                             [*owned, path])

    broken = [dict(r) for r in scores]
    broken[3]["label"] = "N/A"
    path, line = fails(broken, "na.jsonl")
    assert f"{path}: row 4, column 'label': 'N/A' is not a number, but the column's other labels are fractional" in line
    nested = [dict(r) for r in scores]
    nested[2]["label"] = {"x": 1}
    path, line = fails(nested, "dict.jsonl")
    assert f"{path}: row 3, column 'label': a mapping ({{'x': 1}}), not a single text or label" in line
    listed = [dict(r) for r in scores]
    listed[5]["text"] = ["a", "list"]
    path, line = fails(listed, "list.jsonl")
    assert f"{path}: row 6, column 'text': a list (['a', 'list']), not a single text or label" in line


# --- row 13: a corrupt gzip ----------------------------------------------------------------------------


def test_a_corrupt_gzip_is_one_line(capsys, stored_export, texts, tmp_path):
    corrupt = texts / "corrupt.jsonl.gz"
    for lenient in ([], ["--lenient"]):
        line = refused(capsys, ["data", "prepare", "--input", corrupt, "--out", tmp_path / "out", *lenient], [texts],
                       progress=True)
        assert f"{corrupt}: cannot be read (corrupt gzip: " in line
        assert not (tmp_path / "out").exists()
    line = refused(capsys, ["eval-mlm", stored_export, "--input", corrupt], [texts, stored_export])
    assert f"{corrupt}: cannot be read (corrupt gzip: " in line


# --- row 15: a text shorter than the length asked for --------------------------------------------------


def test_a_text_shorter_than_a_length_is_named(capsys, stored_export, texts):
    short = texts / "short.txt"
    line = refused(capsys, ["eval-mlm", stored_export, "--input", short, "--seq-lens", "16,1024"],
                   [texts, stored_export])
    assert "--seq-lens 1024: the --input text holds " in line and "tokens, fewer than one sequence of 1,024" in line


# --- row 19: SentencePiece's error in our words --------------------------------------------------------


def test_a_vocabulary_smaller_than_the_characters_names_our_flags(capsys, tmp_path):
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n".join(" ".join(p.split()) for p in chinese_paragraphs()) + "\n", encoding="utf-8")
    line = refused(capsys, ["data", "prepare", "--input", corpus, "--out", tmp_path / "out", "--vocab-size", "300",
                            "--valid-fraction", "0.1"], [corpus], progress=True)
    assert "--vocab-size 300: smaller than the " in line and "distinct characters SentencePiece keeps at " \
        "--character-coverage 0.9995" in line and "or a lower --character-coverage" in line
    assert "character_coverage" not in line and "trainer_interface" not in line
    assert not (tmp_path / "out").exists()


# --- row 20: a header-only file ------------------------------------------------------------------------


def test_a_header_only_file_has_no_rows(capsys, stored_export, texts):
    empty = texts / "empty.csv"
    line = refused(capsys, ["finetune", stored_export, "--train", texts / "train.csv", "--dev", empty],
                   [texts, stored_export])
    assert line.endswith(f"{empty}: no rows")


# --- row 9: an optimizer of the overrides -------------------------------------------------------------


def test_an_optimizer_of_the_overrides_is_checked_at_plan_time(capsys, tiny_data, tmp_path):
    schedule = write_schedule(tmp_path / "schedule.yaml", ONE_STAGE)
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data, schedule_file=schedule))
    plan = ["plan", "--world-size", "1", "--config", config, "--set"]
    line = refused(capsys, [*plan, "deepspeed.overrides={optimizer: {type: SGD, params: {lr: 0.5}}}"], [tiny_data])
    assert "deepspeed.overrides optimizer.params.lr 0.5: the learning rate comes from the run config's optimizer.lr" \
        in line
    line = refused(capsys, [*plan, "deepspeed.overrides={optimizer: {type: SGD, params: {nesterov_typo: true}}}"],
                   [tiny_data])
    assert "optimizer.params.nesterov_typo: SGD (torch.optim.SGD) takes no 'nesterov_typo'; its parameters: lr," in line
    capsys.readouterr()  # another optimizer's type replaces the section: AdamW's betas never reach SGD
    assert cli_main([*map(str, plan), "deepspeed.overrides={optimizer: {type: SGD, params: {momentum: 0.9}}}"]) == 0


# --- row 18: a rank whose peer went away -----------------------------------------------------------------


def test_a_process_group_error_of_a_peer_gone_is_one_line(tmp_path):
    """Real gloo: rank 0 leaves after the rendezvous, rank 1's all-reduce fails; the error says so in one line.
    (Rank 0 hosts the rendezvous store: leaving before rank 1's init ended failed rank 1's init instead.)"""
    import subprocess
    import sys

    from tests.support.helpers import REPO, free_port

    script = tmp_path / "peer.py"
    script.write_text(
        "import os, sys, time, torch, torch.distributed as dist\n"
        "from launcher.train.peer_errors import peer_gone\n"
        "rank = int(sys.argv[1])\n"
        "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{sys.argv[2]}', rank=rank, world_size=2)\n"
        "ready = sys.argv[3]\n"  # rank 0 (the store's host) leaves only once rank 1's init is over
        "if rank == 0:\n    while not os.path.exists(ready):\n        time.sleep(0.05)\n    os._exit(0)\n"
        "open(ready, 'w').close()\n"
        "time.sleep(2)\n"
        "try:\n    dist.all_reduce(torch.ones(4))\nexcept Exception as err:\n    print('LINE', peer_gone(err))\n"
        "    print('OTHER', peer_gone(ValueError('x')), peer_gone(RuntimeError('a bug')))\n")
    port = str(free_port())
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    ready = str(tmp_path / "rank-1-ready")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, ready], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    out, err = procs[1].communicate(timeout=120)
    procs[0].communicate(timeout=60)
    line = next((x for x in out.splitlines() if x.startswith("LINE ")), None)
    assert line is not None, out + err
    assert line.startswith("LINE RuntimeError: Connection closed by peer") and "pair.cc" not in line and "GLHF" \
        not in line, out
    assert "OTHER None None" in out


def test_a_rendezvous_port_taken_on_rank_0s_node_is_one_line(monkeypatch):
    """Real c10d: the store of rank 0 cannot listen on a taken port (a multi-node job, where the launcher
    cannot try rank 0's node itself); the rank's line names the port and the flag."""
    import socket

    import torch.distributed as dist

    from launcher.train.peer_errors import rank_stop_line

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        with pytest.raises(RuntimeError) as caught:
            dist.TCPStore("127.0.0.1", port, 1, True, timeout=__import__("datetime").timedelta(seconds=5))
    line, code = rank_stop_line(caught.value, "0")
    assert line.startswith(f"pretrain (rank 0): error: the rendezvous port {port} (MASTER_PORT) is in use on rank "
                           f"0's node") and line.endswith("pass another --master_port") and code == 1
    assert rank_stop_line(KeyboardInterrupt(), "1") == ("pretrain (rank 1): stopped by Ctrl-C (SIGINT) during "
                                                        "start-up", 130)
    assert rank_stop_line(RuntimeError("a bug"), "1") is None
