"""deploy/k8s, tested offline (no cluster, no kubectl in CI): every object against a current Kubernetes release's
schema, strictly; every Agent Reach container's command and environment through the CLI's own parser and checks;
etcd's and redis's commands against the binaries the images run; and the wiring a cluster would only reveal at
run time: host names that are Services, probes on paths served without credentials, a budget per workload, the
Secret the operator creates (docs/deploy.md) and the NetworkPolicies' peers."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from yarl import URL

from agentreach.cli import build_parser
from agentreach.knobs import (
    check_router_knobs,
    console_settings,
    registry_settings,
    required_admin_key,
    router_settings,
)
from compose_support import ROOT, entrypoint
from conftest import wait_for
from console.signin import OPEN_PATHS as CONSOLE_OPEN
from registry.api import OPEN as REGISTRY_OPEN
from router.api import OPEN as ROUTER_OPEN
from sdk_support import free_port

K8S = ROOT / "deploy" / "k8s"
KUBERNETES = "1.37.0"  # the newest release kubernetes-validate (pinned in pyproject.toml) carries schemas for
WORKLOADS = ("Deployment", "StatefulSet")
AGENT_LABEL = {"agentreach.io/agent": "true"}
# What each Agent Reach command serves without credentials, the only paths a kubelet probe can use.
OPEN_PATHS = {"registry": {path for method, path, _ in REGISTRY_OPEN if method == "GET"},
              "router": {path for method, path, _ in ROUTER_OPEN if method == "GET"},
              "console": set(CONSOLE_OPEN)}


def manifests() -> list[Path]:
    return sorted(path for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml")


def objects(kind: str | None = None) -> list[dict[str, Any]]:
    found = [doc for path in manifests() for doc in yaml.safe_load_all(path.read_text()) if doc]
    return [doc for doc in found if kind is None or doc["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in objects(kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def workloads() -> list[dict[str, Any]]:
    return [doc for doc in objects() if doc["kind"] in WORKLOADS]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def containers(workload: dict[str, Any], init: bool = True) -> list[dict[str, Any]]:
    pod = workload["spec"]["template"]["spec"]
    return [*(pod.get("initContainers", []) if init else []), *pod["containers"]]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, f"only matchLabels selectors are checked here: {selector}"
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def operator_secret() -> tuple[str, set[str]]:
    """The Secret docs/deploy.md tells the operator to create: its name and keys, from the documented command."""
    text = (ROOT / "docs" / "deploy.md").read_text().replace("\\\n", " ")
    commands = re.findall(r"kubectl(?: -n \S+)? create secret generic (\S+)([^\n]*)", text)
    assert commands, "docs/deploy.md shows no `kubectl create secret generic` command"
    names = {name for name, _ in commands}
    assert len(names) == 1, f"docs/deploy.md creates several Secrets: {names}"
    keys = [set(re.findall(r"--from-(?:literal|file)=([\w.-]+)=", rest)) for _, rest in commands]
    assert all(keys) and all(each == keys[0] for each in keys), f"the documented commands disagree on keys: {keys}"
    return names.pop(), keys[0]


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it, a stand-in for each value it fills in."""
    secret, keys = operator_secret()
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert (ref["name"], ref["key"]) in {(secret, key) for key in keys}, \
                f"{var['name']} reads {ref}, not a key of the documented Secret {secret} {sorted(keys)}"
            env[var["name"]] = f"ara_stand-in-for-{ref['key']}"
        else:
            field = source["fieldRef"]["fieldPath"]
            env[var["name"]] = {"metadata.name": "pod-0", "status.podIP": "10.1.2.3"}[field]
    return env


def expanded(words: list[str], env: dict[str, str]) -> list[str]:
    """$(NAME) as the kubelet expands it in command and args; one it cannot resolve would stay literal."""
    words = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), word) for word in words]
    unresolved = [word for word in words if "$(" in word]
    assert not unresolved, f"references to variables the container does not define: {unresolved}"
    return words


def process(workload: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """What the container runs: the image's ENTRYPOINT (agentreach's, from the Dockerfile) unless it sets command."""
    default = entrypoint() if container["image"].startswith("agentreach:") else None
    command = container.get("command", default)
    assert command is not None, f"{workload['metadata']['name']}/{container['name']}: set command for this image"
    return expanded([*command, *container.get("args", [])], environment(container))


def agentreach_containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(workload, container) for workload in workloads() for container in containers(workload, init=False)
            if container["image"].startswith("agentreach:")]


@contextlib.contextmanager
def reads_of(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """The names the code looks up in os.environ meanwhile (found or not): the environment it really reads."""
    reads: set[str] = set()
    environ = type(os.environ)
    original = environ.__getitem__

    def recording(self: Any, key: str) -> str:
        reads.add(key)
        return original(self, key)
    with monkeypatch.context() as patch:
        patch.setattr(environ, "__getitem__", recording)
        yield reads


def cli_accepts(words: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> set[str]:
    """Parse ``words`` as `agentreach` does under ``env``, then make the settings the command starts with (every
    check the CLI makes before serving); returns the environment variables it read."""
    assert words[0] == "agentreach", words
    for name in [name for name in os.environ if name.startswith("AGENTREACH_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with reads_of(monkeypatch) as reads:
        parser = build_parser()
        try:
            args = parser.parse_args(words[1:])
            if args.command == "registry":
                registry_settings(args, args.port, parser)
            elif args.command == "router":
                check_router_knobs(args, parser)
                router_settings(args, args.port, args.registry, required_admin_key(args))
            else:
                assert args.command == "console", f"no check here for `agentreach {args.command}`"
                console_settings(args, args.port, args.registry, args.router)
        except SystemExit:
            pytest.fail(f"`{shlex.join(words)}` is refused: {capsys.readouterr().err.strip()}")
    return reads


# (a) The schema.

@pytest.mark.parametrize("path", manifests(), ids=lambda path: path.name)
def test_every_object_is_valid_for_a_current_kubernetes_strictly(path: Path):
    """Strict: a field the API does not know (a misspelt probe) fails, as an apply with --validate=strict would."""
    for doc in yaml.safe_load_all(path.read_text()):
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(part) for part in exc.caught.absolute_path)
            pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata']['name']} at {where}: {exc.caught.message}")


def test_the_kustomization_lists_every_manifest_and_transforms_nothing():
    """`kubectl apply -k deploy/k8s` applies exactly what `kubectl apply -f deploy/k8s` and this test read."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, sorted(kustomization)
    assert kustomization["resources"] == [path.name for path in manifests()]


# (b) Commands and environment.

@pytest.mark.parametrize(("workload", "container"), agentreach_containers(),
                         ids=lambda item: item.get("name") or item["metadata"]["name"])
def test_each_agentreach_container_is_a_command_the_cli_accepts(workload, container, monkeypatch, capsys):
    """Flags the CLI has, values its checks accept (an etcd registry on 0.0.0.0 must advertise a URL, a router's
    knobs in range), and no environment variable it would ignore (each is read by the command, or used in args)."""
    env = environment(container)
    words = process(workload, container)
    reads = cli_accepts(words, env, monkeypatch, capsys)
    used_in_args = {name for word in [*container.get("command", []), *container.get("args", [])]
                    for name in re.findall(r"\$\((\w+)\)", word)}
    ignored = set(env) - reads - used_in_args
    assert not ignored, f"{workload['metadata']['name']}: `agentreach {words[1]}` never reads {sorted(ignored)}"


def etcd_flags() -> set[str]:
    """The flags of the etcd the suite runs (scripts/install-test-tools: Debian's 3.4, the image's minor)."""
    done = subprocess.run(["etcd", "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"^\s+(--[\w-]+)", done.stdout + done.stderr, re.MULTILINE))


def test_the_etcd_members_form_one_cluster_the_registries_reach():
    """Each member advertises <pod>.<headless service>, the initial cluster names exactly the StatefulSet's pods,
    they start together (a member is ready only with a quorum) and are found before they are ready."""
    statefulset, service = named("StatefulSet", "etcd"), named("Service", "etcd")
    spec = statefulset["spec"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert spec["serviceName"] == "etcd" and spec["podManagementPolicy"] == "Parallel" and spec["replicas"] == 3
    (container,) = containers(statefulset)
    words = process(statefulset, container)
    unknown = {word.split("=")[0] for word in words[1:] if word.startswith("--")} - etcd_flags()
    assert not unknown, f"etcd has no {sorted(unknown)}"
    flags = dict(word.split("=", 1) for word in container["args"])
    pods = [f"etcd-{i}" for i in range(spec["replicas"])]
    host = f"$(POD_NAME).{spec['serviceName']}"
    assert flags["--name"] == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert flags["--initial-advertise-peer-urls"] == f"http://{host}:2380"
    assert flags["--advertise-client-urls"] == f"http://{host}:2379"
    assert flags["--initial-cluster"] == ",".join(f"{pod}=http://{pod}.{spec['serviceName']}:2380" for pod in pods)
    registry = named("Deployment", "registry")
    endpoints = environment(containers(registry, init=False)[0])["AGENTREACH_ETCD_ENDPOINTS"]
    assert endpoints == ",".join(f"http://{pod}.{spec['serviceName']}:2379" for pod in pods)


async def test_the_broker_runs_as_the_manifest_starts_it_and_answers_its_probe(tmp_path):
    """redis-server with the manifest's own arguments (on a free loopback port) starts and passes the readiness
    probe, run as written: a directive redis does not know would make it exit."""
    deployment = named("Deployment", "redis")
    (container,) = containers(deployment)
    port = str(free_port())
    words = [port if word == "6379" else "127.0.0.1" if word == "0.0.0.0" else word
             for word in process(deployment, container)]
    probe = [word.replace(":6379", f":{port}") for word in container["readinessProbe"]["exec"]["command"]]
    log = (tmp_path / "redis.log").open("w")
    server = subprocess.Popen(words, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        def answers() -> bool:
            assert server.poll() is None, (tmp_path / "redis.log").read_text()[-2000:]
            done = subprocess.run(probe, capture_output=True, text=True, timeout=10)
            return done.returncode == 0 and done.stdout.strip() == "PONG"
        await wait_for(answers, timeout=10, interval=0.05, what="redis-server to answer the readiness probe")
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def volume_at(container: dict[str, Any], path: str) -> tuple[str, str]:
    """The volume ``path`` lies on in ``container`` (its innermost mount) and where in that volume."""
    mounts = [mount for mount in container.get("volumeMounts", [])
              if f"{path}/".startswith(f"{mount['mountPath'].rstrip('/')}/")]
    assert mounts, f"{container['name']}: {path} is on no volume (the root filesystem is read-only)"
    mount = max(mounts, key=lambda mount: len(mount["mountPath"]))
    return mount["name"], path.removeprefix(mount["mountPath"].rstrip("/"))


def secret_files(volume: dict[str, Any], keys: set[str]) -> dict[str, str]:
    """The files a Secret volume shows, each with the Secret key it holds."""
    items = volume["secret"].get("items")
    return {item["path"]: item["key"] for item in items} if items else {key: key for key in keys}


def test_the_registry_reads_the_operators_keys_in_its_data_dir():
    """The init container installs admin.key and secrets.key, each from the Secret's key of that name, into the
    data dir the registry is given, on a volume both mount at the same place."""
    registry = named("Deployment", "registry")
    (init,) = registry["spec"]["template"]["spec"]["initContainers"]
    (main,) = containers(registry, init=False)
    args = main["args"]
    data_dir = args[args.index("--data-dir") + 1]
    assert init["command"][:2] == ["sh", "-c"], init["command"]
    steps = [shlex.split(step) for step in init["command"][2].split("&&")]
    assert steps[0] == ["install", "-d", "-m", "700", data_dir], steps
    assert steps[1][:3] == ["install", "-m", "600"] and steps[1][-1].rstrip("/") == data_dir, steps
    assert volume_at(init, data_dir) == volume_at(main, data_dir), "the registry does not see the installed keys"
    secret, keys = operator_secret()
    volumes = {volume["name"]: volume for volume in registry["spec"]["template"]["spec"]["volumes"]}
    copied = {}
    for source in steps[1][3:-1]:
        name, inside = volume_at(init, source)
        assert volumes[name].get("secret", {}).get("secretName") == secret, f"{source} is not from {secret}"
        copied[inside.lstrip("/")] = secret_files(volumes[name], keys).get(inside.lstrip("/"))
    assert copied == {"admin.key": "admin.key", "secrets.key": "secrets.key"}, copied
    assert set(copied.values()) <= keys, (copied, keys)


def test_every_host_a_container_names_is_a_service_on_its_port():
    """What compose resolves by service name, a cluster resolves by Service (or <pod>.<headless service>)."""
    services = {doc["metadata"]["name"]: {port["port"] for port in doc["spec"]["ports"]} for doc in objects("Service")}
    pods = {f"{doc['metadata']['name']}-{i}.{doc['spec']['serviceName']}": services[doc["spec"]["serviceName"]]
            for doc in objects("StatefulSet") for i in range(doc["spec"]["replicas"])}
    known = {**services, **pods}
    checked = 0
    for workload in workloads():
        for container in containers(workload):
            words = [*container.get("args", []), *environment(container).values()]
            for url in (URL(part) for word in words for part in re.split(r"[,=]", word) if "://" in part):
                if url.host in ("127.0.0.1", "0.0.0.0") or (url.host or "").startswith("$("):
                    continue
                assert url.host in known and url.port in known[url.host], \
                    f"{workload['metadata']['name']}: {url} is no Service's host and port ({sorted(known)})"
                checked += 1
    assert checked >= 6, checked


# (c) No secret in the repository.

def test_no_secret_in_the_repository_carries_data():
    """The operator creates the Secret (docs/deploy.md); a Secret object here may be a template, never a value."""
    tracked = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], capture_output=True, text=True, cwd=ROOT,
                             check=True).stdout.split()
    paths = {ROOT / path for path in tracked} | set(manifests())
    for path in sorted(paths):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                filled = [key for field in ("data", "stringData") for key, value in (doc.get(field) or {}).items()
                          if value]
                assert not filled, f"{path.relative_to(ROOT)}: Secret {doc['metadata']['name']} holds {sorted(filled)}"


# (d) What every workload needs, and the NetworkPolicies.

@pytest.mark.parametrize("workload", workloads(), ids=lambda workload: workload["metadata"]["name"])
def test_each_workload_has_probes_resources_a_budget_and_runs_unprivileged(workload):
    name = workload["metadata"]["name"]
    pod = workload["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False, name
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0, name
    for container in containers(workload):
        where = f"{name}/{container['name']}"
        for bound in ("requests", "limits"):
            assert set(container["resources"][bound]) >= {"cpu", "memory"}, f"{where}: {bound}"
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True, where
        assert context["capabilities"] == {"drop": ["ALL"]}, where
    for container in containers(workload, init=False):
        for probe in ("readinessProbe", "livenessProbe"):
            assert probe in container, f"{name}/{container['name']} has no {probe}"
            check_probe(workload, container, container[probe])
    budgets = [doc for doc in objects("PodDisruptionBudget") if selects(doc["spec"]["selector"], pod_labels(workload))]
    assert len(budgets) == 1, f"{name}: {len(budgets)} PodDisruptionBudgets select its pods"
    replicas = workload["spec"].get("replicas")
    if replicas is not None and replicas > 1:
        assert budgets[0]["spec"].get("minAvailable", 0) >= replicas // 2 + (workload["kind"] == "StatefulSet"), name


def check_probe(workload: dict[str, Any], container: dict[str, Any], probe: dict[str, Any]) -> None:
    """A probe reaches a port the container serves, and an Agent Reach server on a path open without credentials."""
    ports = {port.get("name"): port["containerPort"] for port in container["ports"]}
    command = workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    where = f"{workload['metadata']['name']}/{container['name']}"
    if "exec" in probe:
        targets = [URL(url) for url in re.findall(r"\w+://[^\s'\"]+", " ".join(probe["exec"]["command"]))]
        assert targets, f"{where}: an exec probe that names no URL"
        checked = [(url.port, url.path or "/") for url in targets]
    else:
        kind = "httpGet" if "httpGet" in probe else "tcpSocket"
        port = probe[kind]["port"]
        checked = [(ports.get(port, port), probe[kind].get("path"))]
    for port, path in checked:
        assert port in ports.values(), f"{where}: the probe's port {port} is none of {ports}"
        if command in OPEN_PATHS and path is not None:
            assert path in OPEN_PATHS[command], f"{where}: {path} is not served without credentials"


def test_the_services_reach_their_pods_and_the_routers_scale_from_two():
    for service in objects("Service"):
        spec = service["spec"]
        matched = [doc for doc in workloads() if selects({"matchLabels": spec["selector"]}, pod_labels(doc))]
        assert len(matched) == 1, f"Service {service['metadata']['name']} selects {len(matched)} workloads"
        names = {port.get("name") for container in containers(matched[0], init=False) for port in container["ports"]}
        assert {port["targetPort"] for port in spec["ports"]} <= names, service["metadata"]["name"]
    assert named("Deployment", "registry")["spec"]["replicas"] >= 2
    autoscaler = named("HorizontalPodAutoscaler", "router")
    assert autoscaler["apiVersion"] == "autoscaling/v2" and autoscaler["spec"]["minReplicas"] >= 2
    assert autoscaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "router"}
    assert "replicas" not in named("Deployment", "router")["spec"], "the autoscaler owns the routers' count"


def peers(policy: dict[str, Any], port: int | None = None) -> list[dict[str, str]]:
    """The pods a policy admits (on ``port``, or on any), each as its labels; a rule open to more than pods fails."""
    name = policy["metadata"]["name"]
    found = []
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), f"{name}: a rule without `from` admits every source"
        ports = {entry["port"] for entry in rule.get("ports", [])}
        if port is None or not ports or port in ports:
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, f"{name}: {peer} admits more than pods of this namespace"
                found.append(peer["podSelector"]["matchLabels"])
    return found


def selected(labels: dict[str, str]) -> set[str]:
    """The workloads whose pods carry ``labels``."""
    return {doc["metadata"]["name"] for doc in workloads() if selects({"matchLabels": labels}, pod_labels(doc))}


def admitted(policy: dict[str, Any], port: int | None = None) -> set[str]:
    """The workloads whose pods a policy lets in (on ``port``, or on any)."""
    return {name for peer in peers(policy, port) for name in selected(peer)}


def policies_for(labels: dict[str, str]) -> list[dict[str, Any]]:
    return [doc for doc in objects("NetworkPolicy") if selects(doc["spec"]["podSelector"], labels)]


def test_only_routers_call_agents_and_only_registries_reach_etcd():
    """Agents (pods labelled agentreach.io/agent) admit the routers, and the registries, whose active health check
    probes an instance that fell silent, and no one else; etcd's client port admits registries, its peer port its
    members; the broker admits routers and agents."""
    (agents,) = policies_for(AGENT_LABEL)
    (etcd,) = policies_for(pod_labels(named("StatefulSet", "etcd")))
    (broker,) = policies_for(pod_labels(named("Deployment", "redis")))
    for policy in (agents, etcd, broker):
        assert policy["spec"]["policyTypes"] == ["Ingress"], policy["metadata"]["name"]
    assert admitted(agents) == {"router", "registry"}
    assert all(selected(peer) for peer in peers(agents)), f"agents admit pods none of the mesh's: {peers(agents)}"
    assert admitted(etcd, 2379) == {"registry"} and admitted(etcd, 2380) == {"etcd"}
    assert admitted(broker, 6379) == {"router"} and AGENT_LABEL in peers(broker, 6379)
