"""Two "nodes" on one machine: network namespaces joined by a bridge, each running its own sshd.

    with TwoNodeCluster(tmp_dir) as cluster:   # raises NamespacesUnavailable if the kernel refuses
        env = cluster.client_env()             # PATH with an `ssh` wrapper that resolves node1/node2
        ...

Layout (names carry a random tag so parallel runs and other users of the machine are untouched):
- root namespace: bridge `rf<tag>br` with 10.X.Y.1/24; this is where `roformer pretrain` runs.
- namespace `rf<tag>n<i>` per node: interface `eth1` (same name on every node, so one
  GLOO_SOCKET_IFNAME works everywhere) with 10.X.Y.(10+i), its veth peer on the bridge, `lo` up,
  and `sshd -D` listening only on that address, with its own host key, a generated client key in
  AuthorizedKeysFile, PidFile in the temp dir, no PAM.
- `bin/ssh`: `exec /usr/bin/ssh -F ssh_config "$@"`. pdsh, DeepSpeed's runner and our pre-flight
  all call plain `ssh` from PATH, so the host names resolve without ~/.ssh or /etc/hosts.
Namespaces share the filesystem and the PID space with the root namespace; `pids_in_nodes()`
lists the processes whose network namespace is a node's (used to check for orphans).
Teardown (also after failures) kills every process left in the namespaces, deletes them and the
bridge, and removes the temp files.
"""
from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


class NamespacesUnavailable(RuntimeError):
    """The kernel (or missing privileges/tools) refuses network namespaces; the message says why."""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
    return result


def _free_subnet() -> str:
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for _ in range(200):
        prefix = f"10.{random.randint(100, 199)}.{random.randint(0, 255)}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 test subnet found")


class TwoNodeCluster:
    def __init__(self, work_dir: Path, nodes: int = 2):
        # Not `random`: code under test seeds the global RNG (launcher/checkpoint/checkpointer.py), which made two
        # pytest sessions pick the same names and collide on a left-over bridge.
        self.tag = secrets.token_hex(3)[:5]
        self.dir = Path(work_dir) / f"cluster-{self.tag}"
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.netns = {name: f"rf{self.tag}n{i + 1}" for i, name in enumerate(self.node_names)}
        self.bridge = f"rf{self.tag}br"
        self.subnet = ""
        self.address: dict[str, str] = {}
        self.sshd: dict[str, subprocess.Popen] = {}
        self._created_netns: list[str] = []
        self._created_bridge = False

    # ---- set-up -------------------------------------------------------------------------------
    def __enter__(self) -> "TwoNodeCluster":
        self._check_possible()
        try:
            self._create_network()
            self._create_ssh()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_possible(self) -> None:
        for tool in ("ip", SSHD, "ssh-keygen", "pdsh"):
            if shutil.which(tool) is None:
                raise NamespacesUnavailable(f"{tool} is not installed")
        probe = f"rf{self.tag}probe"
        result = _run("ip", "netns", "add", probe, check=False)
        if result.returncode != 0:
            raise NamespacesUnavailable(f"`ip netns add` refused: {result.stderr.strip()}")
        _run("ip", "netns", "del", probe, check=False)

    def _create_network(self) -> None:
        self.subnet = _free_subnet()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._created_bridge = True
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.node_names, start=1):
            ns = self.netns[name]
            _run("ip", "netns", "add", ns)
            self._created_netns.append(ns)
            host_side = f"rf{self.tag}v{i}"
            _run("ip", "link", "add", host_side, "type", "veth", "peer", "name", "eth1", "netns", ns)
            _run("ip", "link", "set", host_side, "master", self.bridge, "up")
            self.address[name] = f"{self.subnet}.{10 + i}"
            _run("ip", "-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth1")
            _run("ip", "-n", ns, "link", "set", "eth1", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _create_ssh(self) -> None:
        self.dir.mkdir(parents=True)
        (self.dir / "bin").mkdir()
        key = self.dir / "id_test"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "roformer-test", "-f", str(key))
        shutil.copy(f"{key}.pub", self.dir / "authorized_keys")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        lines = []
        for name in self.node_names:
            host_key = self.dir / f"{name}_host_key"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
            config = self.dir / f"sshd_{name}.conf"
            config.write_text("\n".join([
                f"ListenAddress {self.address[name]}", "Port 22", f"HostKey {host_key}",
                f"PidFile {self.dir / f'sshd_{name}.pid'}", f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PrintMotd no",
                "MaxStartups 100:30:200", "MaxSessions 100", "",
            ]))
            log = open(self.dir / f"sshd_{name}.log", "w")
            self.sshd[name] = subprocess.Popen(
                ["ip", "netns", "exec", self.netns[name], SSHD, "-D", "-e", "-f", str(config)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            lines += [f"Host {name}", f"  HostName {self.address[name]}"]
        user = os.environ.get("USER") or "root"
        lines += ["Host *", f"  User {user}", f"  IdentityFile {key}", "  IdentitiesOnly yes",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  BatchMode yes",
                  "  LogLevel ERROR", "  ConnectTimeout 5", ""]
        self.ssh_config.write_text("\n".join(lines))
        wrapper = self.dir / "bin" / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_config} "$@"\n')
        wrapper.chmod(0o755)
        for name in self.node_names:
            self._wait_for_port(name)

    def _wait_for_port(self, name: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sshd[name].poll() is not None:
                log = (self.dir / f"sshd_{name}.log").read_text()
                raise RuntimeError(f"sshd for {name} exited: {log.strip()}")
            try:
                with socket.create_connection((self.address[name], 22), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd for {name} is not listening on {self.address[name]}:22")

    # ---- use ----------------------------------------------------------------------------------
    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for `roformer pretrain`: the ssh wrapper first on PATH, gloo on eth1."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.dir / 'bin'}:{env.get('PATH', os.defpath)}"
        env["GLOO_SOCKET_IFNAME"] = "eth1"
        return env

    def ssh(self, node: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/bin/ssh", "-F", str(self.ssh_config), node, command],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def add_unreachable_host(self, name: str) -> None:
        """A host name that resolves (to the bridge) but where nothing listens for ssh."""
        with open(self.ssh_config, "r+") as f:
            text = f.read()
            f.seek(0)
            f.write(f"Host {name}\n  HostName {self.subnet}.1\n  Port 1\n" + text)
            f.truncate()

    def set_link(self, node: str, up: bool) -> None:
        """Take `node`'s cable out (or put it back): its veth's end on the bridge goes down, so packets
        to and from the node vanish silently, as with a failed switch port; the node's own `eth1`
        stays configured (no error on its side)."""
        host_side = f"rf{self.tag}v{self.node_names.index(node) + 1}"
        _run("ip", "link", "set", host_side, "up" if up else "down")

    def hide_directory_on(self, node: str, path: Path) -> None:
        """Mount an empty tmpfs over `path` as `node` sees it (its sshd's mount namespace only), so
        `path` is no longer one shared directory. Undone when the node's sshd stops."""
        _run("nsenter", "-t", str(self.sshd[node].pid), "-m", "mount", "-t", "tmpfs", "tmpfs", str(path))

    def pids_in_nodes(self) -> dict[str, list[int]]:
        """Processes living in each node's network namespace, sshd listeners excluded."""
        listeners = {p.pid for p in self.sshd.values()} | self._sshd_pids_from_files()
        out = {}
        for name, ns in self.netns.items():
            text = _run("ip", "netns", "pids", ns, check=False).stdout
            out[name] = [int(p) for p in text.split() if int(p) not in listeners]
        return out

    def _sshd_pids_from_files(self) -> set[int]:
        pids = set()
        for name in self.node_names:
            pid_file = self.dir / f"sshd_{name}.pid"
            if pid_file.is_file():
                try:
                    pids.add(int(pid_file.read_text().split()[0]))
                except (ValueError, IndexError):
                    pass
        return pids

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        for proc in self.sshd.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in self._created_netns:
            for _ in range(3):  # anything a test left behind in the node (ranks, shells)
                pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.2)
            _run("ip", "netns", "del", ns, check=False)
        self._created_netns.clear()
        if self._created_bridge:
            _run("ip", "link", "del", self.bridge, check=False)
            self._created_bridge = False
        shutil.rmtree(self.dir, ignore_errors=True)
