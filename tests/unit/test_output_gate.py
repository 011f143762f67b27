"""One output gate for every path a command writes (issue 63, items 2 and 6; launcher/outputs/gate.py,
docs/bad_inputs.md "One output gate"). The first test walks every command's argparse definition: an
argument that names a path it writes must be declared with its kind (add_output), so a new flag cannot
skip the gate; every other path argument is listed here as read, with why. The others reproduce the
issue's cases with real commands on the stored run, its export and the tiny prepared data: each refusal
is exit 2, one line, and every file the user had hashes the same."""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import SUBCOMMANDS, build_parser
from launcher.outputs.gate import OUTPUT_KINDS, _chosen_actions, output_location, output_path
from launcher.outputs.output_paths import _a
from tests.support.bad_inputs import ran_ok, refused, snapshot
from tests.support.corpus_files import english_paragraphs
from tests.support.helpers import REPO, roformer_env, run_config_dict, tiny_run_config, write_yaml

READ_PATHS = {
    ("data", "--data-cache"): "set-up data cache, read for --default-corpus",
    ("data", "--tokenizer"): "a tokenizer to reuse, copied from",
    ("data", "data_dir"): "data upload: the prepared data uploaded",
    ("export", "run_dir"): "the run exported",
    ("export", "--tokenizer-from"): "the tokenizer copied into the export",
    ("eval-mlm", "export_dir"): "the model evaluated",
    ("eval-mlm", "--data"): "prepared data evaluated on",
    ("finetune", "export_dir"): "the model fine-tuned",
    ("finetune", "--task-data"): "bundled task files",
    ("finetune", "--task-spec"): "a task spec YAML",
    ("finetune", "--train"): "labelled data", ("finetune", "--dev"): "labelled data",
    ("finetune", "--test"): "labelled data", ("finetune", "--corpus"): "retrieval passages",
    ("report", "run_dir"): "the run reported on (its report.md: the gate, with --out's kind, in report.run)",
    ("reproduce", "--data"): "prepared data the ablations read",
    ("reproduce", "--merge"): "earlier results.json files",
    ("plan", "--from-run"): "the run whose records are planned from",
}
"""Every path argument that is only read: (command, flag or dest) -> what it is."""

NOT_WRITTEN = {
    ("data", "destination"): "data upload's s3:// destination: object storage, checked by data upload itself",
    ("data", "--remote-timeout"): "seconds",
    ("pretrain", "--report-to"): "tracker names",
    ("finetune", "--report-to"): "tracker names",
    ("finetune", "--select-metric"): "a metric name",
    ("finetune", "--dropout"): "a probability",
}
"""Arguments whose name or help reads like an output but that name no local path written."""

_WRITES = re.compile(r"\b(writes?|written|save[sd]?|creates?|created|output|export to)\b", re.I)


def _arguments():
    """(command, name, action) of every argument of every command and sub-action."""
    for command in SUBCOMMANDS:
        top = build_parser([command])
        parser = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        for action in _chosen_actions(parser, None):
            if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)) or action.nargs == 0:
                continue
            yield command, action.option_strings[0] if action.option_strings else action.dest, action


def test_every_path_writing_argument_of_every_command_goes_through_the_gate():
    seen, gated = set(), set()
    for command, name, action in _arguments():
        seen.add((command, name))
        kind = getattr(action, "output_kind", None)
        if kind is not None:
            assert kind in OUTPUT_KINDS, (command, name)
            assert action.type in (output_path, output_location), (command, name, action.type)
            gated.add((command, name))
            continue
        path_typed = action.type is Path
        looks_written = bool(_WRITES.search(action.help or "")) or re.search(r"out|save|dest|predict", action.dest)
        assert not path_typed or (command, name) in READ_PATHS, (
            f"{command} {name}: a path argument neither declared as an output (launcher/outputs/gate.py add_output) "
            f"nor listed in READ_PATHS as read")
        assert not looks_written or (command, name) in READ_PATHS or (command, name) in NOT_WRITTEN, (
            f"{command} {name}: reads like an output ({action.help!r}); declare it with add_output or list why not")
    listed = set(READ_PATHS) | set(NOT_WRITTEN)
    assert listed <= seen, sorted(listed - seen)  # no stale rows
    assert {("data", "--out"), ("pretrain", "--run-dir"), ("export", "--out"), ("eval-mlm", "--out"),
            ("finetune", "--out"), ("finetune", "--predictions"), ("finetune", "--save-model"), ("report", "--out"),
            ("reproduce", "--out"), ("reproduce", "--report-dir"), ("gpu-check", "--out")} <= gated


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    good = tmp_path_factory.mktemp("gate_corpus") / "good.txt"
    good.write_text("\n".join(p.replace("\n", " ") for p in english_paragraphs(4)) + "\n", encoding="utf-8")
    return good


def _csv(path: Path) -> Path:
    path.write_text("text,label\n" + "".join(f"text number {i},{'pos' if i % 2 else 'neg'}\n" for i in range(6)))
    return path


def test_every_declared_output_of_every_command_is_refused_inside_prepared_data(capsys, corpus, stored_run,
                                                                                 stored_export, tiny_data, tmp_path):
    """cli.main gates every declared output before the command runs: each one, pointed into prepared data, is
    refused by the same line; a new output flag is covered once its command has a base here."""
    csv = _csv(tmp_path / "t.csv")
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tmp_path / "elsewhere"))
    base = {"data prepare": ["data", "prepare", "--input", corpus],
            "data tokenizer": ["data", "tokenizer", "--input", corpus],
            "pretrain": ["pretrain", "--config", config, "--dry-run"],
            "export": ["export", stored_run, "--no-verify"],
            "eval-mlm": ["eval-mlm", stored_export, "--input", corpus],
            "finetune": ["finetune", stored_export, "--train", csv, "--dev", csv],
            "report": ["report", stored_run],
            "reproduce": ["reproduce", "--quick", "--report-only"],
            "gpu-check": ["gpu-check"],
            "plan": ["plan", "--from-run", stored_run]}
    checked = 0
    for command in SUBCOMMANDS:
        top = build_parser([command])
        parser = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        for sub, subparser in ((a, p) for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                               for a, p in a.choices.items()) if command == "data" else [("", parser)]:
            for action in subparser._actions:
                if getattr(action, "output_kind", None) is None:
                    continue
                flag, key = action.option_strings[0], f"{command} {sub}".strip()
                target = tiny_data / "sub" / ("x.csv" if action.output_kind.directory is False else "x")
                extra = ["--out", tmp_path / "new"] if (command, flag) == ("reproduce", "--report-dir") else []
                line = refused(capsys, [*base[key], *extra, flag, target], [tiny_data, stored_run, stored_export],
                               command=command)
                assert f"{flag} {target}: is inside prepared data (roformer data prepare), {tiny_data}; writing " \
                       f"there would mix {_a(action.output_kind.name)} into it: choose a path outside it" in line, line
                checked += 1
    assert checked >= 12
    assert not (tiny_data / "sub").exists()

    line = refused(capsys, ["reproduce", "--quick", "--report-only", "--data", tiny_data, "--out", tiny_data / "sub"],
                   [tiny_data])  # item 6: reproduce --out DATA/sub --data DATA
    assert f"--out {tiny_data / 'sub'}: is inside the input --data {tiny_data}" in line


def test_eval_mlm_out_replaces_only_its_own_unchanged_report(capsys, corpus, stored_run, stored_export, tmp_path,
                                                            monkeypatch):
    base = ["eval-mlm", stored_export, "--input", corpus, "--seq-lens", "16", "--tokens", "64"]
    metrics = stored_run / "metrics.jsonl"  # the case: the training log replaced
    line = refused(capsys, [*base, "--out", metrics], [stored_run])
    assert f"--out {metrics}: is inside a run directory (roformer pretrain), {stored_run}" in line
    for name in ("mine.csv", ".bashrc"):
        users = tmp_path / name
        users.write_text("the user's\n")
        line = refused(capsys, [*base, "--out", users], [users])
        assert f"--out {users}: exists, and is not an eval-mlm report roformer eval-mlm wrote (no record of it in " \
               f".{name}.written.json); it is never replaced" in line

    inner = stored_run / "checkpoints" / "e.json"  # a run's own folders: never
    line = refused(capsys, [*base, "--out", inner], [stored_run])
    assert f"--out {inner}: is inside a run directory (roformer pretrain), {stored_run}" in line
    run = tmp_path / "run"
    shutil.copytree(stored_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    ran_ok(capsys, [*base, "--out", run / "eval_mlm.json"])  # beside the run's records, as scripts/demo.sh does

    monkeypatch.setenv("HOME", str(tmp_path))  # `~` expanded by the argument's type, alike everywhere
    for _ in range(2):  # new, then ours and unchanged: replaced
        ran_ok(capsys, [*base, "--out", "~/r.json"])
    report = tmp_path / "r.json"
    assert report.is_file() and (tmp_path / ".r.json.written.json").is_file() and not Path("~").exists()
    line = refused(capsys, ["finetune", stored_export, "--train", _csv(tmp_path / "t.csv"), "--out", report],
                   [report])  # ours, but another kind
    assert f"--out {report}: exists, and is not a fine-tune report roformer finetune wrote" in line
    report.write_text(report.read_text().replace("16", "17"))  # edited by hand
    line = refused(capsys, [*base, "--out", report], [report])
    assert f"--out {report}: changed since roformer eval-mlm wrote it; replacing it would lose the edit" in line


def test_finetune_outputs_never_replace_a_users_file_or_a_runs_records(capsys, stored_run, stored_export, tmp_path):
    csv = _csv(tmp_path / "t.csv")
    base = ["finetune", stored_export, "--train", csv, "--dev", csv]
    users = _csv(tmp_path / "predictions.csv")
    line = refused(capsys, [*base, "--predictions", users], [users, csv])
    assert f"--predictions {users}: exists, and is not a predictions file roformer finetune wrote" in line
    stages = stored_run / "stages.json"
    line = refused(capsys, [*base, "--out", stages], [stored_run])
    assert f"--out {stages}: is inside a run directory (roformer pretrain), {stored_run}" in line
    line = refused(capsys, [*base, "--save-model", stored_export / "model"], [stored_export])
    assert f"--save-model {stored_export / 'model'}: is inside the input EXPORT_DIR {stored_export}" in line


def test_data_tokenizer_out_never_writes_into_data_an_export_a_run_or_a_users_folder(capsys, corpus, stored_run,
                                                                                   stored_export, tiny_data, tmp_path):
    base = ["data", "tokenizer", "--input", corpus, "--out"]
    line = refused(capsys, [*base, tiny_data / "tokenizer"], [tiny_data], command="data")
    assert f"--out {tiny_data / 'tokenizer'}: is inside prepared data (roformer data prepare), {tiny_data}" in line
    line = refused(capsys, [*base, stored_export], [stored_export], command="data")
    assert f"--out {stored_export}: not empty and not a tokenizer roformer data tokenizer wrote; it is an export " \
           f"(roformer export): choose a new or empty directory" in line
    line = refused(capsys, [*base, stored_run], [stored_run], command="data")
    assert "it is a run directory (roformer pretrain)" in line
    home = tmp_path / "home"
    home.mkdir()
    (home / "tokenizer_config.json").write_text('{"mine": true}\n')
    line = refused(capsys, [*base, home], [home], command="data")
    assert f"--out {home}: not empty and not a tokenizer roformer data tokenizer wrote; it holds " \
           f"tokenizer_config.json" in line


def test_report_replaces_only_what_it_wrote_unchanged(capsys, stored_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stored_run, run)
    rep = tmp_path / "REP"
    for _ in range(2):
        ran_ok(capsys, ["report", run, "--out", rep])
    (rep / "report.md").write_text((rep / "report.md").read_text() + "\nMy notes on this run.\n")
    line = refused(capsys, ["report", run, "--out", rep], [rep, run])  # item 4: the hand edit is named
    assert f"--out {rep}: the earlier report there also holds report.md (changed since roformer report wrote it), " \
           f"which rewriting it would lose" in line

    for _ in range(2):  # RUN_DIR/report.md alike
        ran_ok(capsys, ["report", run])
    (run / "report.md").write_text("# Run report: mine\n")
    ran_ok(capsys, ["report", run, "--plots-only"])  # training's render: the plots only, the edit stays named
    line = refused(capsys, ["report", run], [run])
    assert f"RUN_DIR {run}: report.md: changed since roformer report wrote it" in line
    line = refused(capsys, ["report", run, "--out", run], [run])  # the default spelled out
    assert f"--out {run}: report.md: changed since roformer report wrote it" in line


def test_gpu_check_never_works_in_a_users_work_folder(capsys, tmp_path):
    work = tmp_path / "work"
    (work / "pretraining" / "stopped").mkdir(parents=True)
    (work / "pretraining" / "stopped" / "thesis.tex").write_text("mine\n")
    line = refused(capsys, ["gpu-check", "--out", tmp_path / "report.json"], [tmp_path])
    assert f"--out {work}: not empty and not a gpu-check work folder roformer gpu-check wrote; it holds " \
           f"pretraining/" in line
    users = tmp_path / "other" / "report.json"
    users.parent.mkdir()
    users.write_text("{}\n")
    line = refused(capsys, ["gpu-check", "--out", users], [users])
    assert f"--out {users}: exists, and is not a gpu-check report roformer gpu-check wrote" in line


FIRST_PREPARE = """
import os, sys, time
from pathlib import Path
from launcher.outputs.output_paths import writer_lock
out = Path(sys.argv[1])
with writer_lock("--out", out, "roformer data prepare"):
    (out / f".partial-{os.getpid()}").mkdir(parents=True)
    print("writing", flush=True)
    time.sleep(120)
"""


def test_a_second_prepare_names_the_first_not_its_partial_folder(capsys, corpus, tiny_data, tmp_path):
    out = tmp_path / "o"
    first = subprocess.Popen([sys.executable, "-c", FIRST_PREPARE, str(out)], cwd=REPO, env=roformer_env(),
                             stdout=subprocess.PIPE, text=True)  # a first prepare, alive, its .partial-PID/ there
    try:
        assert first.stdout.readline().strip() == "writing"
        line = refused(capsys, ["data", "prepare", "--input", corpus, "--out", out, "--tokenizer",
                                tiny_data / "tokenizer" / "spm.model"], [out, corpus])
    finally:
        first.kill()
        first.wait()
    assert f"--out {out}: another roformer data prepare (pid {first.pid}) is writing it now; wait for it or " \
           f"choose another --out" in line


def test_an_empty_output_path_is_refused_not_taken_as_the_current_directory(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, ["pretrain", "--config", "x.yaml", "--run-dir", ""], [tmp_path])
    assert "argument --run-dir: an empty path; give a file or directory name" in line
    line = refused(capsys, ["eval-mlm", "E", "--input", "x", "--out", " "], [tmp_path])
    assert "argument --out: an empty path" in line
    assert snapshot(tmp_path) == {str(tmp_path): "<dir>"}


# --- item 5: a full disk is one line for every command, and leaves nothing behind ------------------------

FULL_DISK_SCRIPT = """
mount -t tmpfs -o size=256k tmpfs "$FULL" || exit 99
dd if=/dev/zero of="$FULL/.fill" bs=4k 2>/dev/null
for args in "data prepare --input $TEXT --out $FULL/data --tokenizer $SPM" "export $RUN --no-verify --out $FULL/exp" \\
            "finetune $EXPORT --train $CSV --dev $CSV --save-model $FULL/model" \\
            "eval-mlm $EXPORT --input $TEXT --seq-lens 16 --tokens 64 --out $FULL/m.json" \\
            "report $RUN --out $FULL/rep" "pretrain --num_gpus 1 --config $CFG --run-dir $FULL/run"; do
  "$PY" -m launcher $args 2>"$ERR"
  echo "rc=$? $(grep ': error: ' "$ERR" | tail -n 1) errors=$(grep -c ': error: ' "$ERR") \\
tracebacks=$(grep -c Traceback "$ERR")"
done
echo "left: $(ls -A "$FULL" | tr '\\n' ' ')"
mount -t tmpfs -o size=64m tmpfs "$MOUNT" || exit 98
"$PY" -m launcher export "$RUN" --no-verify --out "$MOUNT" >"$ERR.out" 2>"$ERR"; echo "rc=$? $(cat "$ERR.out")"
echo "mount: $(mountpoint -q "$MOUNT" && echo mounted) $(ls -A "$MOUNT" | tr '\\n' ' ')"
"""


def test_a_full_disk_is_one_line_for_every_command_and_leaves_nothing(stored_run, stored_export, corpus, tiny_data,
                                                                       tmp_path):
    """A full tmpfs in a private mount namespace (as the read-only test in test_bad_input_outputs.py)."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here: {probe.stderr.decode().strip()}")
    full, mount = tmp_path / "full", tmp_path / "mount"
    full.mkdir()
    mount.mkdir()
    env = roformer_env(FULL=str(full), MOUNT=str(mount), RUN=str(stored_run), EXPORT=str(stored_export),
                       TEXT=str(corpus), SPM=str(tiny_data / "tokenizer" / "spm.model"),
                       CSV=str(_csv(tmp_path / "t.csv")), CFG=str(tiny_run_config(tmp_path / "cfg", tiny_data)),
                       PY=sys.executable, ERR=str(tmp_path / "err"))
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", FULL_DISK_SCRIPT],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    print(result.stdout)
    *lines, left, exported, mounted = result.stdout.strip().splitlines()
    assert len(lines) == 6, (result.stdout, result.stderr)
    full_line = "the filesystem is full (0 kB free): No space left on device; free space, or write elsewhere"
    for line, (command, what) in zip(lines, [("data", f"--out {full / 'data'}: {full_line}"),
                                             ("export", f"--out {full / 'exp'}: {full_line}"),
                                             ("finetune", f"--save-model {full / 'model'}: needs about"),  # no compute
                                             ("eval-mlm", f"--out {full / 'm.json'}: {full_line}"),
                                             ("report", f"--out {full / 'rep'}: {full_line}"),
                                             ("pretrain", f"--run-dir {full / 'run'}: {full_line}")]):
        assert line.startswith(f"rc=2 roformer {command}: error: ") and what in line, line
        assert line.endswith(" errors=1 tracebacks=0"), line
    assert left.strip() == "left: .fill", left  # no .lock, .run.lock.guard, .tmp, .partial-PID/, run or report folder
    assert exported.startswith("rc=0 exported "), exported  # item 5: an empty mount point is written into
    assert mounted.startswith("mount: mounted ") and "export_info.json" in mounted, mounted
    assert ".partial" not in mounted, mounted
