"""The container image, the docker-compose demo and the Kubernetes manifests, checked offline:
each parses and validates against its specification (the compose spec, Kubernetes' strict API
schemas), and what they name agrees with the code (commands, configuration keys, ports,
environment variables, pinned versions)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml
from compose_spec import PyOptions

from icecdc.cli import build_parser
from icecdc.runtime.config import Config, expand_env, parse_config
from icecdc.runtime.spark import ICEBERG_VERSION

try:
    import tomllib
except ImportError:  # Python 3.10, which the package supports
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
KUBERNETES_VERSION = "1.30.0"
ICECDC_IMAGE = re.compile(r"^(icecdc:dev|ghcr\.io/icecdc/icecdc:[\w.]+)$")
_DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def compose() -> dict:
    parsed = PyOptions(apply_merge=True).from_yaml((DOCKER / "docker-compose.yml").read_text())
    parsed.validate()
    return parsed.to_dict()


def icecdc_services(document: dict) -> dict[str, dict]:
    return {name: s for name, s in document["services"].items() if ICECDC_IMAGE.match(s.get("image", ""))}


def parse_command(argv: list[str]):
    return build_parser().parse_args(argv)


def compose_environment(service: dict) -> dict[str, str]:
    # What docker compose would pass with nothing set in the shell: the ${VAR:-default} defaults.
    return {k: _DEFAULTED.sub(lambda m: m.group(2), str(v)) for k, v in service.get("environment", {}).items()}


# ---- docker-compose ----


def test_compose_file_follows_the_compose_specification():
    document = compose()
    assert {"kafka", "minio", "rest", "generator", "ingest", "compactor"} <= set(document["services"])
    for name, service in document["services"].items():
        for dependency in service.get("depends_on", {}):
            assert dependency in document["services"], f"{name} depends on unknown service {dependency}"


def test_compose_services_run_real_commands_on_a_valid_config():
    document = compose()
    services = icecdc_services(document)
    assert {"generator", "ingest", "compactor"} <= set(services)
    for name, service in services.items():
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        args = parse_command(service["command"])
        mounts = {m.split(":")[1]: m.split(":")[0] for m in service["volumes"]}
        assert str(args.config) in mounts, f"{name} reads a config that is not mounted"
        source = DOCKER / mounts[str(args.config)]
        data = yaml.safe_load(source.read_text())
        config = parse_config(expand_env(data, environ=compose_environment(service)), str(source))
        hosts = {
            urlparse(f"//{config.kafka.bootstrap_servers}").hostname,
            urlparse(config.catalog.properties["uri"]).hostname,
            urlparse(config.catalog.properties["s3.endpoint"]).hostname,
        }
        assert hosts <= set(document["services"]), f"{name}'s config names hosts that are not services: {hosts}"
    ports = {name: services[name]["ports"][0] for name in ("ingest", "compactor")}
    config = parse_config(
        expand_env(yaml.safe_load((DOCKER / "icecdc.yaml").read_text()), environ=compose_environment(services["ingest"]))
    )
    assert ports == {
        "ingest": f"{config.ingest.http.port}:{config.ingest.http.port}",
        "compactor": f"{config.compactor.http.port}:{config.compactor.http.port}",
    }
    for name, port in (("ingest", config.ingest.http.port), ("compactor", config.compactor.http.port)):
        assert f"localhost:{port}/readyz" in " ".join(services[name]["healthcheck"]["test"])


# ---- the image ----


def test_dockerfile_pins_what_the_code_pins_and_runs_unprivileged():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    pins = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.MULTILINE))
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"pyspark=={pins['SPARK_VERSION']}" in dependencies
    assert pins["ICEBERG_VERSION"] == ICEBERG_VERSION
    users = re.findall(r"^USER (\S+)$", dockerfile, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert not re.search(r"^ENV .*(PASSWORD|SECRET|TOKEN)", dockerfile, re.MULTILINE | re.IGNORECASE)
    # icecdc itself, without extras: the benchmarks' matplotlib stays out of the image
    assert re.findall(r"pip install (?:--\S+ )*(\.\S*)", dockerfile) == ["."]
    for source in re.findall(r"^COPY (?!--from)(\S+) ", dockerfile, re.MULTILINE):
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", dockerfile, re.MULTILINE)[0].split()}
    defaults = Config.model_validate({"catalog": {"properties": {"type": "rest"}}})
    assert exposed == {defaults.ingest.http.port, defaults.compactor.http.port}


# ---- Kubernetes ----


def manifests() -> list[dict]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("document", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid_against_the_strict_kubernetes_schema(document):
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def by_kind(kind: str) -> dict:
    [document] = [d for d in manifests() if d["kind"] == kind]
    return document


def test_the_pod_runs_the_driver_and_the_compactor_sidecar_on_the_configmap():
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    secret_keys = set(by_kind("Secret")["stringData"])
    config_text = by_kind("ConfigMap")["data"]["icecdc.yaml"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"ingest", "compactor"}
    commands = {}
    for name, container in containers.items():
        assert ICECDC_IMAGE.match(container["image"])
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]) and "memory" in container["resources"]["limits"]
        args = parse_command(container["args"])
        commands[name] = args.command
        [config_mount] = [m for m in container["volumeMounts"] if m["name"] == "config"]
        assert str(args.config.parent) == config_mount["mountPath"]
        # Every ${VAR} of the config comes from this container's environment, secrets from the Secret.
        env = {e["name"]: "value-from-" + e["name"] for e in container["env"]}
        for e in container["env"]:
            if "valueFrom" in e:
                assert e["valueFrom"]["secretKeyRef"]["key"] in secret_keys
        config = parse_config(expand_env(yaml.safe_load(config_text), environ=env))
        port = (config.ingest if args.command == "ingest" else config.compactor).http.port
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
            assert container[probe]["httpGet"]["path"] == path
            assert named[container[probe]["httpGet"]["port"]] == port
        writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert {"/tmp", str(config.state_dir.parent)} <= writable  # Spark scratch space and state_dir
    assert commands == {"ingest": "ingest", "compactor": "compact"}
    service_ports = {p["targetPort"] for p in by_kind("Service")["spec"]["ports"]}
    assert service_ports == {p["name"] for c in containers.values() for p in c["ports"]}
