"""deploy/k8s/: the Kubernetes manifests, checked offline (no cluster, no network).

- Every manifest file, and every object of each rendered variant (the CPU and GPU examples, each
  also with the optional components), against the Kubernetes JSON schemas with kubernetes-validate
  in strict mode (unknown fields fail), for the oldest and the newest Kubernetes versions targeted.
  The ServiceMonitor is a CRD the schemas do not have: its metadata and selector are validated as
  the core types they are, the rest (required fields, known endpoint fields, durations) by hand.
- The proxy's config, as the ConfigMap the proxy pod mounts carries it, loaded by specproxy's own
  loader (proxy.config.load_settings) with the pod's environment: the image's ENV (Dockerfile)
  and the container's env, which beat the file as they do in the pod.
- Names across objects: the ConfigMap, Secret and claims the pods mount, Service selectors against
  pod labels, target and probe ports against container ports, probe and scrape paths against the
  proxy's routes, each `urls:` backend against a headless Service whose pods run the llama-server
  flags specproxy would pass for that backend, grace periods against the drain and DNS timings.

Variants are rendered with `kubectl kustomize` (kubectl ships kustomize); without kubectl, the CPU
and GPU examples are assembled here from their kustomizations' resources and generators, and the
variants with the optional components (a patch) are skipped.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from proxy.api.auth import OPEN_PATHS
from proxy.api.routes import add_routes
from proxy.backend_config import BackendConfig
from proxy.backends.launch import llama_server_argv
from proxy.config import Settings, load_settings
from proxy.provision.models import CATALOG
from tests.helpers import ROOT

K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes these manifests promise to work on, and the newest the schemas know.
K8S_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")
COMPONENTS = ("components/servicemonitor", "components/scoreboard-pvc")
# name -> (kustomization directory under deploy/k8s, optional components added on top)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cpu": (".", ()),
    "gpu": ("gpu", ()),
    "cpu+optional": (".", COMPONENTS),
    "gpu+optional": ("gpu", COMPONENTS),
}
PROXY = "specproxy"  # the proxy's Deployment and container
# How long after a pod leaves a headless Service's DNS answer a proxy may still send it requests:
# CoreDNS's cache of cluster names (5 s by default), on top of the proxy's resolve_interval_s.
DNS_TTL_S = 5
# Endpoint fields of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1).
SERVICE_MONITOR_ENDPOINT_FIELDS = frozenset(
    {
        "port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
        "tlsConfig", "bearerTokenFile", "bearerTokenSecret", "authorization", "honorLabels",
        "honorTimestamps", "trackTimestampsStaleness", "basicAuth", "oauth2",
        "metricRelabelings", "relabelings", "proxyUrl", "followRedirects", "enableHttp2",
        "filterRunning",
    }
)  # fmt: skip
PROMETHEUS_DURATION = re.compile(
    r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$"
)
# The flags of a llama-server command line that name a file or an address, not a setting.
PATH_AND_ADDRESS_FLAGS = frozenset({"--model", "--spec-draft-model", "--host", "--port"})
# Where and how fast the draft model runs, not what is speculated: the proxy's config need not
# say them (it says none of an external server's threads or GPU layers).
DRAFT_PLACEMENT_FLAGS = frozenset(
    {"--spec-draft-threads", "--spec-draft-ngl", "--spec-draft-device"}
)


# --- kustomizations and files ------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATIONS:
        if (directory / name).is_file():
            return directory / name
    raise AssertionError(f"{directory} has no kustomization.yaml")


def generator_sources(entry: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(key, file) for each file of a configMapGenerator / secretGenerator entry."""
    for item in entry.get("files", []):
        key, _, source = item.rpartition("=")
        yield key or Path(source).name, source


@dataclass
class Kustomization:
    directory: Path
    spec: dict[str, Any]

    @classmethod
    def at(cls, directory: Path) -> Kustomization:
        return cls(directory, yaml.safe_load(kustomization_file(directory).read_text()))

    def entries(self, field: str) -> list[Any]:
        return list(self.spec.get(field) or [])

    def referenced_dirs(self) -> list[Path]:
        refs = [self.directory / r for r in self.entries("resources") + self.entries("components")]
        return [p.resolve() for p in refs if p.is_dir()]

    def resource_files(self) -> list[Path]:
        return [
            (self.directory / r).resolve()
            for r in self.entries("resources")
            if not (self.directory / r).is_dir()
        ]

    def data_files(self) -> list[Path]:
        """Files read by generators and patches: not objects by themselves."""
        files = [
            (self.directory / source).resolve()
            for field in ("configMapGenerator", "secretGenerator")
            for entry in self.entries(field)
            for _, source in generator_sources(entry)
        ]
        return files + [(self.directory / p["path"]).resolve() for p in self.entries("patches")]


def all_kustomizations() -> list[Kustomization]:
    roots = [K8S / d for d, _ in VARIANTS.values()] + [K8S / c for c in COMPONENTS]
    seen: dict[Path, Kustomization] = {}
    todo = [r.resolve() for r in roots]
    while todo:
        directory = todo.pop()
        if directory in seen:
            continue
        seen[directory] = Kustomization.at(directory)
        todo += seen[directory].referenced_dirs()
    return list(seen.values())


def manifest_files() -> list[Path]:
    return sorted({f for k in all_kustomizations() for f in k.resource_files()})


def test_kustomizations_name_existing_files_and_every_file_is_used() -> None:
    used: set[Path] = set()
    for k in all_kustomizations():
        used.add(kustomization_file(k.directory).resolve())
        for path in k.resource_files() + k.data_files() + k.referenced_dirs():
            rel = path.relative_to(K8S.resolve()) if path.is_relative_to(K8S.resolve()) else path
            assert path.exists() or path.name == "api-keys.txt", (
                f"{kustomization_file(k.directory).relative_to(ROOT)} names {rel}, "
                "which does not exist"
            )
            used.add(path)
    on_disk = {p.resolve() for p in K8S.rglob("*.y*ml")}
    unused = sorted(str(p.relative_to(K8S.resolve())) for p in on_disk - used)
    assert not unused, f"files no kustomization applies (add them to one): {unused}"
    ignored = (K8S / ".gitignore").read_text()
    assert "proxy/api-keys.txt" in ignored, "the API keys file must stay out of git"


# --- schemas ------------------------------------------------------------------------------------


def object_id(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """What kubernetes-validate (strict) says of obj, for every targeted version."""
    if obj.get("apiVersion", "").startswith("monitoring.coreos.com/"):
        return service_monitor_problems(obj)
    problems = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "(top level)"
            problems.append(f"{object_id(obj)} (Kubernetes {version}): {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{object_id(obj)}: {exc.message}")
    return problems


def service_monitor_problems(obj: dict[str, Any]) -> list[str]:
    """A ServiceMonitor checked by hand where no schema exists, as core types where one does."""
    problems = []
    if obj.get("apiVersion") != "monitoring.coreos.com/v1" or obj.get("kind") != "ServiceMonitor":
        return [f"{object_id(obj)}: expected monitoring.coreos.com/v1 ServiceMonitor"]
    unknown = set(obj) - {"apiVersion", "kind", "metadata", "spec"}
    problems += [f"{object_id(obj)}: unknown field {f}" for f in sorted(unknown)]
    spec = obj.get("spec") or {}
    # metadata is an ObjectMeta and selector a LabelSelector: validate them as such.
    as_core = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": obj.get("metadata", {}),
        "spec": {"selector": spec.get("selector")},
    }
    problems += [
        p.replace("PodDisruptionBudget", "ServiceMonitor") for p in schema_problems(as_core)
    ]
    if not obj.get("metadata", {}).get("name"):
        problems.append("ServiceMonitor: metadata.name is required")
    if not spec.get("selector"):
        problems.append(f"{object_id(obj)}: spec.selector is required")
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        problems.append(f"{object_id(obj)}: spec.endpoints must list at least one endpoint")
        endpoints = []
    for i, ep in enumerate(endpoints):
        where = f"{object_id(obj)}: spec.endpoints.{i}"
        problems += [
            f"{where}: unknown field {f}" for f in sorted(set(ep) - SERVICE_MONITOR_ENDPOINT_FIELDS)
        ]
        if ("port" in ep) == ("targetPort" in ep):
            problems.append(
                f"{where}: set exactly one of port (a Service port's name) or targetPort"
            )
        if "port" in ep and not isinstance(ep["port"], str):
            problems.append(f"{where}.port: the name of a Service port, a string")
        if not str(ep.get("path", "/metrics")).startswith("/"):
            problems.append(f"{where}.path: must start with /")
        for field in ("interval", "scrapeTimeout"):
            if field in ep and not (ep[field] and PROMETHEUS_DURATION.match(str(ep[field]))):
                problems.append(f"{where}.{field}: {ep[field]!r} is not a duration like 15s")
        timed = "interval" in ep and "scrapeTimeout" in ep
        if timed and duration_s(ep["scrapeTimeout"]) > duration_s(ep["interval"]):
            problems.append(f"{where}: scrapeTimeout must not exceed interval")
    return problems


def duration_s(text: str) -> float:
    units = {"y": 31536000, "w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|[ywdhms])", text))


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S.resolve())))
def test_manifest_file_passes_kubernetes_schemas_strictly(path: Path) -> None:
    objects = load_yaml_docs(path)
    assert objects, f"{path} holds no object"
    problems = [f"{path.relative_to(ROOT)}: {p}" for obj in objects for p in schema_problems(obj)]
    assert not problems, "\n".join(problems)


# --- rendering ----------------------------------------------------------------------------------


@dataclass
class Rendered:
    """The objects one variant applies."""

    variant: str
    objects: list[dict[str, Any]]

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in kinds]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.variant}: expected one {kind} {name!r}, found {len(found)}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in self.of_kind(kind))

    def workloads(self) -> list[dict[str, Any]]:
        return self.of_kind("Deployment", "StatefulSet", "DaemonSet")

    def proxy(self) -> dict[str, Any]:
        return self.get("Deployment", PROXY)

    def backends(self) -> list[dict[str, Any]]:
        return [w for w in self.workloads() if w["metadata"]["name"] != PROXY]


def render_with_kubectl(
    kubectl: str, work: Path, directory: str, components: tuple[str, ...]
) -> str:
    target = work / "k8s" / directory
    if components:
        target = work / "overlay"
        target.mkdir(exist_ok=True)
        overlay = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"../k8s/{directory}"],
            "components": [f"../k8s/{c}" for c in components],
        }
        (target / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    result = subprocess.run(
        [kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return result.stdout


def assemble(directory: Path) -> list[dict[str, Any]]:
    """resources and generators of a kustomization, as kustomize would emit them without hashes."""
    k = Kustomization.at(directory)
    assert not k.entries("patches") and not k.entries("components"), (
        f"{directory}: patches and components need kubectl kustomize"
    )
    objects: list[dict[str, Any]] = []
    for resource in k.entries("resources"):
        path = directory / resource
        objects += assemble(path) if path.is_dir() else load_yaml_docs(path)
    for field, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for entry in k.entries(field):
            data = {key: (directory / src).read_text() for key, src in generator_sources(entry)}
            objects.append(
                {"apiVersion": "v1", "kind": kind, "metadata": {"name": entry["name"]}}
                | ({"type": "Opaque", "stringData": data} if kind == "Secret" else {"data": data})
            )
    return objects


@pytest.fixture(scope="session")
def rendered_variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered | str]:
    """Every variant rendered once, or why it could not be."""
    kubectl = shutil.which("kubectl")
    out: dict[str, Rendered | str] = {}
    for variant, (directory, components) in VARIANTS.items():
        work = tmp_path_factory.mktemp(variant.replace("+", "-"))
        shutil.copytree(K8S, work / "k8s")
        # The API keys file is the user's to make; the render needs one.
        (work / "k8s" / "proxy" / "api-keys.txt").write_text("test-key-1\ntest-key-2\n")
        if kubectl:
            text = render_with_kubectl(kubectl, work, directory, components)
            out[variant] = Rendered(variant, [d for d in yaml.safe_load_all(text) if d])
        elif components:
            out[variant] = "kubectl not found: the optional components' patch needs kustomize"
        else:
            out[variant] = Rendered(variant, assemble(work / "k8s" / directory))
    return out


@pytest.fixture(params=list(VARIANTS))
def rendered(
    request: pytest.FixtureRequest, rendered_variants: dict[str, Rendered | str]
) -> Rendered:
    found = rendered_variants[request.param]
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(params=[v for v, (_, components) in VARIANTS.items() if components])
def rendered_optional(
    request: pytest.FixtureRequest, rendered_variants: dict[str, Rendered | str]
) -> Rendered:
    found = rendered_variants[request.param]
    if isinstance(found, str):
        pytest.skip(found)
    return found


def test_rendered_objects_pass_kubernetes_schemas_strictly(rendered: Rendered) -> None:
    problems = [p for obj in rendered.objects for p in schema_problems(obj)]
    assert not problems, f"{rendered.variant}:\n" + "\n".join(problems)
    ids = [(o["kind"], o["metadata"]["name"]) for o in rendered.objects]
    assert len(ids) == len(set(ids)), f"{rendered.variant}: objects declared twice: {ids}"


# --- pods, containers, ports --------------------------------------------------------------------


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"].get("labels", {})
    return labels


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1, f"{object_id(workload)}: expected one container"
        return dict(containers[0])
    return dict(next(c for c in containers if c["name"] == name))


def all_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def label_selector(selector: dict[str, Any]) -> dict[str, str]:
    assert not selector.get("matchExpressions"), "these checks read matchLabels only"
    labels: dict[str, str] = selector.get("matchLabels", {})
    return labels


def container_port(c: dict[str, Any], port: int | str, where: str = "") -> int:
    """The containerPort a probe's or Service's port names; AssertionError if none."""
    for p in c.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return int(p["containerPort"])
    ports = [(p.get("name"), p["containerPort"]) for p in c.get("ports", [])]
    raise AssertionError(f"{where}port {port!r}: container {c['name']} has no such port: {ports}")


def probes(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    kinds = ("startupProbe", "livenessProbe", "readinessProbe")
    return {k: c[k] for k in kinds if k in c}


def prestop_sleep_s(c: dict[str, Any]) -> int:
    hook = c.get("lifecycle", {}).get("preStop", {})
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = hook.get("exec", {}).get("command", [])
    if command[:1] == ["sleep"] and len(command) == 2:
        return int(command[1])
    return 0


def test_workload_selectors_match_their_pods_and_probes_hit_container_ports(
    rendered: Rendered,
) -> None:
    for w in rendered.workloads():
        assert selects(label_selector(w["spec"]["selector"]), pod_labels(w)), (
            f"{rendered.variant}: {object_id(w)}: spec.selector does not match its pod labels"
        )
        for c in all_containers(w):
            for kind, probe in probes(c).items():
                where = f"{rendered.variant}: {object_id(w)} {c['name']} {kind}: "
                assert "httpGet" in probe, f"{where}expected httpGet"
                container_port(c, probe["httpGet"]["port"], where)


def test_services_select_one_workload_and_target_its_ports(rendered: Rendered) -> None:
    for svc in rendered.of_kind("Service"):
        selector = svc["spec"]["selector"]
        chosen = [w for w in rendered.workloads() if selects(selector, pod_labels(w))]
        names = [object_id(w) for w in chosen]
        assert len(chosen) == 1, (
            f"{rendered.variant}: Service {svc['metadata']['name']} selects {names}; "
            "it must select the pods of exactly one workload"
        )
        for port in svc["spec"]["ports"]:
            where = f"{rendered.variant}: Service {svc['metadata']['name']} targetPort: "
            container_port(container(chosen[0]), port.get("targetPort", port["port"]), where)


def test_volumes_name_objects_of_the_render(rendered: Rendered) -> None:
    for w in rendered.workloads():
        volumes = {v["name"]: v for v in pod_spec(w).get("volumes", [])}
        for v in volumes.values():
            sources = set(v) - {"name"}
            assert len(sources) == 1, f"{object_id(w)}: volume {v['name']} has sources {sources}"
            for source, kind, field in (
                ("configMap", "ConfigMap", "name"),
                ("secret", "Secret", "secretName"),
                ("persistentVolumeClaim", "PersistentVolumeClaim", "claimName"),
            ):
                if source in v:
                    name = v[source][field]
                    declared = [o["metadata"]["name"] for o in rendered.of_kind(kind)]
                    assert name in declared, (
                        f"{rendered.variant}: {object_id(w)} volume {v['name']} mounts {kind} "
                        f"{name!r}, which no manifest declares ({kind}s: {declared})"
                    )
        for c in all_containers(w):
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, (
                    f"{object_id(w)} {c['name']} mounts volume {mount['name']!r}, which the pod "
                    f"does not have ({sorted(volumes)})"
                )


# --- the proxy ----------------------------------------------------------------------------------


def dockerfile_env() -> dict[str, str]:
    """The ENV of the Dockerfile's last stage: what every container of the image starts with."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stage = re.split(r"^FROM\s", text, flags=re.M)[-1]
    env: dict[str, str] = {}
    for line in stage.splitlines():
        if line.startswith("ENV "):
            env |= dict(item.split("=", 1) for item in shlex.split(line[4:]))
    return env


def mount_of(c: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The volumeMount a file path lies in, and the path within it."""
    for mount in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
        if Path(path).is_relative_to(mount["mountPath"]):
            return mount, str(Path(path).relative_to(mount["mountPath"]))
    raise AssertionError(f"container {c['name']}: nothing is mounted where {path} is")


def volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(v for v in pod_spec(workload)["volumes"] if v["name"] == name))


def service_link_env(rendered: Rendered) -> dict[str, str]:
    """The variables the kubelet puts in a pod for each Service of its namespace, unless the pod
    sets enableServiceLinks: false. A Service named `specproxy` gives SPECPROXY_PORT=tcp://...,
    which the proxy would read as its port."""
    env = {}
    for svc in rendered.of_kind("Service"):
        if svc["spec"].get("clusterIP") == "None":
            continue  # headless: no virtual IP, no variables
        prefix = svc["metadata"]["name"].upper().replace("-", "_")
        port = svc["spec"]["ports"][0]
        env[f"{prefix}_SERVICE_HOST"] = "10.96.0.10"
        env[f"{prefix}_SERVICE_PORT"] = str(port["port"])
        env[f"{prefix}_PORT"] = f"tcp://10.96.0.10:{port['port']}"
        for p in svc["spec"]["ports"]:
            proto = p.get("protocol", "TCP")
            name = f"{prefix}_PORT_{p['port']}_{proto}"
            env[name] = f"{proto.lower()}://10.96.0.10:{p['port']}"
            env[f"{name}_PROTO"] = proto.lower()
            env[f"{name}_PORT"] = str(p["port"])
            env[f"{name}_ADDR"] = "10.96.0.10"
    return env


def pod_env(rendered: Rendered, workload: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the pod sees it: the image's ENV, the Services' variables
    (where the pod has service links), then the container's own env, which beats both."""
    env = dockerfile_env()
    if pod_spec(workload).get("enableServiceLinks", True):
        env |= service_link_env(rendered)
    for var in c.get("env", []):
        assert "value" in var, f"{var['name']}: valueFrom cannot be checked offline"
        env[var["name"]] = str(var["value"])
    return env


def proxy_settings(rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The proxy's settings as its pod would load them: the mounted ConfigMap's file, the env."""
    c = container(rendered.proxy(), PROXY)
    args = c["args"]
    assert "--config" in args and args[-1] == "serve", f"proxy args {args}"
    config_path = args[args.index("--config") + 1]
    mount, key = mount_of(c, config_path)
    source = volume(rendered.proxy(), mount["name"])
    assert "configMap" in source, f"--config {config_path} is not on a ConfigMap volume"
    configmap = rendered.get("ConfigMap", source["configMap"]["name"])
    assert key in configmap["data"], f"ConfigMap {configmap['metadata']['name']} has no {key}"
    config_file = tmp_path / "specproxy.yaml"
    config_file.write_text(configmap["data"][key])
    for name, value in pod_env(rendered, rendered.proxy(), c).items():
        if name.startswith("SPECPROXY_") or name == "XDG_CACHE_HOME":
            monkeypatch.setenv(name, value)
    return load_settings(config_file)


def test_proxy_config_in_the_configmap_loads_with_the_pods_environment(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # load_settings raises ConfigError, naming the field, on any typo or invalid value.
    settings = proxy_settings(rendered, tmp_path, monkeypatch)
    assert settings.backends, "the config names no backend"
    supervised = [b.name for b in settings.backends if b.supervised]
    assert not supervised, (
        f"backends {supervised} would be started inside the proxy pod; in Kubernetes every "
        "backend is a llama-server Deployment reached through `urls:`"
    )


def test_proxy_listens_where_its_port_probes_and_service_point(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(rendered, tmp_path, monkeypatch)
    proxy = rendered.proxy()
    c = container(proxy, PROXY)
    assert settings.host in ("0.0.0.0", "::"), (
        f"the proxy listens on {settings.host}: the Service and probes cannot reach it"
    )
    assert container_port(c, "http") == settings.port, (
        f"containerPort http is {container_port(c, 'http')}, the proxy listens on {settings.port}"
    )
    for kind, probe in probes(c).items():
        assert container_port(c, probe["httpGet"]["port"]) == settings.port, kind
    service = rendered.get("Service", PROXY)
    assert any(
        container_port(c, p.get("targetPort", p["port"])) == settings.port
        for p in service["spec"]["ports"]
    )
    assert int(proxy["spec"]["replicas"]) >= 2, "the proxy runs at least two replicas"


def proxy_routes() -> set[str]:
    app = web.Application()
    add_routes(app)
    return {r.canonical for r in app.router.resources() if any(x.method == "GET" for x in r)}


def test_proxy_probes_use_open_routes_and_liveness_does_not_wait_for_backends(
    rendered: Rendered,
) -> None:
    c = container(rendered.proxy(), PROXY)
    found = {kind: p["httpGet"]["path"] for kind, p in probes(c).items()}
    assert set(found) == {"startupProbe", "livenessProbe", "readinessProbe"}, found
    routes = proxy_routes()
    for kind, path in found.items():
        assert path in routes, f"{kind} {path}: the proxy has no GET route there ({routes})"
        assert path in OPEN_PATHS, f"{kind} {path} needs an API key (open: {sorted(OPEN_PATHS)})"
    # /health answers 503 while no backend is ready: right for readiness (no traffic), wrong for
    # liveness (the kubelet would restart every proxy whenever the backends are down).
    assert found["readinessProbe"] == "/health"
    for kind in ("livenessProbe", "startupProbe"):
        assert found[kind] != "/health", (
            f"{kind} on /health: the kubelet would restart every proxy pod while no backend is "
            "ready (503); probe `/`, which answers while the proxy itself runs"
        )


def test_proxy_grace_period_covers_the_prestop_sleep_and_the_drain(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(rendered, tmp_path, monkeypatch)
    proxy = rendered.proxy()
    grace = int(pod_spec(proxy).get("terminationGracePeriodSeconds", 30))
    sleep = prestop_sleep_s(container(proxy, PROXY))
    assert sleep >= 1, "a preStop sleep lets the Service drop the pod before the listener closes"
    # After SIGTERM: requests drain for drain_timeout_s, then the scoreboard is saved.
    needed = sleep + settings.drain_timeout_s + 5
    assert grace >= needed, (
        f"terminationGracePeriodSeconds {grace} < preStop {sleep} s + drain_timeout_s "
        f"{settings.drain_timeout_s:g} s + 5 s: in-flight requests would be killed mid-drain"
    )


def test_api_keys_come_from_the_mounted_secret(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(rendered, tmp_path, monkeypatch)
    assert settings.api_keys_file is not None and not settings.api_keys, (
        "the proxy listens beyond loopback: its keys come from the Secret, as api_keys_file"
    )
    c = container(rendered.proxy(), PROXY)
    mount, key = mount_of(c, str(settings.api_keys_file))
    source = volume(rendered.proxy(), mount["name"])
    assert "secret" in source, f"api_keys_file {settings.api_keys_file} is not on a Secret volume"
    secret = rendered.get("Secret", source["secret"]["secretName"])
    keys = secret.get("data", {}) | secret.get("stringData", {})
    assert key in keys, f"Secret {secret['metadata']['name']} has no key {key!r}: {sorted(keys)}"


def test_pod_disruption_budget_keeps_one_proxy_and_lets_one_go(rendered: Rendered) -> None:
    proxy = rendered.proxy()
    budgets = [
        b
        for b in rendered.of_kind("PodDisruptionBudget")
        if selects(label_selector(b["spec"]["selector"]), pod_labels(proxy))
    ]
    assert len(budgets) == 1, "one PodDisruptionBudget covers the proxy pods"
    spec, replicas = budgets[0]["spec"], int(proxy["spec"]["replicas"])
    if "minAvailable" in spec:
        assert 1 <= int(spec["minAvailable"]) < replicas, "a drain must be able to evict one"
    else:
        assert 1 <= int(spec["maxUnavailable"]) < replicas


# --- the backends -------------------------------------------------------------------------------


def flag_values(argv: list[str]) -> dict[str, str | None]:
    """A llama-server command line as flag -> value (None for a flag without one)."""
    flags: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("-"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            flags[arg] = None if following is None or following.startswith("--") else following
    return flags


def backend_service(rendered: Rendered, url: str) -> dict[str, Any]:
    """The Service a backend URL's host names: `name`, or `name.<namespace>[.svc...]`."""
    host = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    name = host.split(".")[0]
    assert rendered.has("Service", name), (
        f"{rendered.variant}: backend url {url}: no Service {name!r} in the manifests"
    )
    return rendered.get("Service", name)


def test_each_backend_url_is_a_headless_service_whose_pods_run_its_flags(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(rendered, tmp_path, monkeypatch)
    served = set()
    for cfg in settings.backends:
        for url in cfg.replica_urls:
            svc = backend_service(rendered, url)
            served.add(svc["metadata"]["name"])
            assert svc["spec"].get("clusterIP") == "None", (
                f"{url}: Service {svc['metadata']['name']} must be headless (clusterIP: None) so "
                "that its DNS name resolves to every ready pod, each a replica"
            )
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            svc_port = next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
            assert svc_port is not None, f"{url}: Service has no port {port}"
            (workload,) = [
                w for w in rendered.workloads() if selects(svc["spec"]["selector"], pod_labels(w))
            ]
            c = container(workload, "llama-server")
            argv = [*c.get("command", []), *c.get("args", [])]
            actual = flag_values(argv)
            # A headless Service has no port mapping: clients connect to the pod's own port.
            assert actual.get("--host") == "0.0.0.0", f"{object_id(workload)} listens on loopback"
            assert (
                int(actual.get("--port") or 0)
                == port
                == container_port(c, svc_port.get("targetPort", port))
            )
            assert dockerfile_env()["SPECPROXY_LLAMA_SERVER"] in argv, (
                f"{object_id(workload)} must run the image's llama-server, the build specproxy pins"
            )
            # What specproxy would pass to a llama-server it started for this backend.
            model = str(actual.get("--model"))
            draft = actual.get("--spec-draft-model") if cfg.kind.startswith("draft-") else None
            assert draft or cfg.kind != "draft-simple", (
                f"backend {cfg.name!r} is draft-simple: its pods need --spec-draft-model"
            )
            as_supervised = BackendConfig(
                **cfg.model_dump(exclude={"url", "urls", "model", "draft_model"}),
                model=model,
                draft_model=draft,
            )
            expected = flag_values(
                llama_server_argv(
                    Path("llama-server"),
                    as_supervised,
                    Path(model),
                    Path(draft) if draft else None,
                    "0.0.0.0",
                    port,
                )[1:]
            )
            wrong = {
                flag: (value, actual.get(flag, "(missing)"))
                for flag, value in expected.items()
                if flag not in PATH_AND_ADDRESS_FLAGS and actual.get(flag, "(missing)") != value
            }
            assert not wrong, (
                f"{rendered.variant}: backend {cfg.name!r} (kind {cfg.kind}) says its servers run "
                f"flags its pods ({object_id(workload)}) do not; flag: (config, pods): {wrong}"
            )
            spec_flags = {f for f in actual if f.startswith("--spec-")} - DRAFT_PLACEMENT_FLAGS
            assert spec_flags <= set(expected), (
                f"{object_id(workload)} speculates with {spec_flags - set(expected)}, which "
                f"backend {cfg.name!r}'s config (kind {cfg.kind}) does not say"
            )
    headless = {
        s["metadata"]["name"]
        for s in rendered.of_kind("Service")
        if s["spec"].get("clusterIP") == "None"
    }
    assert headless == served, f"headless Services no backend uses: {sorted(headless - served)}"


def test_backend_pods_stay_until_the_proxies_stop_resolving_them(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(rendered, tmp_path, monkeypatch)
    for w in rendered.backends():
        c = container(w, "llama-server")
        sleep = prestop_sleep_s(c)
        # Until every proxy has re-resolved the Service's name without this pod, requests come.
        assert sleep >= settings.resolve_interval_s + DNS_TTL_S, (
            f"{object_id(w)}: preStop sleep {sleep} s < resolve_interval_s "
            f"{settings.resolve_interval_s:g} s + {DNS_TTL_S} s of DNS cache"
        )
        grace = int(pod_spec(w).get("terminationGracePeriodSeconds", 30))
        assert grace > sleep, f"{object_id(w)}: the grace period must outlast the preStop sleep"
        for kind, probe in probes(c).items():
            assert probe["httpGet"]["path"] == "/health", f"{object_id(w)} {kind}"


def fetched_models(workload: dict[str, Any]) -> tuple[str, list[str]]:
    """The directory the init container fetches catalog models into, and their names."""
    init = {c["name"]: c for c in pod_spec(workload).get("initContainers", [])}["fetch-models"]
    command = init["command"]
    assert command[:2] == ["python3", "-c"], command
    script, names = command[2], command[3:]
    compile(script, f"{object_id(workload)} fetch-models", "exec")
    directory = re.search(r'resolve_model\(name, Path\("([^"]+)"\)', script)
    assert directory, "the fetch script calls resolve_model(name, Path(<dir>), <index>)"
    return directory.group(1), names


def test_model_files_are_fetched_from_the_catalog_or_on_a_claim(rendered: Rendered) -> None:
    for w in rendered.backends():
        c = container(w, "llama-server")
        flags = flag_values(c["args"])
        files = [str(flags[f]) for f in ("--model", "--spec-draft-model") if flags.get(f)]
        has_init = any(i["name"] == "fetch-models" for i in pod_spec(w).get("initContainers", []))
        for path in files:
            mount, _ = mount_of(c, path)
            source = volume(w, mount["name"])
            if has_init:
                directory, names = fetched_models(w)
                unknown = [n for n in names if n not in CATALOG]
                assert not unknown, f"{object_id(w)} fetches {unknown}: not in specproxy's catalog"
                fetched = {f"{directory}/{CATALOG[n].filename}" for n in names}
                assert path in fetched, (
                    f"{object_id(w)} loads {path}; the init container fetches {fetched}"
                )
                init = next(i for i in pod_spec(w)["initContainers"] if i["name"] == "fetch-models")
                assert mount_of(init, path)[0]["name"] == mount["name"], "fetched on another volume"
            else:
                assert "persistentVolumeClaim" in source, (
                    f"{object_id(w)}: {path} is on neither a fetched emptyDir nor a claim"
                )


def gpu_limit(c: dict[str, Any]) -> int:
    return int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def test_gpu_backends_get_gpus_on_gpu_nodes_and_cpu_backends_none(rendered: Rendered) -> None:
    for w in rendered.backends():
        c = container(w, "llama-server")
        flags = flag_values(c["args"])
        offloads = flags.get("--n-gpu-layers", "0") not in ("0", None)
        spec = pod_spec(w)
        if offloads:
            assert gpu_limit(c) >= 1, f"{object_id(w)} offloads layers without an nvidia.com/gpu"
            assert spec.get("nodeSelector"), f"{object_id(w)}: GPU pods need a nodeSelector"
            assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), (
                f"{object_id(w)}: GPU nodes are usually tainted nvidia.com/gpu; tolerate it"
            )
        else:
            assert gpu_limit(c) == 0, f"{object_id(w)} holds a GPU it does not use"
        threads = flags.get("--threads")
        cpu = str(c["resources"]["requests"]["cpu"])
        cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        assert threads is None or int(threads) <= max(cores, 1), (
            f"{object_id(w)}: --threads {threads} on {cpu} requested cores"
        )
    if rendered.variant.startswith("gpu"):
        assert any(gpu_limit(container(w, "llama-server")) for w in rendered.backends())
    else:
        assert not any(gpu_limit(container(w, "llama-server")) for w in rendered.backends())


def test_network_policy_admits_the_proxy_to_every_backend(rendered: Rendered) -> None:
    (policy,) = rendered.of_kind("NetworkPolicy")
    protected = label_selector(policy["spec"]["podSelector"])
    for w in rendered.backends():
        assert selects(protected, pod_labels(w)), f"{object_id(w)} is not behind the policy"
    assert not selects(protected, pod_labels(rendered.proxy()))
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert selects(label_selector(peer["podSelector"]), pod_labels(rendered.proxy()))
    for port in rule["ports"]:
        for w in rendered.backends():
            container_port(container(w, "llama-server"), port["port"])


# --- the optional components --------------------------------------------------------------------


def test_service_monitor_scrapes_the_proxy_services_metrics(rendered_optional: Rendered) -> None:
    (monitor,) = rendered_optional.of_kind("ServiceMonitor")
    assert not service_monitor_problems(monitor)
    service = rendered_optional.get("Service", PROXY)
    assert selects(label_selector(monitor["spec"]["selector"]), service["metadata"]["labels"]), (
        "the ServiceMonitor selects Services by their labels: it must match Service specproxy's"
    )
    ports = {p.get("name") for p in service["spec"]["ports"]}
    routes = proxy_routes()
    for ep in monitor["spec"]["endpoints"]:
        assert ep["port"] in ports, f"ServiceMonitor port {ep['port']!r}: Service has {ports}"
        path = ep.get("path", "/metrics")
        assert path in routes and path in OPEN_PATHS, f"{path}: not an open GET route"


def test_scoreboard_is_saved_on_the_claim(
    rendered_optional: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(rendered_optional, tmp_path, monkeypatch)
    proxy = rendered_optional.proxy()
    mount, _ = mount_of(container(proxy, PROXY), str(settings.scoreboard_path()))
    source = volume(proxy, mount["name"])
    assert "persistentVolumeClaim" in source, (
        f"the scoreboard {settings.scoreboard_path()} is on volume {mount['name']}, not the claim"
    )
    claim = rendered_optional.get(
        "PersistentVolumeClaim", source["persistentVolumeClaim"]["claimName"]
    )
    if int(proxy["spec"]["replicas"]) > 1:
        assert "ReadWriteMany" in claim["spec"]["accessModes"], (
            "several proxy replicas on several nodes mount the claim: it must be ReadWriteMany"
        )


def test_kubernetes_validate_catches_an_unknown_field() -> None:
    """The schema check is strict: a misspelt field is an error, not ignored (kubectl apply
    rejects it too)."""
    (pdb,) = load_yaml_docs(K8S / "proxy" / "pdb.yaml")
    pdb["spec"]["minAvailabel"] = 1
    assert any("minAvailabel" in p for p in schema_problems(pdb))
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "endpoints": [{"port": "http", "intervall": "15s"}],
        },
    }
    assert any("intervall" in p for p in service_monitor_problems(monitor))
