"""Checks that need the machines, run after the plan is built and before anything starts.

1. the run directory exists (created if missing) and is writable here;
2. every host answers over ssh (the `ssh` pdsh will use), each unreachable one named;
3. the run directory is one directory on all nodes (a token written here, a marker by every node).
Host names reach ssh as separate arguments; remote shell text is only constants and quoted paths.
Local runs and Slurm runs skip 2 and 3.
check_nodes, after them: each node's GPUs against its torch wheel and FusedAdam (launcher/deepspeed_env/node_check.py).
"""
from __future__ import annotations

import json
import secrets
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launcher.common.errors import UserError
from launcher.launch.hostfile import LOCAL_HOSTNAMES
from launcher.launch.ssh import ssh

PREFLIGHT_DIR_PREFIX = ".preflight-"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"


def check_run_dir(run_dir: Path) -> None:
    """Create the run directory if needed and prove it is writable from this machine."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: exists and is not a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--run-dir {run_dir}: cannot create it: {err.strerror or err}") from None
    probe = run_dir / f".write-test-{secrets.token_hex(4)}"
    try:
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--run-dir {run_dir}: not writable: {err.strerror or err}") from None


def _parallel(hosts: list[str], fn) -> dict:
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        return dict(zip(hosts, pool.map(fn, hosts)))


def check_reachable(hosts: list[str], where: dict[str, str] | None = None) -> None:
    """Every host runs `true` over ssh; all unreachable hosts are named in one error."""
    if shutil.which("ssh") is None:
        raise UserError("ssh is not installed on this machine; multi-node launches need it")
    results = _parallel(hosts, lambda host: ssh(host, "true"))
    failed = [h for h, r in results.items() if r.returncode != 0]
    if failed:
        details = "; ".join(
            f"{h}{' (' + where[h] + ')' if where and h in where else ''}: {_last_line(results[h].stderr)}"
            for h in failed)
        raise UserError(f"not reachable over ssh (passwordless, BatchMode): {details}")


def check_shared_run_dir(run_dir: Path, hosts: list[str]) -> None:
    """Every node sees the same run directory (see module doc). Cleans up its marker files."""
    token = secrets.token_hex(8)
    probe_dir = run_dir / f"{PREFLIGHT_DIR_PREFIX}{token}"
    probe_dir.mkdir()
    try:
        (probe_dir / "launcher").write_text(token + "\n", encoding="utf-8")
        quoted_dir = shlex.quote(str(probe_dir))

        def write_marker(host: str) -> subprocess.CompletedProcess:
            marker = shlex.quote(f"{token}-{host}")
            return ssh(host, f"cd {quoted_dir} 2>/dev/null || exit 3; cat launcher || exit 3; "
                             f"echo {marker} > {shlex.quote(host)}.tmp && mv {shlex.quote(host)}.tmp "
                             f"{shlex.quote(host)} || exit 4")

        for host, result in _parallel(hosts, write_marker).items():
            if result.returncode == 3 or (result.returncode == 0 and result.stdout.strip() != token):
                raise UserError(
                    f"--run-dir {run_dir}: host {host} does not see the files written on this machine; the run "
                    "directory must be on a filesystem shared by all nodes (e.g. NFS, Lustre) at the same path")
            if result.returncode != 0:
                raise UserError(f"--run-dir {run_dir}: host {host} cannot write there: {_last_line(result.stderr)}")

        def read_markers(host: str) -> subprocess.CompletedProcess:
            names = " ".join(shlex.quote(h) for h in hosts)
            return ssh(host, f"cd {quoted_dir} && for f in {names}; do cat \"$f\" || echo MISSING-$f; done")

        expected = [f"{token}-{h}" for h in hosts]
        for reader, result in _parallel(hosts, read_markers).items():
            seen = result.stdout.split()
            for writer, want in zip(hosts, expected):
                if want not in seen:
                    raise UserError(f"--run-dir {run_dir}: host {reader} cannot read the marker written by host "
                                    f"{writer}; the run directory must be one shared filesystem on all nodes")
        for writer, want in zip(hosts, expected):
            path = probe_dir / writer
            if not path.is_file() or path.read_text(encoding="utf-8").strip() != want:
                raise UserError(f"--run-dir {run_dir}: this machine cannot read the marker written by host "
                                f"{writer}; the run directory must be one shared filesystem on all nodes")
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


def resolve_master_addr(first_host: str) -> str:
    """What DeepSpeed's runner would use: the first address of `hostname -I` on the first host."""
    result = ssh(first_host, "hostname -I")
    words = result.stdout.split()
    if result.returncode != 0 or not words:
        raise UserError(f"cannot find the address of {first_host} (`hostname -I` over ssh: "
                        f"{_last_line(result.stderr)}); pass --master_addr")
    return words[0]


def run_preflight(plan) -> str:
    """All checks for a LaunchPlan, in order; returns the master address to use."""
    check_run_dir(plan.run_dir)
    hosts = list(plan.resources)
    if all(h in LOCAL_HOSTNAMES for h in hosts) and plan.launcher != "pdsh":
        return plan.master_addr  # this machine only: mpirun / DeepSpeed's launcher start ranks without ssh
    if plan.launcher == "slurm":
        # srun starts the ranks without ssh (which compute nodes often refuse); checked by Slurm instead.
        print("roformer pretrain: --launcher slurm: not checking ssh reachability or the shared run directory",
              flush=True)
        return plan.master_addr
    where = {h.name: f"{plan.hostfile.path}:{h.line}" for h in plan.hostfile.hosts} if plan.hostfile else None
    check_reachable(hosts, where)
    check_shared_run_dir(plan.run_dir, hosts)
    return plan.master_addr or resolve_master_addr(hosts[0])


def node_facts(plan, host: str):
    """One node's GPUs and software (launcher/deepspeed_env/node_check.py): asked here for this machine, over ssh
    with the run's interpreter from the project's root elsewhere."""
    from launcher.deepspeed_env.node_check import NodeFacts, gather_facts
    from launcher.launch.env_forwarding import project_root

    if host in LOCAL_HOSTNAMES or not plan.multi_node:
        return gather_facts(host)
    result = ssh(host, f"cd {shlex.quote(str(project_root()))} && {shlex.quote(plan.python)} -m "
                       f"launcher.deepspeed_env.node_check {shlex.quote(host)}", timeout=120)
    try:
        return NodeFacts.from_dict(json.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError, KeyError):
        raise UserError(f"node {host}: its GPU check did not answer ({_last_line(result.stderr)})") from None


def check_nodes(plan, ask=None) -> dict[str, str]:
    """Every node's GPUs against its torch wheel and DeepSpeed's FusedAdam (node_check.py), before any rank
    starts: a wheel without a GPU's kernels stops the launch in one line; a node that cannot build FusedAdam
    switches the job to torch's fused AdamW, said in one line per node. Returns what the ranks' environment
    gains. `ask(host) -> NodeFacts` is injectable (tests); ranks on CPUs (DS_ACCELERATOR=cpu) and Slurm
    launches (no ssh to the nodes) are not asked."""
    from launcher.deepspeed_env.node_check import TORCH_ADAM_ENV, choose_optimizer, wheel_refusal

    if plan.env.get("DS_ACCELERATOR", "") not in ("", "cuda") \
            or plan.launcher == "slurm":
        return {}
    ask = ask or (lambda host: node_facts(plan, host))
    nodes = list(_parallel(list(plan.resources), ask).values())
    for facts in nodes:
        refusal = wheel_refusal(facts)
        if refusal:
            raise UserError(refusal)
    choice = choose_optimizer(nodes, plan.ds_json.config.get("optimizer"), str(plan.run_config.deepspeed.config))
    for line in choice.lines:
        print(f"roformer pretrain: {line}", flush=True)
    return {TORCH_ADAM_ENV: "1"} if choice.torch_adam else {}
