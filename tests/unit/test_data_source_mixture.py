"""Named sources: `data prepare --source`, the per-stage mixture of the batch stream, plan and report.

Corpus: three generated sources, each with its own alphabet and so its own tokens (real
SentencePiece over all three, trained by the real `roformer data prepare --source`): a token's
source is read off its piece, as in test_data_mixing.py.

Tolerance of the drawn shares. Each global sequence draws its source independently with the
stage's probabilities p_k, so over N sequences the count of source k is Binomial(N, p_k): its share
has standard deviation sqrt(p_k (1 - p_k) / N). The test allows z of those, z the two-sided normal
quantile for a 1% chance of any false alarm over the sources checked (Bonferroni, z ~= 3.0 for 3).
"""
from __future__ import annotations

import json
import random
from statistics import NormalDist

import numpy as np
import pytest
import torch

from data_pipeline import DataError, PretrainBatches, open_corpus
from launcher.cli import main as roformer
from tests.support.corpus_files import named_sources_dir, prepared_dir, write_jsonl
from tests.support.token_sources import token_source_table
from tests.unit.test_data_batches import assert_same, original_ids

ALPHABETS = {"en": "abcdef", "zh": "ghijkl", "code": "mnopqr"}
DOCUMENTS = {"en": 400, "zh": 250, "code": 150}
FAMILY_ALPHA = 0.01


def generated(alphabet: str, count: int, rng: random.Random) -> list[str]:
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 6))) for _ in range(150)]
    return [" ".join(rng.choices(words, k=rng.randint(20, 120))) for _ in range(count)]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("source_raw")
    rng = random.Random(7)
    for name, alphabet in ALPHABETS.items():
        docs = generated(alphabet, DOCUMENTS[name], rng)
        half = len(docs) // 2  # two files per source: a source is several inputs
        write_jsonl(root / name / "a.jsonl", docs[:half])
        write_jsonl(root / name / "b.jsonl", docs[half:])
    return root


def prepare_args(raw, out, *extra):
    return ["data", "prepare", "--out", str(out), "--vocab-size", "300", "--character-coverage", "1.0",
            "--valid-fraction", "0.05", "--shard-tokens", "3000", *extra]


@pytest.fixture(scope="module")
def data_dir(raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("source_prepared") / "data"
    assert roformer(prepare_args(raw, out, "--source", f"en={raw / 'en'}",
                                 "--source", f"zh={raw / 'zh' / 'a.jsonl'},{raw / 'zh' / 'b.jsonl'}",
                                 "--source", f"code={raw / 'code' / '*.jsonl'}")) == 0
    return out


@pytest.fixture(scope="module")
def corpus(data_dir):
    return open_corpus(data_dir, "train")


@pytest.fixture(scope="module")
def source_of(corpus):
    """(V,) index (in source order) of the source owning each token id; -1 for special / letterless pieces."""
    return token_source_table(corpus, list(ALPHABETS.values()))


def test_prepare_writes_each_source_with_its_own_shards_and_counts(data_dir, corpus, source_of):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    sources = manifest["sources"]
    assert [s["name"] for s in sources] == list(ALPHABETS)
    assert [len(s["files"]) for s in sources] == [2, 2, 2]
    for split in ("train", "valid"):
        shards = manifest["splits"][split]["shards"]
        for s in sources:
            mine = [e for e in shards if e["source"] == s["name"]]
            assert s[split]["tokens"] == sum(e["tokens"] for e in mine) > 0
            assert s[split]["documents"] == sum(e["documents"] for e in mine)
        # A shard holds one source's documents: its tokens all come from that source's alphabet.
        for entry in shards:
            ids = np.fromfile(data_dir / split / f"{entry['name']}.bin", dtype=np.uint16)
            owners = set(np.unique(source_of[ids]).tolist()) - {-1}
            assert owners == {list(ALPHABETS).index(entry["source"])}
    assert sum(s["train"]["documents"] + s["valid"]["documents"] for s in sources) == \
        manifest["stats"]["train_documents"] + manifest["stats"]["valid_documents"]
    assert corpus.source_names == list(ALPHABETS)
    assert (data_dir / "tokenizer" / "spm.model").is_file()  # one tokenizer over all sources


def test_plain_input_is_the_source_default_and_old_manifests_read(tmp_path_factory, tmp_path):
    data = prepared_dir(tmp_path_factory)  # plain inputs (shared with the other data tests)
    corpus = open_corpus(data, "train")
    assert corpus.source_names == ["default"] and {s.source for s in corpus.shards} == {"default"}
    # A manifest from before named sources: `sources` lists input files, shards name no source.
    old = tmp_path / "old"
    old.mkdir()
    for part in ("tokenizer", "train", "valid"):
        (old / part).symlink_to(data / part)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["sources"] = [f for s in manifest["sources"] for f in s["files"]]
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            entry.pop("source")
    (old / "manifest.json").write_text(json.dumps(manifest))
    old_corpus = open_corpus(old, "train", verify=False)
    assert old_corpus.source_names == ["default"] and old_corpus.fingerprint == corpus.fingerprint
    a, b = PretrainBatches(corpus, seed=3), PretrainBatches(old_corpus, seed=3)
    assert_same([a.next_batch(32, 4) for _ in range(3)], [b.next_batch(32, 4) for _ in range(3)])


@pytest.mark.parametrize("case, message", [
    ("twice", "--source en: source name given twice"),
    ("bad name", "source name 'e n' must be"),
    ("empty name", "source name '' must be"),
    ("no documents", "--source copy ("),
    ("shared file", "named by both source 'en' and source 'zh'"),
])
def test_bad_sources_are_one_line_exit_2_and_nothing_written(case, message, raw, tmp_path, capsys):
    en, zh = raw / "en", raw / "zh"
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "same.jsonl").write_bytes((en / "a.jsonl").read_bytes())  # only duplicates of en's
    args = {"twice": ["--source", f"en={en}", "--source", f"en={zh}"],
            "bad name": ["--source", f"e n={en}"],
            "empty name": ["--source", f"={en}"],
            "no documents": ["--source", f"en={en}", "--source", f"copy={tmp_path / 'copy'}"],
            "shared file": ["--source", f"en={en}", "--source", f"zh={en / 'a.jsonl'}"]}[case]
    out = tmp_path / "out"
    assert roformer(prepare_args(raw, out, *args)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("roformer data: error: "), lines
    assert not out.exists()


def test_default_corpus_names_its_sources(tmp_path, data_dir, capsys):
    from data_pipeline import sources

    cache = tmp_path / "cache"
    rng = random.Random(1)
    for lang_dir, alphabet in ((sources.ENGLISH_DIR, "abcdef"), (sources.CHINESE_DIR, "ghijkl")):
        write_jsonl(sources.corpus_dir(cache) / lang_dir / "part.jsonl", generated(alphabet, 30, rng))
        (sources.corpus_dir(cache) / lang_dir / ".complete.json").write_text("{}")
    out = tmp_path / "out"
    assert roformer(["data", "prepare", "--default-corpus", "en,zh", "--data-cache", str(cache), "--out", str(out),
                     "--tokenizer", str(data_dir), "--valid-fraction", "0"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["name"], s["train"]["documents"]) for s in manifest["sources"]] == [("en", 30), ("zh", 30)]


def global_stream(corpus, schedule, world_size, stops=(), **kw):
    """Global batches and per-step tokens_by_source of `schedule` [(steps, seq_len, global batch, mixture)], the
    ranks concatenated in rank order; at each global step in `stops` every rank is rebuilt from the saved
    state (JSON round trip) and given the stage's mixture again, as the trainer's stage switch does."""
    make = lambda: [PretrainBatches(corpus, rank=r, world_size=world_size, seed=5, **kw) for r in range(world_size)]
    ranks, out, drawn, step = make(), [], [], 0
    for steps, seq_len, mb, mixture in schedule:
        for r in ranks:
            r.set_mixture(mixture)
        for _ in range(steps):
            if step in stops:
                state = json.loads(json.dumps(ranks[0].state_dict()))
                assert all(r.state_dict() == ranks[0].state_dict() for r in ranks)
                ranks = make()
                for r in ranks:
                    r.load_state_dict(state)
                    r.set_mixture(mixture)
            parts = [r.next_batch(seq_len, mb // world_size) for r in ranks]
            drawn.append(ranks[0].last_tokens_by_source)
            assert all(r.last_tokens_by_source == drawn[-1] for r in ranks)  # global, on every rank
            out.append({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
            step += 1
    return out, drawn


MIXED = [(20, 32, 8, {"en": 1, "zh": 1}), (15, 48, 4, None), (25, 32, 8, {"zh": 0, "code": 3, "en": 1})]


def test_drawn_shares_match_the_mixture_within_sampling_error(corpus, source_of):
    """A long stage (4000 sequences) at 0.6 / 0.1 / 0.3: the drawn shares within the binomial bound, and
    every drawn sequence's tokens come from the source its tokens_by_source names."""
    shares = np.array([0.6, 0.1, 0.3])
    batches, drawn = global_stream(corpus, [(250, 16, 16, dict(zip(ALPHABETS, 6 * shares)))], 1)
    counts = np.array([sum(d[name] for d in drawn) for name in ALPHABETS]) / 16  # sequences of 16 tokens
    n = counts.sum()
    z = NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * len(shares)))
    bound = z * np.sqrt(shares * (1 - shares) / n)
    print(f"drawn {np.round(counts / n, 4).tolist()} vs {shares.tolist()}, bound {np.round(bound, 4).tolist()}")
    assert n == 4000 and (np.abs(counts / n - shares) <= bound).all()
    for batch, by_source in zip(batches[:40], drawn):
        ids = original_ids(batch)[batch["attention_mask"].numpy() == 1]
        owners = np.bincount(source_of[ids][source_of[ids] >= 0], minlength=3)
        assert ((owners > 0) <= (np.array([by_source[n] for n in ALPHABETS]) > 0)).all()
        assert sum(by_source.values()) == int(batch["attention_mask"].sum())


def test_a_zero_weight_is_never_drawn_and_no_mixture_follows_the_sizes(corpus, source_of):
    _, drawn = global_stream(corpus, [(100, 16, 16, {"en": 1, "zh": 0, "code": 1})], 1)
    assert sum(d["zh"] for d in drawn) == 0 and sum(d["en"] for d in drawn) > 0
    reader = PretrainBatches(corpus, seed=5)
    sizes = np.array([corpus.source_corpus(name).tokens for name in ALPHABETS])
    assert np.allclose(reader.shares, sizes / sizes.sum())


def test_the_global_stream_resumes_exactly_mid_stage_after_a_mixture_change_on_any_world_size(corpus):
    reference, ref_drawn = global_stream(corpus, MIXED, 1)
    two, two_drawn = global_stream(corpus, MIXED, 2, stops=(7, 20, 27, 41))  # mid-stage, on a switch, ...
    assert_same(reference, two)
    assert ref_drawn == two_drawn
    assert all(len({k for k, v in d.items() if v}) >= 1 for d in ref_drawn)
    assert sum(d["zh"] for d in ref_drawn[35:]) == 0  # the third stage's zero weight


def test_a_skip_moves_every_source_as_the_skipped_batches_would_have(corpus):
    """The numerics guard's rewind skips batches (PretrainBatches.skip): on mixed data the skipped
    sequences' source draws and each source's lanes move exactly as if they had been handed out."""
    mixture = {"en": 1, "zh": 2, "code": 1}
    handed, skipped = (PretrainBatches(corpus, rank=1, world_size=2, seed=5) for _ in range(2))
    for reader in (handed, skipped):
        reader.set_mixture(mixture)
        reader.next_batch(32, 4)
    for _ in range(5):
        handed.next_batch(48, 4)
    skipped.skip(48, 5 * 8)
    assert skipped.state_dict() == handed.state_dict()
    assert_same([handed.next_batch(32, 4) for _ in range(3)], [skipped.next_batch(32, 4) for _ in range(3)])


def test_a_one_source_mixture_is_the_plain_stream(tmp_path_factory):
    corpus = open_corpus(prepared_dir(tmp_path_factory), "train")
    plain = PretrainBatches(corpus, seed=3)
    named = PretrainBatches(corpus, seed=3)
    named.set_mixture({"default": 2.0})
    assert_same([plain.next_batch(32, 4) for _ in range(4)], [named.next_batch(32, 4) for _ in range(4)])
    assert named.last_tokens_by_source == {"default": 4 * 32} and "sources" not in named.state_dict()


@pytest.mark.parametrize("change, message", [
    ({"sources": None}, "no per-source positions"),
    ({"sources": {"en": {}}}, "sources \\['en'\\] differ"),
    ("count", "the sources' sequences add up to"),
])
def test_inconsistent_source_positions_are_refused(corpus, change, message):
    reader = PretrainBatches(corpus, seed=5)
    for _ in range(3):
        reader.next_batch(32, 4)
    state = json.loads(json.dumps(reader.state_dict()))
    if change == "count":
        state["sources"]["en"]["sequences"] += 1
    elif change["sources"] is None:
        del state["sources"]
    else:
        state.update(change)
    with pytest.raises(DataError, match=message):
        PretrainBatches(corpus, seed=5).load_state_dict(state)


def test_set_mixture_refuses_unknown_sources_and_bad_weights(corpus):
    reader = PretrainBatches(corpus, seed=5)
    with pytest.raises(DataError, match=r"unknown source 'fr' \(the data at .* has en, zh, code\)"):
        reader.set_mixture({"fr": 1})
    with pytest.raises(DataError, match="must be >= 0 with at least one > 0"):
        reader.set_mixture({"en": 0, "zh": 0})


def run_config(tmp_path, data_dir, stages):
    from tests.support.helpers import run_config_dict, write_schedule, write_yaml

    schedule = write_schedule(tmp_path / "schedule.yaml", stages)
    config = run_config_dict(data_dir=data_dir, schedule_file=schedule)
    config["model"]["vocab_size"] = open_corpus(data_dir, "train", verify=False).vocab_size
    return write_yaml(tmp_path / "run.yaml", config), schedule


def test_plan_shows_tokens_per_stage_and_source_and_notes_many_passes(tmp_path, data_dir, corpus, monkeypatch, capsys):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    stages = [{"name": "wide", "max_seq_len": 32, "global_batch_size": 8, "steps": 100, "mixture": {"en": 3, "zh": 1}},
              {"name": "code", "max_seq_len": 64, "global_batch_size": 8, "steps": 400, "mixture": {"code": 1}}]
    config, _ = run_config(tmp_path, data_dir, stages)
    assert roformer(["plan", "--config", str(config), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tokens drawn per stage and source"))
    assert lines[start + 1].split() == ["#", "stage", "en", "zh", "code"]
    assert lines[start + 2].split() == ["1", "wide", "19,200", "(75%)", "6,400", "(25%)", "0", "(0%)"]
    assert lines[start + 3].split() == ["2", "code", "0", "(0%)", "0", "(0%)", "204,800", "(100%)"]
    code = next(s for s in json.loads((data_dir / "manifest.json").read_text())["sources"] if s["name"] == "code")
    passes = 400 * 8 * 63 / (code["train"]["tokens"] + code["train"]["documents"])
    assert passes > 4
    assert lines[start + 4].split()[-1] == f"{passes:.2f}"
    assert f"note: source 'code' would be read {passes:.1f} times over (> 4 passes)" in out
    assert "note: source 'en'" not in out


@pytest.mark.parametrize("data, message", [
    ("named", "stage 2 (b): mixture.fr: no source 'fr' in {data}; its sources: en, zh"),
    ("one source", "stage 2 (b): mixture.fr: no source 'fr' in {data}; it has one source, 'default'"),
])
def test_an_unknown_source_is_refused_by_plan_dry_run_and_rank_alike(data, message, tmp_path, tmp_path_factory,
                                                                     monkeypatch, capsys):
    from tests.unit.test_preflight_checks import three_entry_points

    path = named_sources_dir(tmp_path_factory) if data == "named" else prepared_dir(tmp_path_factory)
    stages = [{"name": "a", "max_seq_len": 32, "global_batch_size": 8, "steps": 2, "mixture": {"en": 1}},
              {"name": "b", "max_seq_len": 32, "global_batch_size": 8, "steps": 2, "mixture": {"fr": 1}}]
    if data == "one source":
        stages[0].pop("mixture")
    config, schedule = run_config(tmp_path, path, stages)
    errors = three_entry_points(config, tmp_path, monkeypatch, capsys)
    assert errors["plan"].startswith(f"{schedule}: ") and message.format(data=path) in errors["plan"], errors
    assert errors["dry-run"] == errors["plan"] and errors["rank"] == errors["plan"], errors


def test_report_compares_planned_and_drawn_shares_per_stage(tmp_path, data_dir):
    from launcher.report.curves import load_curves
    from launcher.report.run_report import mixture_section

    run = tmp_path / "run"
    run.mkdir()
    stages = [{"index": 0, "name": "wide", "max_seq_len": 32, "global_batch_size": 4, "first_step": 0, "steps": 2,
               "mixture": {"en": 0.75, "zh": 0.25}},
              {"index": 1, "name": "sized", "max_seq_len": 32, "global_batch_size": 4, "first_step": 2, "steps": 1,
               "mixture": None}]
    (run / "stages.json").write_text(json.dumps({"stages": stages}))
    records = [{"kind": "train", "step": 1, "stage": 0, "tokens_by_source": {"en": 96, "zh": 32, "code": 0}},
               {"kind": "train", "step": 2, "stage": 0, "tokens_by_source": {"en": 64, "zh": 64, "code": 0}},
               {"kind": "train", "step": 3, "stage": 1, "tokens_by_source": {"en": 128, "zh": 0, "code": 0}}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = mixture_section(load_curves(run), str(data_dir))
    assert "### 1. `wide` (stage mixture)" in text and "### 2. `sized` (sources by size)" in text
    assert "| `en` | 75.0% | 62.5% | 160 |" in text and "| `zh` | 25.0% | 37.5% | 96 |" in text
    sizes = {s["name"]: s["train"]["tokens"] for s in json.loads((data_dir / "manifest.json").read_text())["sources"]}
    assert f"| `en` | {100 * sizes['en'] / sum(sizes.values()):.1f}% | 100.0% | 128 |" in text
    one_source = [{**r, "tokens_by_source": {"default": 128}} for r in records]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one_source))
    (run / "stages.json").write_text(json.dumps({"stages": [{**s, "mixture": None} for s in stages]}))
    assert mixture_section(load_curves(run), str(data_dir)) == ""  # nothing to compare
