"""A real registry for the tests: Debian's `docker-registry` (Distribution 2.8) on
127.0.0.1 with TLS, plus what the tests need around it.

- `Pki`: a CA and a serving certificate for 127.0.0.1, made with `cryptography`.
- `Registry`: one `docker-registry` process, either htpasswd (Basic) or token (Bearer)
  auth; instances can share one storage directory, so images pushed once are served by
  every instance. `stop()`, `pause()`/`resume()` (SIGSTOP: a registry that accepts
  connections and never answers) make faults real.
- `TokenServer`: a Distribution token service (ES256 JWTs with an x5c chain the
  registry trusts); anonymous clients get `pull` on `public/*` only.
- `CountingProxy`: an HTTP(S) reverse proxy that counts requests before forwarding them,
  so a test can prove a lookup made none.
- `push_image` / `push_index`: images pushed through the registry's HTTP API.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import http.client
import http.server
import io
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from webhook.registry import _client as oci

REGISTRY_BIN = "docker-registry"
HTPASSWD_BIN = "htpasswd"
USER, PASSWORD = "builder", "s3cret-pw"
SERVICE, ISSUER = "initshift-test-registry", "initshift-test-issuer"
PUBLIC_PREFIX = "public/"  # repositories the token service lets anonymous clients pull


class RegistryUnavailable(RuntimeError):
    pass


def require_binaries() -> None:
    """Fail (never skip) when the registry is missing: the Makefile installs it as root."""
    missing = [b for b in (REGISTRY_BIN, HTPASSWD_BIN) if shutil.which(b) is None]
    if missing:
        how = "run `make system-deps` as root" if os.geteuid() == 0 else "install docker-registry and apache2-utils"
        raise RegistryUnavailable(f"missing {', '.join(missing)}: {how}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- certificates ----------------------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Pki:
    root: Path
    ca_file: Path = field(init=False)
    cert_file: Path = field(init=False)
    key_file: Path = field(init=False)
    token_cert_file: Path = field(init=False)
    token_key: ec.EllipticCurvePrivateKey = field(init=False)
    token_cert_der: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
        later = now + dt.timedelta(days=2)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(_name("initshift test CA")).issuer_name(_name("initshift test CA"))
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(later)
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(later)
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                            x509.DNSName("localhost")]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.ca_file = self.root / "ca.pem"
        self.cert_file = self.root / "server.pem"
        self.key_file = self.root / "server-key.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(_pem(key))
        # The token signer: a self-signed certificate the registry trusts as a root.
        self.token_key = ec.generate_private_key(ec.SECP256R1())
        token_cert = (x509.CertificateBuilder().subject_name(_name("initshift test token signer"))
                      .issuer_name(_name("initshift test token signer")).public_key(self.token_key.public_key())
                      .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
                      .sign(self.token_key, hashes.SHA256()))
        self.token_cert_der = token_cert.public_bytes(serialization.Encoding.DER)
        self.token_cert_file = self.root / "token-signer.pem"
        self.token_cert_file.write_bytes(token_cert.public_bytes(serialization.Encoding.PEM))

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


# --- the registry process -----------------------------------------------------------------

class Registry:
    """One `docker-registry` process on 127.0.0.1 with TLS."""

    def __init__(self, workdir: Path, pki: Pki, storage: Path, *, auth: str = "htpasswd",
                 token_realm: str = "") -> None:
        require_binaries()
        self.pki, self.port = pki, free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.workdir = workdir / f"registry-{self.port}"
        self.workdir.mkdir(parents=True)
        htpasswd = self.workdir / "htpasswd"
        line = subprocess.run([HTPASSWD_BIN, "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True)
        htpasswd.write_text(line.stdout)
        if auth == "htpasswd":
            auth_cfg: dict[str, Any] = {"htpasswd": {"realm": "initshift-test", "path": str(htpasswd)}}
        elif auth == "none":  # anonymous pulls and pushes
            auth_cfg = {}
        else:
            auth_cfg = {"token": {"realm": token_realm, "service": SERVICE, "issuer": ISSUER,
                                  "rootcertbundle": str(pki.token_cert_file)}}
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "maintenance": {"uploadpurging": {"enabled": False}}},
            "http": {"addr": self.host, "secret": uuid.uuid4().hex,
                     "tls": {"certificate": str(pki.cert_file), "key": str(pki.key_file)}},
        }
        if auth_cfg:
            config["auth"] = auth_cfg
        cfg_file = self.workdir / "config.yml"
        cfg_file.write_text(json.dumps(config))  # JSON is YAML
        self.log_file = self.workdir / "registry.log"
        self._log = self.log_file.open("wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(cfg_file)], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"https://{self.host}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        with httpx.Client(verify=self.pki.client_context(), timeout=2) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RegistryUnavailable(f"docker-registry exited: {self.log_file.read_text()[-2000:]}")
                try:
                    if http.get(f"{self.url}/v2/").status_code in (200, 401):
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RegistryUnavailable(f"docker-registry did not start: {self.log_file.read_text()[-2000:]}")
                time.sleep(0.05)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    close = stop


# --- token service ------------------------------------------------------------------------

def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_token(pki: Pki, subject: str, access: list[dict[str, Any]], lifetime: int = 300) -> str:
    now = int(time.time())
    header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(pki.token_cert_der).decode()]}
    claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + lifetime, "nbf": now - 60,
              "iat": now, "jti": uuid.uuid4().hex, "access": access}
    signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    der = pki.token_key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


class _Server:
    """A threaded stdlib HTTP(S) server on 127.0.0.1 running `handler`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], tls: ssl.SSLContext | None) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.host}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _TokenHandler(_Quiet):
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        owner: TokenServer = self.server.owner  # type: ignore[attr-defined]
        query = dict(httpx.URL(self.path).params)
        owner.requests += 1
        subject = ""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            if (user, password) != (USER, PASSWORD):
                self.reply(401, b'{"details":"bad credentials"}', {"Content-Type": "application/json"})
                return
            subject = user
        access = []
        for scope in filter(None, [query.get("scope", "")]):
            kind, name, actions = scope.split(":", 2)
            if subject or name.startswith(PUBLIC_PREFIX):
                allowed = actions.split(",") if subject else ["pull"]
                access.append({"type": kind, "name": name, "actions": allowed})
        token = sign_token(owner.pki, subject, access)
        body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
        self.reply(200, body, {"Content-Type": "application/json"})


class TokenServer(_Server):
    def __init__(self, pki: Pki) -> None:
        self.pki, self.requests = pki, 0
        super().__init__(_TokenHandler, pki.server_context())

    @property
    def realm(self) -> str:
        return f"{self.url}/token"


# --- counting reverse proxy ---------------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}


class _ProxyHandler(_Quiet):
    def _forward(self) -> None:
        owner: CountingProxy = self.server.owner  # type: ignore[attr-defined]
        with owner.lock:
            owner.requests.append(f"{self.command} {self.path}")
        upstream = http.client.HTTPSConnection("127.0.0.1", owner.upstream_port, context=owner.upstream_tls,
                                               timeout=30)
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}}
            upstream.request(self.command, self.path, body=body, headers=headers)
            resp = upstream.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP | {"content-length"}}
            self.send_response(resp.status)
            for k, v in out.items():
                self.send_header(k, v)
            length_header = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length_header or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_HEAD = _forward  # noqa: N815 - stdlib naming


class CountingProxy(_Server):
    """Counts every request, then forwards it to the registry."""

    def __init__(self, registry: Registry, *, tls: bool = True) -> None:
        self.upstream_port, self.upstream_tls = registry.port, registry.pki.client_context()
        self.requests: list[str] = []
        self.lock = threading.Lock()
        super().__init__(_ProxyHandler, registry.pki.server_context() if tls else None)

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


# --- pushing images through the HTTP API ----------------------------------------------------

def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _layer() -> tuple[bytes, str]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, mtime=0), _digest(tar_bytes)


@dataclass(frozen=True)
class Pushed:
    digest: str
    size: int
    media_type: str


class Pusher:
    """Pushes blobs and manifests with Basic auth to an htpasswd registry."""

    def __init__(self, registry: Registry) -> None:
        self.base = registry.url
        self.http = httpx.Client(verify=registry.pki.client_context(), auth=(USER, PASSWORD), timeout=30)

    def close(self) -> None:
        self.http.close()

    def blob(self, repo: str, data: bytes) -> str:
        digest = _digest(data)
        start = self.http.post(f"{self.base}/v2/{repo}/blobs/uploads/")
        start.raise_for_status()
        location = httpx.URL(start.headers["Location"]).copy_merge_params({"digest": digest})
        if not location.is_absolute_url:
            location = httpx.URL(self.base).join(location)
        self.http.put(location, content=data, headers={"Content-Type": "application/octet-stream"}).raise_for_status()
        return digest

    def manifest(self, repo: str, ref: str, doc: dict[str, Any]) -> Pushed:
        body = json.dumps(doc, indent=2).encode()
        media_type = doc["mediaType"]
        resp = self.http.put(f"{self.base}/v2/{repo}/manifests/{ref}", content=body,
                             headers={"Content-Type": media_type})
        if resp.status_code >= 300:
            raise RuntimeError(f"push {repo}:{ref} failed: {resp.status_code} {resp.text}")
        return Pushed(_digest(body), len(body), media_type)

    def image(self, repo: str, tag: str | None, *, entrypoint: list[str] | None = None,
              cmd: list[str] | None = None, os_: str = "linux", arch: str = "amd64", variant: str = "",
              oci_types: bool = False) -> Pushed:
        layer, diff_id = _layer()
        layer_digest = self.blob(repo, layer)
        config: dict[str, Any] = {"architecture": arch, "os": os_,
                                  "config": {"Env": ["PATH=/usr/bin:/bin"]},
                                  "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
        if variant:
            config["variant"] = variant
        if entrypoint is not None:
            config["config"]["Entrypoint"] = entrypoint
        if cmd is not None:
            config["config"]["Cmd"] = cmd
        config_bytes = json.dumps(config).encode()
        config_digest = self.blob(repo, config_bytes)
        if oci_types:
            media, config_type, layer_type = (oci.OCI_MANIFEST, "application/vnd.oci.image.config.v1+json",
                                              "application/vnd.oci.image.layer.v1.tar+gzip")
        else:
            media, config_type, layer_type = (oci.DOCKER_MANIFEST, "application/vnd.docker.container.image.v1+json",
                                              "application/vnd.docker.image.rootfs.diff.tar.gzip")
        doc = {"schemaVersion": 2, "mediaType": media,
               "config": {"mediaType": config_type, "size": len(config_bytes), "digest": config_digest},
               "layers": [{"mediaType": layer_type, "size": len(layer), "digest": layer_digest}]}
        return self.manifest(repo, tag or _digest(json.dumps(doc, indent=2).encode()), doc)

    def index(self, repo: str, tag: str, entries: list[tuple[dict[str, str], Pushed]], *,
              oci_types: bool = True, attestation_of: Pushed | None = None) -> Pushed:
        manifests = [{"mediaType": p.media_type, "size": p.size, "digest": p.digest, "platform": platform}
                     for platform, p in entries]
        if attestation_of is not None:  # what buildx adds: skipped by the lookup
            manifests.append({"mediaType": attestation_of.media_type, "size": attestation_of.size,
                              "digest": attestation_of.digest,
                              "platform": {"architecture": "unknown", "os": "unknown"},
                              "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                                              "vnd.docker.reference.digest": entries[0][1].digest}})
        doc = {"schemaVersion": 2, "mediaType": oci.OCI_INDEX if oci_types else oci.DOCKER_LIST,
               "manifests": manifests}
        return self.manifest(repo, tag, doc)


# --- one shared environment per test session ------------------------------------------------

@dataclass
class Env:
    """The registries, token service and images every registry test reads."""

    root: Path
    pki: Pki
    storage: Path
    basic: Registry  # htpasswd auth
    tokens: TokenServer
    bearer: Registry  # token auth, same storage
    images: dict[str, Pushed]
    extra: list[Any] = field(default_factory=list)

    def registry(self, auth: str = "htpasswd") -> Registry:
        """A fresh process on the same storage, for tests that stop or pause it."""
        reg = Registry(self.root, self.pki, self.storage, auth=auth, token_realm=self.tokens.realm)
        self.extra.append(reg)
        return reg

    def proxy(self, registry: Registry | None = None, *, tls: bool = True) -> CountingProxy:
        proxy = CountingProxy(registry or self.basic, tls=tls)
        self.extra.append(proxy)
        return proxy

    def close(self) -> None:
        for item in [*self.extra, self.basic, self.bearer, self.tokens]:
            item.close()
        shutil.rmtree(self.root, ignore_errors=True)


def push_fixtures(pusher: Pusher) -> dict[str, Pushed]:
    """The images the tests resolve, named by what they exercise."""
    img: dict[str, Pushed] = {}
    img["entry"] = pusher.image("steps/entry", "v1", entrypoint=["/bin/entry", "--flag"])
    img["cmd"] = pusher.image("steps/cmd", "v1", cmd=["/bin/sh", "-c", "echo hi"])
    img["both"] = pusher.image("steps/both", "v1", entrypoint=["/bin/tini", "--"], cmd=["/bin/build", "--all"],
                               oci_types=True)
    img["neither"] = pusher.image("steps/neither", "v1")
    amd = pusher.image("steps/multi", None, entrypoint=["/bin/amd"], cmd=["run"])
    arm = pusher.image("steps/multi", None, entrypoint=["/bin/arm"], cmd=["run"], arch="arm64", variant="v8")
    platforms = [({"os": "linux", "architecture": "amd64"}, amd),
                 ({"os": "linux", "architecture": "arm64", "variant": "v8"}, arm)]
    img["multi"] = pusher.index("steps/multi", "v1", platforms, attestation_of=amd)
    img["multi-list"] = pusher.index("steps/multi", "list", platforms, oci_types=False)
    same_amd = pusher.image("steps/same", None, entrypoint=["/bin/same"])
    same_arm = pusher.image("steps/same", None, entrypoint=["/bin/same"], arch="arm64")
    img["same"] = pusher.index("steps/same", "v1", [({"os": "linux", "architecture": "amd64"}, same_amd),
                                                    ({"os": "linux", "architecture": "arm64"}, same_arm)])
    img["public"] = pusher.image("public/tool", "latest", cmd=["/bin/tool"])
    pub_amd = pusher.image("public/multi", None, entrypoint=["/bin/amd"])
    pub_arm = pusher.image("public/multi", None, entrypoint=["/bin/arm"], arch="arm64")
    img["public-multi"] = pusher.index("public/multi", "v1", [({"os": "linux", "architecture": "amd64"}, pub_amd),
                                                              ({"os": "linux", "architecture": "arm64"}, pub_arm)])
    return img


_ENV: Env | None = None


def shared_env() -> Env:
    """Started on first use, stopped when the test process exits."""
    global _ENV
    if _ENV is None:
        import atexit
        import tempfile
        root = Path(tempfile.mkdtemp(prefix="initshift-registry-"))
        pki = Pki(root / "pki")
        storage = root / "storage"
        basic = Registry(root, pki, storage)
        tokens = TokenServer(pki)
        bearer = Registry(root, pki, storage, auth="token", token_realm=tokens.realm)
        pusher = Pusher(basic)
        try:
            images = push_fixtures(pusher)
        finally:
            pusher.close()
        _ENV = Env(root, pki, storage, basic, tokens, bearer, images)
        atexit.register(_ENV.close)
    return _ENV
