"""Outputs never replace what the user owns (launcher/outputs/output_paths.py, docs/bad_inputs.md): every refusal is
exit 2 and one line, before anything is read or written, and every file the user had hashes the same
afterwards. Real commands in this process; the stored run and its export (no DeepSpeed job)."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from launcher.cli import main as cli_main
from launcher.outputs.output_paths import writer_lock
from tests.support.bad_inputs import refused, snapshot
from tests.support.corpus_files import english_paragraphs
from tests.support.helpers import run_config_dict, write_yaml


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A user's corpus folder: one .txt of real English, one paragraph per line."""
    root = tmp_path_factory.mktemp("corpus") / "C"
    root.mkdir()
    lines = [p.replace("\n", " ") for p in english_paragraphs(4)]
    (root / "good.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """A folder of the user's own files, with the names our outputs use."""
    user = tmp_path / "U"
    (user / "train").mkdir(parents=True)
    (user / "train" / "notes.txt").write_text("notes\n")
    (user / "metrics.jsonl").write_text('{"mine": 1}\n')
    return user


def _own_csv(path: Path, rows: int = 6) -> Path:
    lines = ["text,label"] + [f"text number {i},{'pos' if i % 2 else 'neg'}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- row 1: data prepare into a user's folder, into or around its input -------------------------------


def test_prepare_refuses_a_user_folder_and_its_own_input(capsys, corpus, user_dir, tmp_path):
    good = corpus / "good.txt"
    line = refused(capsys, ["data", "prepare", "--input", good, "--out", user_dir], [corpus, user_dir])
    assert f"--out {user_dir}: not empty and not prepared data; it holds metrics.jsonl, train/" in line
    line = refused(capsys, ["data", "prepare", "--input", corpus, "--out", corpus], [corpus])
    assert f"--out {corpus}: is the input --input {corpus}" in line
    line = refused(capsys, ["data", "prepare", "--input", corpus, "--out", corpus / "prep"], [corpus])
    assert f"--out {corpus / 'prep'}: is inside the input --input {corpus}" in line
    line = refused(capsys, ["data", "prepare", "--input", good, "--out", corpus.parent], [corpus])
    assert f"--out {corpus.parent}: contains the input --input {good}" in line


# --- row 2: an output that is an input or another output ----------------------------------------------


def test_finetune_and_eval_mlm_never_write_over_an_input_or_another_output(capsys, stored_export, tmp_path):
    train, dev = _own_csv(tmp_path / "t.csv"), _own_csv(tmp_path / "d.csv", 4)
    owned = [train, dev, stored_export]
    base = ["finetune", stored_export, "--train", train, "--dev", dev]
    assert f"--predictions {train}: is the input --train {train}" in refused(
        capsys, [*base, "--predictions", train], owned)
    assert f"--out {dev}: is the input --dev {dev}" in refused(capsys, [*base, "--out", dev], owned)
    report = tmp_path / "f.csv"
    assert f"--out {report}: is --predictions {report} of the same command" in refused(
        capsys, [*base, "--out", report, "--predictions", report], owned)
    text = tmp_path / "x.txt"
    text.write_text("some text of the user\n")
    assert f"--out {text}: is the input --input {text}" in refused(
        capsys, ["eval-mlm", stored_export, "--input", text, "--out", text], [text, stored_export])


# --- row 3: an earlier export holding the user's files --------------------------------------------------


def test_export_over_an_earlier_export_with_user_files_names_them(capsys, stored_run, stored_export, tmp_path):
    out = tmp_path / "export"
    shutil.copytree(stored_export, out)
    (out / "notes.txt").write_text("mine\n")
    (out / "my-classifier").mkdir()
    (out / "my-classifier" / "config.json").write_text("{}\n")
    line = refused(capsys, ["export", stored_run, "--out", out, "--no-verify"], [out, stored_run])
    assert (f"--out {out}: the earlier export there also holds my-classifier/, notes.txt, which replacing it "
            f"would delete") in line


# --- row 4: pretrain --run-dir on a user's folder or prepared data --------------------------------------


def test_pretrain_refuses_a_run_dir_that_is_not_one(capsys, user_dir, tiny_data, tmp_path):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data))
    base = ["pretrain", "--num_gpus", "1", "--config", config, "--dry-run", "--run-dir"]
    line = refused(capsys, [*base, user_dir], [user_dir])
    assert f"--run-dir {user_dir}: not empty and not a run directory; it holds metrics.jsonl, train/" in line
    line = refused(capsys, [*base, tiny_data], [tiny_data])
    assert f"--run-dir {tiny_data}: not empty and not a run directory; it is prepared data (roformer data " \
           f"prepare)" in line


# --- row 5: two data prepares into one directory --------------------------------------------------------


def test_a_second_prepare_into_the_same_directory_is_refused(capsys, corpus, tmp_path):
    out = tmp_path / "prepared"
    with writer_lock("--out", out, "roformer data prepare"):  # the first prepare, still writing
        line = refused(capsys, ["data", "prepare", "--input", corpus / "good.txt", "--out", out], [corpus])
    assert f"--out {out}: another roformer data prepare (pid " in line and "is writing it now" in line
    assert not out.exists()


# --- row 6: URLs where a local path is meant ------------------------------------------------------------


def test_urls_are_refused_where_a_local_path_is_meant(capsys, corpus, stored_run, tiny_data, tmp_path,
                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = corpus / "good.txt"
    for argv, flag, url in (
            (["data", "tokenizer", "--input", good, "--out", "s3://b/d"], "--out", "s3://b/d"),
            (["export", stored_run, "--out", "hdfs://nn/e"], "--out", "hdfs://nn/e"),
            (["pretrain", "--config", "c.yaml", "--run-dir", "s3://b/run"], "--run-dir", "s3://b/run")):
        line = refused(capsys, argv, [corpus, stored_run])
        assert f"{flag} {url}: a {url.split(':')[0]}:// URL, but a local path is expected" in line
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir="http://host/data"))
    line = refused(capsys, ["plan", "--world-size", "1", "--config", config], [tmp_path])
    assert f"{config}: data.data_dir http://host/data: a http:// URL, but a local path is expected" in line
    assert not list(tmp_path.glob("s3:*")) and not list(tmp_path.glob("hdfs:*"))


# --- row 10: the rendezvous port in use -----------------------------------------------------------------


def test_a_port_in_use_is_named_before_the_ranks_start_and_creates_nothing(capsys, tiny_data, tmp_path):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data))
    run_dir = tmp_path / "run"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", config, "--run-dir", run_dir,
                                "--master_port", port], [tiny_data])
    assert f"--master_port {port}: port {port} is in use on this machine" in line and "pass another" in line
    assert not run_dir.exists()  # checked before the run-directory lock: a refusal creates nothing (issue 49 row 13)


# --- row 14: a file where a directory is meant, and the reverse -----------------------------------------


def test_a_file_for_a_directory_and_a_directory_for_a_file_are_one_line(capsys, corpus, stored_run,
                                                                       stored_export, tmp_path):
    existing_dir, existing_file = tmp_path / "somedir", tmp_path / "somefile"
    existing_dir.mkdir()
    existing_file.write_text("mine\n")
    owned = [existing_dir, existing_file, stored_run]
    line = refused(capsys, ["eval-mlm", stored_export, "--input", corpus / "good.txt", "--out", existing_dir],
                   owned)
    assert f"--out {existing_dir}: is a directory; give a file name" in line
    line = refused(capsys, ["report", stored_run, "--out", existing_file], owned)
    assert f"--out {existing_file}: exists and is not a directory" in line
    line = refused(capsys, ["data", "prepare", "--input", corpus / "good.txt", "--out", existing_file], owned)
    assert f"--out {existing_file}: exists and is not a directory" in line


# --- rows 16 and 21: which files an input names ----------------------------------------------------------


def test_a_literal_name_wins_over_a_glob_and_prepared_data_below_an_input_is_skipped(capsys, corpus, tiny_data,
                                                                                      tmp_path):
    folder = tmp_path / "C"
    shutil.copytree(corpus, folder)
    starred = folder / "star[1].txt"
    shutil.move(folder / "good.txt", starred)
    shutil.copytree(tiny_data, folder / "prep")  # prepared earlier below the corpus: its manifest is no text
    before = snapshot(folder)
    out = tmp_path / "out"
    tokenizer = tiny_data / "tokenizer" / "spm.model"
    for inputs in ([starred], [folder]):
        shutil.rmtree(out, ignore_errors=True)
        rc = cli_main(["data", "prepare", "--input", *map(str, inputs), "--out", str(out), "--tokenizer",
                       str(tokenizer), "--valid-fraction", "0.2"])
        assert rc == 0, capsys.readouterr().err
        assert (out / "manifest.json").is_file()
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    files = [f for source in manifest["sources"] for f in source["files"]]
    assert [Path(f["path"]).name if isinstance(f, dict) else Path(f).name for f in files] == ["star[1].txt"]
    assert snapshot(folder) == before


# --- row 17: a bad restart count in the dry run ---------------------------------------------------------


def test_a_negative_restart_count_is_refused_by_the_dry_run(capsys, tiny_data, tmp_path):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data))
    run_dir = tmp_path / "run"
    for dry in (["--dry-run"], []):
        line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", config, "--run-dir", run_dir,
                                "--max-restarts", "-1", *dry], [tiny_data])
        assert "--max-restarts -1: must be >= 0" in line
        assert not run_dir.exists()


# --- row 22: finetune's ranges, and dev read from the train file ----------------------------------------


def test_finetune_states_the_valid_range(capsys, stored_export, tmp_path):
    train = _own_csv(tmp_path / "t.csv")
    base = ["finetune", stored_export, "--train", train, "--dev", train]
    assert "--max-length: invalid value 1: must be an integer >= 8" in refused(
        capsys, [*base, "--max-length", "1"], [train, stored_export])
    assert "--epochs: invalid value 0: must be >= 1 (0 only for retrieval)" in refused(
        capsys, [*base, "--epochs", "0"], [train, stored_export])


def test_dev_read_from_the_train_file_is_a_warning(tmp_path):
    from launcher.commands.finetune import same_file_note
    from launcher.downstream.task_spec import TaskSpec

    train = _own_csv(tmp_path / "t.csv")
    note = same_file_note(TaskSpec(name="t", train=train, dev=train))
    assert note.startswith(f"--dev {train} is the --train file: its scores are on training examples")
    assert same_file_note(TaskSpec(name="t", train=train, dev=_own_csv(tmp_path / "d.csv"))) is None
