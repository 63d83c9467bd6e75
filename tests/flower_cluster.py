"""A real Flower deployment on 127.0.0.1 for the tests: one SuperLink, SuperNodes with their own data, ``flwr
run``. Every process is started in its own process group and stopped (SIGTERM, then SIGKILL) by its pid when
the ``with`` block ends, whether the test passed or not; every wait has a deadline."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_certificates(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files in ``folder``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = {
        "not_valid_before": now - datetime.timedelta(minutes=5),
        "not_valid_after": now + datetime.timedelta(days=1),
    }
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedhet test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid["not_valid_before"])
        .not_valid_after(valid["not_valid_after"])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid["not_valid_before"])
        .not_valid_after(valid["not_valid_after"])
        .add_extension(san, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(pem))
    paths["cert"].write_bytes(server.public_bytes(pem))
    paths["key"].write_bytes(
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@dataclass
class Cluster:
    root: Path
    port: int
    env: dict[str, str]
    certificates: dict[str, Path] | None
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.root / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.root,
                start_new_session=True,
            )
        self.processes[name] = proc
        return proc

    def wait_for(self, name: str, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log(name):
                return
            if self.processes[name].poll() is not None:
                raise RuntimeError(
                    f"{name} exited ({self.processes[name].returncode}):\n{self.log(name)[-3000:]}"
                )
            time.sleep(0.3)
        raise TimeoutError(f"{name} did not print {text!r} within {timeout:g} s:\n{self.log(name)[-3000:]}")

    def add_node(
        self,
        client_id: int,
        data_dir: Path,
        *,
        trusted: bool = True,
        name: str | None = None,
        warm: bool = False,
    ) -> str:
        """A SuperNode for ``client_id``; ``warm``: its ClientApps start from fedhet's warm SuperExec
        (``python -m fedhet.flower.node_exec`` beside a node run with ``--isolation process``: torch and
        fedhet imported once, seconds less per message) instead of the one Flower starts."""
        name = name or f"node{client_id}"
        runtime_port = free_port()
        args = [
            str(BIN / "flower-supernode"),
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--port",
            str(runtime_port),
        ]
        if warm:
            args += ["--isolation", "process"]
        if self.certificates is None:
            args.append("--insecure")
        elif trusted:
            args += ["--root-certificates", str(self.certificates["ca"])]
        else:
            args += ["--max-retries", "2"]  # no CA: it must fail the TLS handshake, then give up
        args += ["--node-config", f"client-id={client_id} data-dir='{data_dir}'"]
        node = self.start(name, args)
        if warm:
            self.start(
                f"{name}-exec",
                [str(BIN / "python"), "-m", "fedhet.flower.node_exec", "--insecure"]
                + ["--runtime-api-address", f"127.0.0.1:{runtime_port}", "--parent-pid", str(node.pid)],
            )
        return name

    def stop(self, name: str) -> None:
        proc = self.processes[name]
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:  # the group may outlive its leader (e.g. a SuperExec child)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def flwr_run(
        self, app_dir: Path, run_config: dict[str, object], timeout: float
    ) -> subprocess.CompletedProcess:
        overrides = " ".join(  # TOML values: 'text', 1.5, true
            f"{k}={v!r}" if isinstance(v, str) else f"{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in run_config.items()
        )
        return subprocess.run(
            [str(BIN / "flwr"), "run", str(app_dir), "test", "--run-config", overrides, "--stream"],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@contextmanager
def flower_cluster(root: Path, *, tls: bool = False) -> Iterator[Cluster]:
    """A SuperLink on a free port of 127.0.0.1 (TLS with a fresh CA, or insecure for loopback tests) and a
    ``flwr`` configuration pointing at it; SuperNodes are added with :meth:`Cluster.add_node`."""
    root.mkdir(parents=True, exist_ok=True)
    home = root / "flwr-home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    certificates = write_certificates(root) if tls else None
    cluster = Cluster(root=root, port=free_port(), env=env, certificates=certificates)
    connection = [f'address = "127.0.0.1:{cluster.port}"']
    args = [
        str(BIN / "flower-superlink"),
        "--disable-runtime-dependency-installation",
        "--port",
        str(cluster.port),
    ]
    if certificates is None:
        args.append("--insecure")
        connection.append("insecure = true")
    else:
        args += [
            "--ssl-certfile",
            str(certificates["cert"]),
            "--ssl-keyfile",
            str(certificates["key"]),
            "--ssl-ca-certfile",
            str(certificates["ca"]),
        ]
        connection.append(f'root-certificates = "{certificates["ca"]}"')
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "test"\n\n[superlink.test]\n' + "\n".join(connection) + "\n"
    )
    try:
        cluster.start("superlink", args)
        cluster.wait_for("superlink", "Uvicorn running on")
        yield cluster
    finally:
        for name in reversed(list(cluster.processes)):
            cluster.stop(name)
