"""scripts/setup.sh's torch variant (scripts/torch_variant.py) with a fake `nvidia-smi` on PATH, and the
quiet set-up's failure output. The real set-up is never run here (it would rebuild the shared .venv)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO

SCRIPT = REPO / "scripts" / "torch_variant.py"


def fake_nvidia_smi(bin_dir: Path, gpus: list[tuple[str, str]], driver_cuda: str) -> Path:
    """An `nvidia-smi` answering the two queries torch_variant.py makes, as the real one prints them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    listing = "".join(f"{name}, {cap}\\n" for name, cap in gpus)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   f"if [ \"$1\" = --query-gpu=name,compute_cap ]; then printf '{listing}'; exit 0; fi\n"
                   f"echo '| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: {driver_cuda}     |'\n")
    smi.chmod(0o755)
    return bin_dir


def decide(*args: str, path_dirs: list[Path] = (), env: dict | None = None) -> tuple[int, dict, str]:
    """Run the script with only `path_dirs` + /usr/bin:/bin on PATH (no real nvidia-smi leaks in)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_VARIANT", "TORCH_CUDA_TAG")}
    environ["PATH"] = os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"])
    environ.update(env or {})
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=environ,
                          timeout=60)
    fields = dict(line.split("=", 1) for line in done.stdout.splitlines())
    return done.returncode, fields, done.stderr


@pytest.fixture
def no_smi_on_path():
    if any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has a real nvidia-smi in /usr/bin: 'no GPU' cannot be faked here")


def test_auto_without_nvidia_smi_installs_the_cpu_wheel(no_smi_on_path):
    code, fields, _ = decide()
    assert code == 0
    assert fields["action"] == "install" and fields["variant"] == "cpu"
    assert fields["spec"] == "torch==2.13.0+cpu" and fields["index_url"] == "https://download.pytorch.org/whl/cpu"
    assert fields["reason"] == "CPU torch 2.13.0 (TORCH_VARIANT=auto: no GPU visible to nvidia-smi)"


@pytest.mark.parametrize("driver, gpus, tag", [
    ("12.2", [("Tesla V100-SXM2-32GB", "7.0")] * 4, "cu126"),     # V100 box, CUDA 12.2 driver
    ("12.8", [("Tesla V100-SXM2-16GB", "7.0")] * 4, "cu126"),     # R570: cu128 is not published for 2.13
    ("13.0", [("Tesla V100-SXM2-16GB", "7.0")], "cu126"),         # only the 12.6 line keeps sm_70
    ("12.8", [("Tesla T4", "7.5")], "cu126"),
    ("12.8", [("NVIDIA A100-SXM4-40GB", "8.0")] * 8, "cu126"),    # any 12.x driver: minor-version compatibility
    ("13.0", [("NVIDIA H100 80GB HBM3", "9.0")], "cu130"),
    ("13.0", [("Tesla T4", "7.5")], "cu130"),
    ("12.0", [("NVIDIA A100-SXM4-40GB", "8.0")], "cu126"),
])
def test_auto_with_a_gpu_installs_the_cuda_wheel_of_the_driver(tmp_path, driver, gpus, tag):
    code, fields, _ = decide(path_dirs=[fake_nvidia_smi(tmp_path / "bin", gpus, driver)])
    assert code == 0
    assert fields["variant"] == "cuda" and fields["spec"] == f"torch==2.13.0+{tag}"
    assert fields["index_url"] == f"https://download.pytorch.org/whl/{tag}"
    assert fields["arch_list"] == gpus[0][1]
    assert f"nvidia-smi sees {len(gpus)} GPU" in fields["reason"] and f"driver CUDA {driver}" in fields["reason"]


def test_mixed_gpus_get_every_compute_capability(tmp_path):
    smi = fake_nvidia_smi(tmp_path / "bin", [("Tesla V100-SXM2-32GB", "7.0"), ("NVIDIA H100 PCIe", "9.0")], "12.8")
    code, fields, _ = decide(path_dirs=[smi])
    assert code == 0 and fields["arch_list"] == "7.0;9.0" and fields["spec"].endswith("+cu126")
    # On a CUDA 13 driver the line covering both: cu130 lacks the V100, so cu126, and the reason says so.
    smi = fake_nvidia_smi(tmp_path / "bin13", [("Tesla V100-SXM2-32GB", "7.0"), ("NVIDIA A100-SXM4-80GB", "8.0")],
                          "13.0")
    code, fields, _ = decide(path_dirs=[smi])
    assert code == 0 and fields["spec"].endswith("+cu126")
    assert "the cu130 wheels lack the Tesla V100-SXM2-32GB (compute capability 7.0)" in fields["reason"]


def test_the_matrix_is_the_published_one():
    """The data the decision and docs/gpu.md follow: torch 2.13's CUDA lines, sm_70 on 12.6 only, no cu128."""
    from launcher.deepspeed_env.wheel_matrix import torch_variant

    module = torch_variant()
    assert set(module.TORCH_CUDA_MATRIX) == {"cu126", "cu130", "cu132"}
    assert [tag for tag, line in module.TORCH_CUDA_MATRIX.items() if module.covers(line["archs"], (7, 0))] == ["cu126"]
    assert module.covers(("9.0",), (9, 0)) and not module.covers(("9.0",), (10, 0))
    assert module.covers(("12.0+PTX",), (12, 1)) and module.covers(("sm_80", "sm_86"), (8, 9))
    assert not module.covers(("sm_75", "sm_80"), (7, 0)) and module.covers(("compute_70",), (7, 5))


def test_explicit_variants(tmp_path, no_smi_on_path):
    smi = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", "9.0")], "12.8")
    code, fields, _ = decide("--variant", "cpu", path_dirs=[smi])
    assert code == 0 and fields["variant"] == "cpu" and fields["reason"] == "CPU torch 2.13.0 (TORCH_VARIANT=cpu)"
    # A login node without GPUs building the venv the GPU nodes share: the CUDA 12 line every driver runs.
    code, fields, _ = decide("--variant", "cuda")
    assert code == 0 and fields["variant"] == "cuda" and fields["spec"] == "torch==2.13.0+cu126"
    assert "no driver visible here" in fields["reason"]
    code, fields, _ = decide(env={"TORCH_VARIANT": "cuda", "TORCH_CUDA_TAG": "cu130"})
    assert fields["spec"] == "torch==2.13.0+cu130" and "TORCH_CUDA_TAG=cu130" in fields["reason"]


@pytest.mark.parametrize("env, message", [
    ({"TORCH_VARIANT": "gpu"}, "TORCH_VARIANT='gpu': expected one of auto, cpu, cuda"),
    ({"TORCH_VARIANT": "cuda", "TORCH_CUDA_TAG": "12.4"}, "TORCH_CUDA_TAG='12.4': expected a PyTorch wheel tag"),
    ({"TORCH_VARIANT": "cuda", "TORCH_CUDA_TAG": "cu128"},
     "TORCH_CUDA_TAG=cu128: torch 2.13.0 is not published for cu128 (its CUDA lines: cu126, cu130, cu132)"),
])
def test_bad_choices_are_one_line_and_exit_2(env, message):
    code, fields, err = decide(env=env)
    assert code == 2 and fields == {} and err.startswith(f"setup: {message}")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("tag, gpus, driver, message", [
    ("cu130", [("Tesla V100-SXM2-16GB", "7.0")], "13.0",
     "TORCH_CUDA_TAG=cu130: torch 2.13.0+cu130 has no kernels for the Tesla V100-SXM2-16GB (compute capability 7.0) "
     "here; use TORCH_CUDA_TAG=cu126 make setup"),
    ("cu130", [("NVIDIA A100-SXM4-40GB", "8.0")], "12.8",
     "TORCH_CUDA_TAG=cu130: CUDA 13.0 needs a CUDA 13 driver; this one runs CUDA 12.8"),
])
def test_a_tag_lacking_a_gpu_here_is_refused_naming_it(tmp_path, tag, gpus, driver, message):
    smi = fake_nvidia_smi(tmp_path / "bin", gpus, driver)
    code, fields, err = decide(path_dirs=[smi], env={"TORCH_CUDA_TAG": tag})
    assert code == 2 and fields == {} and err.strip() == f"setup: {message}"


def test_old_driver_refused_with_the_way_out(tmp_path):
    code, _, err = decide(path_dirs=[fake_nvidia_smi(tmp_path / "bin", [("Tesla V100-SXM2-16GB", "7.0")], "11.4")])
    assert code == 2 and "the driver supports CUDA 11.4" in err and "install a torch of your own" in err


def test_an_existing_torch_is_kept(tmp_path):
    smi = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", "9.0")], "12.8")
    # auto keeps whatever is there, and says how to switch when it is a CPU build on a GPU box.
    code, fields, _ = decide("--installed", "2.13.0+cpu", path_dirs=[smi])
    assert code == 0 and fields["action"] == "keep" and fields["spec"] == ""
    assert fields["reason"].startswith("torch 2.13.0+cpu already in the venv, kept (TORCH_VARIANT=auto")
    assert "TORCH_VARIANT=cuda replaces it" in fields["reason"]
    # A hand-installed CUDA torch (PyPI's plain version is a CUDA build) survives an explicit cuda.
    for installed in ("2.13.0+cu126", "2.13.0"):
        code, fields, _ = decide("--variant", "cuda", "--installed", installed, path_dirs=[smi])
        assert fields["action"] == "keep" and fields["variant"] == "cuda"
    # An explicit variant that differs replaces it.
    code, fields, _ = decide("--variant", "cuda", "--installed", "2.13.0+cpu", path_dirs=[smi])
    assert fields["action"] == "install" and fields["spec"] == "torch==2.13.0+cu126"


def test_failing_setup_step_shows_the_log_tail_and_path(tmp_path):
    """A step that fails prints its name, the end of its output and the log's path (exit status kept);
    the steps before it printed one line each."""
    fake_python = tmp_path / "python3"
    fake_python.write_text("#!/bin/sh\necho 'venv: cannot create: disk full (marker 71)' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    log = tmp_path / "setup.log"
    env = {**os.environ, "PYTHON": str(fake_python), "VENV": str(tmp_path / "venv"), "SETUP_LOG": str(log),
           "PIP_CACHE_DIR": str(tmp_path / "pip")}
    done = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True, env=env,
                          timeout=120)
    if "Debian packages: installing" in done.stdout:
        pytest.skip("this machine lacks the Debian packages; the test must not install them")
    assert done.returncode == 3
    assert done.stdout.splitlines() == [f"setup: log of every command: {log}", "setup: Debian packages: all 12 present"]  # scripts/setup.sh: APT_PACKAGES
    err = done.stderr.splitlines()
    assert err[0] == f"setup: FAILED: create {tmp_path / 'venv'} (exit 3); last lines of {log}:"
    assert "  | venv: cannot create: disk full (marker 71)" in err
    assert err[-1] == f"setup: the whole output is in {log}"
    assert "disk full (marker 71)" in log.read_text()



def _uv_settings(env: dict) -> dict:
    """scripts/uv_settings.py run with this venv's pip: the UV_* variables the set-up exports."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "uv_settings.py"), sys.executable],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def test_the_set_up_hands_pips_indexes_to_uv(tmp_path):
    """uv reads none of pip's settings: the set-up exports pip's indexes, wheel folders and constraints as uv's (a
    multi-line list as one line, the install section before the global one, a PIP_* variable before the files, a
    UV_* variable already set kept)."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://mirror.example/simple\nextra-index-url =\n"
                      "    file:///srv/a/simple\n    file:///srv/b/simple\nfind-links = /srv/global-wheels\n"
                      "constraint = /srv/caps.txt\n[install]\nfind-links = /srv/wheels\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = str(config)  # read after the machine's files: its keys win
    assert _uv_settings(env) == {"UV_INDEX_URL": "https://mirror.example/simple",
                                 "UV_EXTRA_INDEX_URL": "file:///srv/a/simple file:///srv/b/simple",
                                 "UV_FIND_LINKS": "/srv/wheels", "UV_CONSTRAINT": "/srv/caps.txt"}
    env.update(PIP_FIND_LINKS="/from/env", UV_INDEX_URL="https://uv.example/simple")
    got = _uv_settings(env)
    assert got["UV_FIND_LINKS"] == "/from/env" and "UV_INDEX_URL" not in got  # uv's own stays as it is
