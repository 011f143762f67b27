"""The gradient noise scale estimator (launcher/train/noise_scale.py) on least squares with Gaussian noise, where
|G|^2 and tr(Sigma) are known in closed form: at world size 1 (two halves of a micro-batch) and 2 (two real gloo
ranks, the all-reduce the trainer uses). The trainer's probe and its resume are checked in the real 2-rank runs
(tests/multirank/test_resume.py); its cost in bench/bench_noise_scale.py."""
from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from launcher.common.errors import UserError
from launcher.config.run_config import load_run_config
from launcher.train.noise_probe import NoiseProbe
from launcher.train.noise_scale import NoiseEstimator, squared_norms
from tests.support.helpers import free_port, run_config_dict, write_yaml

DIM, NOISE_VAR = 16, 1.0
STEPS, DECAY, ROWS = 400, 0.99, 128  # "over enough steps": ~200 measurements' worth of smoothing


def offset() -> torch.Tensor:
    """w - w*: a unit vector, so |G|^2 = 1."""
    delta = torch.ones(DIM)
    return delta / delta.norm()


def closed_form() -> tuple[float, float]:
    """(|G|^2, tr Sigma) of the per-example loss 0.5 (x.w - y)^2, x ~ N(0, I), y = x.w* + N(0, s^2): G = delta,
    Sigma = delta delta^T + |delta|^2 I + s^2 I (Isserlis), so tr Sigma = (d + 1)|delta|^2 + d s^2."""
    sq = float(offset().square().sum())
    return sq, (DIM + 1) * sq + DIM * NOISE_VAR


def piece_gradient(w: torch.Tensor, rows: int, generator: torch.Generator) -> list[torch.Tensor]:
    """d/dw of the mean least-squares loss of `rows` fresh examples (autograd, as the trainer's probe)."""
    x = torch.randn(rows, DIM, generator=generator)
    y = x @ (w.detach() - offset()) + NOISE_VAR ** 0.5 * torch.randn(rows, generator=generator)
    loss = 0.5 * (x @ w - y).square().mean()
    return list(torch.autograd.grad(loss, [w]))


def check_recovered(estimator: NoiseEstimator) -> None:
    sq, trace = closed_form()
    estimate = estimator.estimate()
    assert estimate.grad_sq_norm == pytest.approx(sq, rel=0.1)
    assert estimate.noise_trace == pytest.approx(trace, rel=0.1)
    assert estimate.noise_scale == pytest.approx(trace / sq, rel=0.1)  # B_simple = 33 sequences


def test_one_rank_recovers_the_noise_scale_from_two_halves_of_a_micro_batch():
    generator = torch.Generator().manual_seed(0)
    w = torch.zeros(DIM, requires_grad=True)
    estimator = NoiseEstimator(DECAY)
    for _ in range(STEPS):  # one micro-batch of 2 x ROWS, its halves the pieces: B_small ROWS, B_big 2 x ROWS
        small_sq, big_sq, pieces = squared_norms([piece_gradient(w, ROWS, generator) for _ in range(2)])
        assert pieces == 2
        estimator.update(small_sq, big_sq, ROWS, ROWS * pieces)
    check_recovered(estimator)


def _rank(rank: int, port: int, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own examples
    w = torch.zeros(DIM, requires_grad=True)
    estimator = NoiseEstimator(DECAY)
    for _ in range(STEPS):  # one micro-batch of ROWS per rank: B_small ROWS, B_big 2 x ROWS
        small_sq, big_sq, pieces = squared_norms([piece_gradient(w, ROWS, generator)])
        estimator.update(small_sq, big_sq, ROWS, ROWS * pieces)
    torch.distributed.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"pieces": pieces, **estimator.state_dict()}, f)


def test_two_gloo_ranks_recover_the_noise_scale_and_agree(tmp_path):
    out = str(tmp_path / "state")
    mp.start_processes(_rank, args=(free_port(), out), nprocs=2, join=True, start_method="spawn")
    states = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    assert states[0] == states[1] and states[0]["pieces"] == 2  # the same estimate on every rank
    estimator = NoiseEstimator()
    estimator.load_state_dict(states[0])
    check_recovered(estimator)


def test_state_dict_resumes_the_same_values_and_empty_state_starts_afresh():
    generator = torch.Generator().manual_seed(1)
    w = torch.zeros(DIM, requires_grad=True)
    stream = [squared_norms([piece_gradient(w, 8, generator) for _ in range(2)])[:2] for _ in range(40)]
    whole, first = NoiseEstimator(), NoiseEstimator()
    expected = [whole.update(s, b, 8, 16) for s, b in stream]
    for s, b in stream[:25]:
        first.update(s, b, 8, 16)
    resumed = NoiseEstimator()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as the sidecar carries it
    assert [resumed.update(s, b, 8, 16) for s, b in stream[25:]] == expected[25:]
    fresh = NoiseEstimator()
    fresh.load_state_dict({})
    assert fresh.state_dict() == NoiseEstimator().state_dict() and fresh.estimate() is None
    with pytest.raises(ValueError, match="B_small < B_big"):
        fresh.update(1.0, 1.0, 16, 16)


def test_a_negative_noise_every_is_one_line(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", run_config_dict(logging={"noise_every": -1}))
    with pytest.raises(UserError) as info:
        load_run_config(path)
    assert str(info.value).endswith("logging.noise_every: must be >= 0 (0 = no gradient noise scale), got -1")


def test_the_probe_measures_two_halves_of_a_micro_batch_at_one_rank_and_leaves_the_generators_alone():
    """The trainer's probe at world size 1 on a real (tiny) RoFormer with dropout: B_small = half the micro-batch,
    B_big = the micro-batch, each half's gradient that of its mean masked-token loss; the random generators as
    before (dropout in the training step draws what it would without the probe). DeepSpeed's engine is stood in
    for by what the probe reads of it: .module and .optimizer (no loss scale: fp32)."""
    from types import SimpleNamespace

    from roformer import RoFormerConfig, RoFormerForMaskedLM
    from tests.support.helpers import TINY_MODEL

    torch.manual_seed(3)
    model = RoFormerForMaskedLM(RoFormerConfig(**TINY_MODEL)).train()
    engine = SimpleNamespace(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    ids = torch.randint(5, 900, (4, 16))
    labels = torch.where(torch.rand(4, 16) < 0.3, ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    probe = NoiseProbe(every=2, engine=engine, world_size=1)
    assert probe.measure(0, [batch]) == {} and probe.estimator.count == 0  # step 1: not a multiple of 2
    before = torch.get_rng_state()
    probe.measure(1, [batch])
    assert torch.equal(torch.get_rng_state(), before) and probe.estimator.count == 1

    def half(rows: slice) -> list[torch.Tensor]:
        torch.set_rng_state(before)  # the probe's draws: each half from the step's generator state
        out = model(**{k: v[rows] for k, v in batch.items()})
        return list(torch.autograd.grad(out.loss_sum / out.num_masked, list(model.parameters())))

    expected = NoiseEstimator()
    expected.update(*squared_norms([half(slice(0, 2)), half(slice(2, 4))])[:2], 2, 4)
    assert probe.state_dict() == pytest.approx(expected.state_dict(), rel=1e-5)


def test_zero3_and_a_single_sequence_measure_nothing_and_say_so_once():
    said = []
    probe = NoiseProbe.for_engine(50, None, zero_stage=3, world_size=2)
    probe.attach(said.append)
    assert probe.every == 0 and not probe.due(49)
    assert said == ["logging.noise_every 50: no gradient noise scale under ZeRO-3 (the parameters are partitioned); "
                    "ZeRO 0-2 measure it"]
    probe = NoiseProbe.for_engine(1, None, zero_stage=2, world_size=1)
    probe.attach(said.append)
    one = [{"input_ids": torch.zeros(1, 8, dtype=torch.long)}]
    assert probe.measure(0, one) == {} and probe.measure(1, one) == {}
    assert said[1:] == ["logging.noise_every: no gradient noise scale at one sequence per step on one rank"]
