"""`data prepare` reports its long phases with an ETA; every command ends cleanly on Ctrl-C and on a
closed output pipe (launcher/cli.py). Real text (linux-doc), real SentencePiece, real processes."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

from data_pipeline import progress
from data_pipeline.config import (
    CleaningConfig,
    InputConfig,
    PrepareConfig,
    TokenizerConfig,
)
from data_pipeline.prepare import prepare
from tests.support.corpus_files import english_paragraphs, write_jsonl
from tests.support.helpers import REPO, roformer_env


def _corpus(root, copies: int = 1):
    paragraphs = english_paragraphs(limit_files=40)
    return write_jsonl(root / "en.jsonl", [f"{p} ({k})" for k in range(copies) for p in paragraphs])


VOCAB = 8000


def test_each_long_phase_reports_progress_with_an_eta(tmp_path, monkeypatch, request):
    # Many lines from a small corpus: the counted part of reading (after the file check) lasts a few
    # tens of ms, so the ticker runs every 5 ms and the interpreter switches threads often enough to run it.
    # The vocabulary keeps BPE merging for ~0.4 s here (2,000: 0.17 s, which a loaded machine's scheduler could
    # let pass between two ticks: no merges line, once in CI).
    monkeypatch.setattr(progress, "INTERVAL_S", 0.005)
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.005)  # pytest's stderr is no terminal
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    request.addfinalizer(lambda: sys.setswitchinterval(switch_interval))
    monkeypatch.setattr(progress, "FLUSH_BYTES", 4096)
    source = _corpus(tmp_path, copies=2)
    lines: list[str] = []
    cfg = PrepareConfig(input=InputConfig(inputs=[str(source)]), out_dir=tmp_path / "out",
                        tokenizer=TokenizerConfig(vocab_size=VOCAB, model_type="bpe"),
                        cleaning=CleaningConfig(valid_fraction=0.05), workers=1)
    prepare(cfg, log=lines.append)
    mb = source.stat().st_size / 1e6
    reading = [line for line in lines if line.startswith("reading: ") and "ETA" in line]
    assert reading and all(re.fullmatch(rf"reading: [\d.]+ / {mb:.1f} MB \(\d+%\), [\d.]+ MB/s, ETA \d+:\d\d", r)
                           for r in reading), reading
    shares = [int(re.search(r"\((\d+)%\)", r).group(1)) for r in reading]
    assert shares == sorted(shares)  # the count only grows
    merges = [line for line in lines if re.fullmatch(r"tokenizer: [\d,]+ / ~[\d,]+ merges \(\d+%\), ETA \d+:\d\d",
                                                     line)]
    assert merges, lines  # BPE's merge count from SentencePiece's own log, against the vocabulary
    assert any(re.fullmatch(r"encoding: [\d.]+ / [\d.]+ MB \(\d+%\), [\d.]+ MB/s, ETA \d+:\d\d", line)
               for line in lines), lines
    for phase in ("reading", "tokenizer", "encoding"):
        assert sum(line.startswith(f"{phase}: done in ") for line in lines) == 1, phase
    order = [next(i for i, line in enumerate(lines) if line.startswith(f"{phase}: done in "))
             for phase in ("reading", "tokenizer", "encoding")]
    assert order == sorted(order)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]["vocab_size"] <= VOCAB


def _spawn(args: list[str], stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=REPO, env=roformer_env(),
                            stdout=stdout, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def test_ctrl_c_during_data_prepare_names_the_signal_and_leaves_nothing(tmp_path):
    source = _corpus(tmp_path, copies=12)
    out = tmp_path / "prepared"
    proc = _spawn(["data", "prepare", "--input", str(source), "--out", str(out), "--vocab-size", "2000"])
    first = proc.stderr.readline()  # "scanning 1 files ...": the command is past its start-up
    assert first.startswith("scanning 1 files"), first
    # Interrupt inside the reading loop (its first progress line), not in the imports before it: a
    # fixed sleep raced with a fast machine and with a slow one alike.
    line = proc.stderr.readline()
    while line and not line.startswith("reading:"):
        line = proc.stderr.readline()
    assert line.startswith("reading:"), line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.rstrip().splitlines()[-1] == "roformer data: stopped by SIGINT (Ctrl-C)", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not out.exists()  # the partial directory went with it


def test_a_closed_output_pipe_ends_the_command_quietly(tmp_path):
    """`roformer data tokenizer ... | head -0`: the reader is gone before the command's output."""
    source = _corpus(tmp_path)
    proc = _spawn(["data", "tokenizer", "--input", str(source), "--out", str(tmp_path / "tok"),
                   "--vocab-size", "1000"])
    proc.stdout.close()  # nobody reads stdout any more: the first write gets EPIPE
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert (tmp_path / "tok" / "spm.model").is_file()  # the work was done; only the message was lost
