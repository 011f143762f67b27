"""Where every publishing command may write, round 2 (issue 49; launcher/outputs/output_paths.py, docs/bad_inputs.md):
our folders are known by our own records, every entry counts (dotfiles, nested folders, edited files),
paths are compared resolved, one writer per resolved path, read-only targets and outputs inside an input
are refused before the work, and dead writers' leftovers are cleaned. Real commands on the stored run and
its export (no DeepSpeed job); each refusal is exit 2, one line, and the user's files hash the same."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.outputs.output_paths import writer_lock
from tests.support.bad_inputs import ran_ok, refused, snapshot
from tests.support.corpus_files import english_paragraphs
from tests.support.helpers import REPO, roformer_env, run_config_dict, write_yaml


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A user's text file: real English, one paragraph per line."""
    good = tmp_path_factory.mktemp("corpus") / "good.txt"
    good.write_text("\n".join(p.replace("\n", " ") for p in english_paragraphs(4)) + "\n", encoding="utf-8")
    return good


def _git(*args, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@example.org", *args], cwd=cwd, check=True,
                   capture_output=True)


def _prepare_args(corpus: Path, tiny_data: Path, out) -> list:
    """A fast prepare: the tiny data's tokenizer, nothing trained."""
    return ["data", "prepare", "--input", corpus, "--out", out, "--tokenizer", tiny_data / "tokenizer" / "spm.model",
            "--valid-fraction", "0.2"]


# --- row 1: an earlier export is replaced only while it holds nothing but what the export wrote ---------


def test_export_over_a_git_repository_an_edited_file_or_nested_notes_is_refused(capsys, stored_run, stored_export,
                                                                                tmp_path):
    base = ["export", stored_run, "--no-verify", "--out"]
    repo = tmp_path / "E"
    shutil.copytree(stored_export, repo)
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "x", cwd=repo)
    (repo / ".gitattributes").write_text("*.bin lfs\n")
    line = refused(capsys, [*base, repo], [repo, stored_run])
    assert f"--out {repo}: the earlier export there also holds .git/, .gitattributes, which replacing it " \
           f"would delete" in line

    edited = tmp_path / "edited"
    shutil.copytree(stored_export, edited)
    (edited / "README.md").write_text("# my own model card\n")
    line = refused(capsys, [*base, edited], [edited, stored_run])
    assert f"--out {edited}: the earlier export there also holds README.md (changed since the export)" in line

    nested = tmp_path / "nested"
    shutil.copytree(stored_export, nested)
    (nested / "1_Pooling" / "mynotes.txt").write_text("mine\n")
    line = refused(capsys, [*base, nested], [nested, stored_run])
    assert f"--out {nested}: the earlier export there also holds 1_Pooling/mynotes.txt, which" in line

    untouched = tmp_path / "untouched"  # the export's own files only: replaced by the new export
    shutil.copytree(stored_export, untouched)
    ran_ok(capsys, [*base, untouched])
    assert json.loads((untouched / "export_info.json").read_text())["tag"] == "global_step5"


# --- row 2: report writes only into a real run directory or a report folder -----------------------------


def test_report_refuses_a_user_folder_and_a_folder_with_only_a_config_yaml(capsys, stored_run, tmp_path):
    user = tmp_path / "U"
    (user / "plots").mkdir(parents=True)
    (user / "plots" / "loss.png").write_bytes(b"my own plot")
    (user / "report.md").write_text("mine\n")
    line = refused(capsys, ["report", stored_run, "--out", user], [user, stored_run])
    assert f"--out {user}: not empty and not a report; it holds plots/, report.md: choose a new or empty " \
           f"directory" in line

    fake_run = tmp_path / "U2"
    fake_run.mkdir()
    (fake_run / "config.yaml").write_text("epochs: 3\n")
    (fake_run / "report.md").write_text("mine\n")
    line = refused(capsys, ["report", fake_run], [fake_run])
    assert f"{fake_run}: not a run directory of `roformer pretrain`" in line

    new = tmp_path / "R"  # a report folder is its own kind: written, then written again
    for _ in range(2):
        ran_ok(capsys, ["report", stored_run, "--out", new])
    assert (new / "report.md").read_text().startswith("# Run report: ")


# --- row 3: reproduce --out gets the same checks as every other output ---------------------------------


def test_reproduce_refuses_a_user_folder_a_url_and_a_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    user = tmp_path / "U"
    (user / "report").mkdir(parents=True)
    (user / "report" / "report.md").write_text("mine\n")
    line = refused(capsys, ["reproduce", "--out", user, "--report-only", "--quick"], [user])
    assert f"--out {user}: not empty and not a reproduction output; it holds report/" in line
    line = refused(capsys, ["reproduce", "--out", "s3://bkt/x", "--report-only", "--quick"], [tmp_path])
    assert "--out s3://bkt/x: a s3:// URL, but a local path is expected" in line
    assert not list(tmp_path.glob("s3:*"))
    file = tmp_path / "F"
    file.write_text("x\n")
    line = refused(capsys, ["reproduce", "--out", file, "--report-only", "--quick"], [file])
    assert f"--out {file}: exists and is not a directory" in line


# --- row 4: prepared data is known by our manifest's own fields ----------------------------------------


def test_prepare_refuses_a_folder_whose_manifest_json_is_not_ours(capsys, corpus, tiny_data, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text('{"name": "App"}\n')
    (site / "index.html").write_text("x\n")
    for overwrite in ([], ["--overwrite"]):
        line = refused(capsys, [*_prepare_args(corpus, tiny_data, site), *overwrite], [site, corpus])
        assert f"--out {site}: not empty and not prepared data; it holds index.html, manifest.json" in line
    line = refused(capsys, ["data", "upload", site, "s3://bkt/site"], [site])  # refused before the bucket is asked
    assert f"DATA_DIR {site}: not prepared data (its manifest.json is not one `roformer data prepare` wrote)" in line


def test_prepare_overwrite_refuses_prepared_data_holding_the_users_files(capsys, corpus, tiny_data, tmp_path):
    """--overwrite replaces tokenizer/, train/ and valid/ whole: every entry in them counts."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    (data / "train" / "notes.txt").write_text("mine\n")
    (data / "tokenizer" / ".my-settings").write_text("mine\n")
    line = refused(capsys, [*_prepare_args(corpus, tiny_data, data), "--overwrite"], [data, corpus])
    assert f"--out {data}: the prepared data there also holds tokenizer/.my-settings, train/notes.txt, which " \
           f"--overwrite would delete" in line
    (data / "train" / "notes.txt").unlink()
    (data / "tokenizer" / ".my-settings").unlink()
    ran_ok(capsys, [*_prepare_args(corpus, tiny_data, data), "--overwrite"])  # its own files only: replaced
    assert json.loads((data / "manifest.json").read_text())["stats"] != json.loads(
        (tiny_data / "manifest.json").read_text())["stats"]


# --- row 8: never inside the command's own input --------------------------------------------------------


def test_a_run_or_an_export_inside_its_own_input_is_refused(capsys, stored_run, stored_export, tiny_data,
                                                            tmp_path):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data))
    run_dir = tiny_data / "newrun"
    line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", config, "--dry-run", "--run-dir", run_dir],
                   [tiny_data])
    assert (f"--run-dir {run_dir}: is inside prepared data (roformer data prepare), {tiny_data}; writing there "
            f"would mix a run directory into it") in line  # the output gate (launcher/outputs/gate.py)
    assert not run_dir.exists()

    exported = tmp_path / "exp"
    shutil.copytree(stored_export, exported)
    init_config = run_config_dict(data_dir=tiny_data)
    init_config.pop("model")
    init_config["init_from"] = str(exported)
    init_yaml = write_yaml(tmp_path / "init.yaml", init_config)
    line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", init_yaml, "--dry-run", "--run-dir",
                            exported / "run"], [exported, tiny_data])
    assert f"--run-dir {exported / 'run'}: is inside an export (roformer export), {exported}" in line

    data_dir = stored_run.parent / "data"  # the run's own prepared data (its config.yaml's data.data_dir)
    line = refused(capsys, ["export", stored_run, "--out", data_dir / "exp"], [data_dir, stored_run])
    assert f"--out {data_dir / 'exp'}: is inside prepared data (roformer data prepare), {data_dir}" in line


# --- row 9: a run directory is known by our records, not by a checkpoints/ folder ----------------------


def test_a_lightning_style_folder_is_not_a_run_directory(capsys, tiny_data, tmp_path):
    lightning = tmp_path / "V"
    (lightning / "checkpoints").mkdir(parents=True)
    (lightning / "checkpoints" / "epoch=3.ckpt").write_text("w\n")
    (lightning / "hparams.yaml").write_text("lr: 1\n")
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data))
    line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", config, "--dry-run", "--run-dir", lightning],
                   [lightning])
    assert f"--run-dir {lightning}: not empty and not a run directory; it holds checkpoints/, hparams.yaml" in line


# --- row 10: a symbolic link as --out is followed, a dangling one refused before the work ---------------


def test_export_follows_a_link_and_refuses_a_dangling_one(capsys, stored_run, tmp_path):
    target = tmp_path / "E0"
    target.mkdir()
    link = tmp_path / "L"
    link.symlink_to(target)
    ran_ok(capsys, ["export", stored_run, "--no-verify", "--out", link])
    assert link.is_symlink() and (target / "export_info.json").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp, no lock left

    dangling = tmp_path / "D"
    dangling.symlink_to(tmp_path / "missing")
    line = refused(capsys, ["export", stored_run, "--no-verify", "--out", dangling], [stored_run])
    assert f"--out {dangling}: a symbolic link to {tmp_path / 'missing'}, which does not exist" in line
    assert not (tmp_path / "missing").exists()


# --- row 11: one writer per resolved path, whatever its spelling -----------------------------------------


def test_one_writer_per_resolved_path(capsys, corpus, stored_run, tiny_data, tmp_path):
    out = tmp_path / "S"
    out.mkdir()  # the first writer's output folder, as it stands while it writes
    link = tmp_path / "L"
    link.symlink_to(out)
    spelled = tmp_path / "x" / ".." / "S"
    with writer_lock("--out", out, "roformer data prepare"):  # a first prepare into S, still writing
        for other in (link, spelled):
            line = refused(capsys, _prepare_args(corpus, tiny_data, other), [corpus])
            assert f"--out {out}: another roformer data prepare (pid {os.getpid()}) is writing it now" in line
    assert not any(out.iterdir())
    with writer_lock("--out", out, "roformer export"):  # a first export into S
        line = refused(capsys, ["export", stored_run, "--no-verify", "--out", link], [stored_run])
    assert f"--out {out}: another roformer export (pid {os.getpid()}) is writing it now" in line
    assert not any(out.iterdir())


def test_outputs_of_finetune_and_eval_mlm_have_one_writer_and_a_refusal_creates_no_folder(
        capsys, corpus, stored_run, stored_export, tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("text,label\n" + "".join(f"text number {i},{'pos' if i % 2 else 'neg'}\n" for i in range(6)))
    report = tmp_path / "f.json"
    for command, argv in (("roformer finetune", ["finetune", stored_export, "--train", csv, "--dev", csv]),
                          ("roformer eval-mlm", ["eval-mlm", stored_export, "--input", corpus])):
        with writer_lock("--out", report, command):  # the same command, still writing f.json
            line = refused(capsys, [*argv, "--out", report], [csv, corpus, stored_export])
        assert f"--out {report}: another {command} (pid {os.getpid()}) is writing it now" in line
        assert not report.exists()
    deep = tmp_path / "a" / "b" / "exp"  # refused once the lock is held: the folders made for it go again
    line = refused(capsys, ["export", stored_run, "--tag", "global_step99", "--out", deep], [stored_run])
    assert "global_step99" in line and not (tmp_path / "a").exists()


# --- row 12: a read-only target, before any work ----------------------------------------------------------


READ_ONLY_SCRIPT = """
mount -t tmpfs -o ro tmpfs "$RO" || exit 99
for args in "export $RUN --no-verify --out $RO/new" "report $RUN --out $RO/r" \\
            "data prepare --input $TEXT --out $RO/data --tokenizer $SPM" \\
            "eval-mlm $EXPORT --input $TEXT --out $RO/mlm.json" \\
            "finetune $EXPORT --train $CSV --dev $CSV --out $RO/f.json" \\
            "finetune $EXPORT --train $CSV --dev $CSV --predictions $RO/p.csv" \\
            "finetune $EXPORT --train $CSV --dev $CSV --save-model $RO/model"; do
  "$PY" -m launcher $args 2>"$ERR"; echo "rc=$? $(tail -n 1 "$ERR") lines=$(grep -c . "$ERR")"
done
mount --bind "$RUN" "$RO_RUN" && mount -o remount,bind,ro "$RO_RUN" || exit 98
"$PY" -m launcher report "$RO_RUN" 2>"$ERR"; echo "rc=$? $(tail -n 1 "$ERR") lines=$(grep -c . "$ERR")"
"""


def test_a_read_only_target_is_refused_in_one_line_before_any_work(stored_run, stored_export, corpus, tiny_data,
                                                                   tmp_path):
    """A read-only mount (root ignores permission bits) in a private mount namespace; each command is
    refused by the output check, which runs before the export is read or a model trained."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here: {probe.stderr.decode().strip()}")
    read_only, read_only_run = tmp_path / "ro", tmp_path / "ro_run"  # an empty mount; the run, mounted read-only
    read_only.mkdir()
    read_only_run.mkdir()
    csv = tmp_path / "t.csv"
    csv.write_text("text,label\n" + "".join(f"text number {i},{'pos' if i % 2 else 'neg'}\n" for i in range(6)))
    env = roformer_env(RO=str(read_only), RO_RUN=str(read_only_run), RUN=str(stored_run), EXPORT=str(stored_export),
                       TEXT=str(corpus), SPM=str(tiny_data / "tokenizer" / "spm.model"), CSV=str(csv),
                       PY=sys.executable, ERR=str(tmp_path / "err"))
    started = time.monotonic()
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", READ_ONLY_SCRIPT],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    *lines, report_line = result.stdout.strip().splitlines()
    assert len(lines) == 7, (result.stdout, result.stderr)
    assert report_line == (f"rc=2 roformer report: error: RUN_DIR {read_only_run}: read-only; write the report "
                           f"elsewhere with --out DIR lines=1"), report_line
    for line, (command, flag, name) in zip(lines, [
            ("export", "--out", "new"), ("report", "--out", "r"), ("data", "--out", "data"),
            ("eval-mlm", "--out", "mlm.json"), ("finetune", "--out", "f.json"),
            ("finetune", "--predictions", "p.csv"), ("finetune", "--save-model", "model")]):
        assert line.startswith("rc=2 ") and line.endswith(" lines=1"), line
        assert (f"roformer {command}: error: {flag} {read_only / name}: cannot write there: {read_only} is not "
                f"writable (read-only); choose another {flag}") in line, line
    assert time.monotonic() - started < 200  # no training ran (8 starts of the CLI)


# --- row 13: a refused pretrain creates nothing: tests/unit/test_bad_input_paths.py (the port in use) ----------


# --- row 14: a killed prepare's leftovers are cleaned by the next one -----------------------------------


def test_a_killed_prepare_leaves_nothing_after_the_next_one(corpus, tiny_data, tmp_path):
    out = tmp_path / "o"
    argv = [sys.executable, "-m", "launcher", *map(str, _prepare_args(corpus, tiny_data, out))]
    first = subprocess.Popen(argv, cwd=REPO, env=roformer_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(out.glob(".partial-*")) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert list(out.glob(".partial-*")), "the prepare was not caught while writing"
    assert (tmp_path / ".o.lock").exists()  # the killed holder's lock file (its flock died with it)
    result = subprocess.run(argv, cwd=REPO, env=roformer_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "manifest.json").is_file()
    assert not list(out.glob(".partial-*")) and not (tmp_path / ".o.lock").exists()


# --- row 15: a fine-tune's tracking files go only into a real run directory -----------------------------


def test_finetune_tracking_never_writes_into_a_folder_export_info_names(capsys, stored_export, tmp_path,
                                                                       monkeypatch):
    user = tmp_path / "U"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    export = tmp_path / "E"
    shutil.copytree(stored_export, export)
    info = json.loads((export / "export_info.json").read_text())
    (export / "export_info.json").write_text(json.dumps({**info, "run_dir": str(user)}))
    csv = tmp_path / "t.csv"
    csv.write_text("text,label\n" + "".join(f"text number {i},{'pos' if i % 2 else 'neg'}\n" for i in range(8)))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    before = snapshot(user)
    ran_ok(capsys, ["finetune", export, "--train", csv, "--dev", csv, "--epochs", "1", "--report-to", "mlflow"])
    assert snapshot(user) == before
    assert (work / "tracking" / "mlflow.db").is_file()
