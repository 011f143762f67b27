"""Session fixtures shared by the test modules: real data, one real training run, real exports.

Built once per pytest session, on first use, from the real parts: data_pipeline's preparation
(SentencePiece on linux-doc text), the real trainer on 2 ranks under DeepSpeed ZeRO-2, and
`roformer export`. Tests that damage files work on copies (`copy_of`). Helpers: tests/support/helpers.py.

Folders say what a test needs, and set its markers (setup.cfg) here, never by hand:
  tests/unit/       no multi-rank job: `pytest tests/unit` is the fast loop
  tests/multirank/  starts real multi-rank DeepSpeed jobs (or uses a fixture that does): `multiprocess`
  tests/cluster/    the two-node network-namespace cluster, MPI and Slurm: `multiprocess` + `cluster`
  tests/gpu/        the parts of `roformer gpu-check` on CUDA devices: `gpu` (skipped, saying so, without CUDA)
  tests/support/    helpers, rank wrappers and the namespace cluster, no tests
"""
from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import (
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    extract_archive,
    free_port,
    run_to_end,
    tiny_data_dir,
    tiny_run_config,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RESTORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FOLDER_MARKERS = {"unit": (), "multirank": ("multiprocess",), "cluster": ("multiprocess", "cluster"),
                  "gpu": ("gpu",)}


def pytest_configure(config):
    """torch on one CPU thread in the pytest process. The suite runs five lanes on two cores: torch's default of one
    thread a core spins waiting for a core that another lane holds (a tiny in-process training took 64 CPU-s at a
    load of 9 with two threads, 5.5 with one: tests/support/tiny_models.py). Jobs set their own (ranks: the node's
    cores / its ranks, launcher/train/rank_entry.py; fine-tunes: --threads)."""
    import torch

    torch.set_num_threads(1)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Markers from the test's folder (tests/<folder>/...); a test outside those folders is an error."""
    tests_root = Path(__file__).resolve().parent
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(tests_root).parts[0]
        if folder not in FOLDER_MARKERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/{{{','.join(FOLDER_MARKERS)}}}/")
        for name in FOLDER_MARKERS[folder]:
            item.add_marker(getattr(pytest.mark, name))
        if folder == "gpu" and not _cuda_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (roformer gpu-check); none here"))


@pytest.fixture(autouse=True)
def restored_signal_handlers():
    """The process's SIGINT/SIGTERM/SIGHUP handlers and signal mask as they were before each test: a test that runs
    a rank entry in-process (rank_entry.main) installs the rank's stop handlers, which only record a signal, so
    Ctrl-C or run_tests.sh's `kill -TERM` would no longer end the lane (tests/unit/test_signals_restored.py)."""
    saved = {signum: signal.getsignal(signum) for signum in RESTORED_SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) is not handler:  # None: not installed from Python
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(scope="session", autouse=True)
def warm_rank_jobs():
    """The session's fork server (tests/support/fork_server.py), started by the first warm job, stopped at the end."""
    from tests.support.helpers import stop_fork_server

    yield
    stop_fork_server()


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared data dir: real SentencePiece (vocab 900) and shards, English + Chinese."""
    return tiny_data_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server, its own process on 127.0.0.1 (tests/support/s3_server.py), with the bucket
    `roformer-test`; `s3_server.env()` are the variables a client needs."""
    from tests.support.s3_server import start_s3_server

    server = start_s3_server(tmp_path_factory.mktemp("s3_server"))
    server.client().create_bucket(Bucket="roformer-test")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_tiny_data(s3_server, tiny_data) -> str:
    """tiny_data uploaded to s3://roformer-test/tiny (data_pipeline.remote.upload). Read-only."""
    from data_pipeline.remote.upload import upload_directory

    location = "s3://roformer-test/tiny"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in s3_server.env().items():
            patch.setenv(key, value)
        upload_directory(tiny_data, location)
    return location


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory, tiny_data) -> Path:
    """One uninterrupted run of the real trainer: 2 ranks, ZeRO-2, fp32, no dropout, the three tiny
    stages (tests.support.helpers.TINY_STAGES, 16 steps), checkpoints every 4 steps and at stage ends (3 kept),
    validation every 5 steps, and the engine's final weights in RUN_DIR/reference.safetensors.
    Its log is RUN_DIR/../run.log, its MASTER_PORT in RUN_DIR/../master_port. Read-only: copy it
    before changing anything."""
    root = tmp_path_factory.mktemp("trainer_run")
    run_dir = root / "run"
    port = free_port()
    (root / "master_port").write_text(str(port))
    # As a user's run: the stage-end plot renders and the measured MFU peak (the helpers turn both off); the
    # gradient noise scale every 3 steps (test_resume.py's chain measures the same).
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT,
                             logging={"plots": True, "peak_tflops": 0.0, "noise_every": 3})
    run_to_end(2, config, run_dir, module=TEST_RANK_ENTRY,
               port=port, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1")
    return run_dir


@pytest.fixture(scope="session")
def trainer_export(tmp_path_factory, trainer_run) -> Path:
    """`roformer export` of trainer_run's latest checkpoint (read-only)."""
    from launcher.export.exporter import export_checkpoint

    return export_checkpoint(trainer_run, tmp_path_factory.mktemp("trainer_export") / "export")


@pytest.fixture(scope="session")
def stored_run(tmp_path_factory) -> Path:
    """A run directory written before the issue-9 restructure (tests/fixtures/README.md): 2 ranks,
    ZeRO-2, checkpoint global_step5. No process is started to get it. config.yaml's data.data_dir
    points at the stored corpus (`stored_run.parent / "data"`). Read-only: copy it before changing it."""
    return _unpacked_run(tmp_path_factory.mktemp("stored"), "old_run_dir.tar.xz", "old_run")


@pytest.fixture(scope="session")
def previous_run(tmp_path_factory, stored_run) -> Path:
    """A run directory written by the release before the checkpoint component (tests/fixtures/README.md):
    2 ranks, ZeRO-2, checkpoint global_step5 with a format-2 sidecar (file sizes and sha256), config
    versions. Trained on stored_run's corpus, which `previous_run.parent / "data"` links to. Read-only."""
    run_dir = _unpacked_run(tmp_path_factory.mktemp("previous"), "previous_run_dir.tar.xz", "prev_run")
    (run_dir.parent / "data").symlink_to(stored_run.parent / "data")
    return run_dir


@pytest.fixture(scope="session")
def release_run(tmp_path_factory, stored_run) -> Path:
    """A run directory written by the release the start-up work began from (tests/fixtures/README.md):
    the previous_run's model, schedule and corpus, 2 ranks, ZeRO-2, checkpoint global_step5. Read-only."""
    run_dir = _unpacked_run(tmp_path_factory.mktemp("release"), "release_run_dir.tar.xz", "release_run")
    (run_dir.parent / "data").symlink_to(stored_run.parent / "data")
    return run_dir


def _unpacked_run(root: Path, archive_name: str, folder: str) -> Path:
    """FOLDER/run of a stored archive, unpacked under root, its config.yaml's data.data_dir at FOLDER/data."""
    extract_archive(FIXTURES / archive_name, root)
    run_dir = root / folder / "run"
    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    config["data"]["data_dir"] = str(run_dir.parent / "data")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return run_dir


@pytest.fixture(scope="session")
def stored_export(tmp_path_factory, stored_run) -> Path:
    """`roformer export` of stored_run (consolidated in this process; no DeepSpeed job). Read-only."""
    from launcher.export.exporter import export_checkpoint

    return export_checkpoint(stored_run, tmp_path_factory.mktemp("stored_export") / "export")


@pytest.fixture
def copy_of(tmp_path):
    """copy_of(path) -> a private copy under tmp_path (for tests that damage or extend files)."""

    def copy(source: Path, name: str | None = None) -> Path:
        dest = tmp_path / (name or source.name)
        shutil.copytree(source, dest)
        return dest

    return copy


@pytest.fixture(scope="session")
def tasks_dir():
    """The labelled tasks' files of the set-up step's task files (idempotent: a no-op when `make setup` already made them)."""
    from launcher.downstream.task_data import prepare_task_data
    from launcher.downstream.tasks import default_tasks_dir

    prepare_task_data(default_tasks_dir())
    return default_tasks_dir()
