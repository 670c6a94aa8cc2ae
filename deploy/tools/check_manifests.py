"""Checks what schemas cannot see in a rendered overlay: selectors that select, probes on the
right port and health entry, a grace period that covers the drain, the metrics port and its
scrape annotations, the security context, the image's binaries, Secrets referenced, never
written, and who may reach the server (check_security.py: authentication, TLS,
NetworkPolicies). Custom resources are validated against the schemas in deploy/tools/schemas,
and the monitoring component's PodMonitor and PrometheusRule against the pods and
deploy/monitoring.

    python check_manifests.py OVERLAY_NAME RENDERED.yaml [--dockerfile Dockerfile]
                              [--policy-bin OPJOURNAL_BINARY]

Prints every problem found and exits 1 if there is any. Run by deploy/validate.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import yaml

import custom_resources
from check_security import check_security, health_port

# The binaries the Dockerfile puts into the image (there is no shell); --dockerfile reads them
# from the Dockerfile's `cp target/release/...` line instead.
IMAGE_BINARIES = {
    "/usr/local/bin/opjournal",
    "/usr/local/bin/opjournal-reconciler",
    "/usr/local/bin/opjournal-sandbox",
}
# Seconds budgeted for in-flight calls to finish once the listener closes.
DRAIN_BUDGET_SECONDS = 20
RECOMMENDED = ("app.kubernetes.io/name", "app.kubernetes.io/instance",
               "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by")
WORKLOADS = ("Deployment", "Job")
SECRET_LIKE = re.compile(r"(DATABASE_URL|TOKEN|PASSWORD|SECRET|KEY)$")
# The alerting rules' source: a PrometheusRule must carry exactly its groups.
RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "monitoring",
                          "rules.yaml")

problems: list[str] = []


def problem(where: str, message: str) -> None:
    problems.append(f"{where}: {message}")


def name(doc: dict) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def env_of(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def env_value(container: dict, key: str) -> str | None:
    entry = env_of(container).get(key)
    return None if entry is None else entry.get("value")


def port_of(address: str | None) -> int | None:
    if not address or ":" not in address:
        return None
    return int(address.rsplit(":", 1)[1])


def check_pod(where: str, pod: dict, configmaps: dict) -> None:
    if pod.get("automountServiceAccountToken") is not False:
        problem(where, "automountServiceAccountToken must be false (the pods never call the API)")
    if pod.get("enableServiceLinks") is not False:
        problem(where, "enableServiceLinks must be false (service links collide with OPJOURNAL_*)")
    psc = pod.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        problem(where, "securityContext.runAsNonRoot must be true")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problem(where, "securityContext.seccompProfile.type must be RuntimeDefault")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for c in pod.get("initContainers", []) + pod["containers"]:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problem(cw, "allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problem(cw, "readOnlyRootFilesystem must be true")
        if sc.get("privileged"):
            problem(cw, "must not be privileged")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            problem(cw, "capabilities.drop must contain ALL")
        if sc.get("capabilities", {}).get("add"):
            problem(cw, "must not add capabilities")
        res = c.get("resources", {})
        for kind, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
            for key in keys:
                if key not in res.get(kind, {}):
                    problem(cw, f"resources.{kind}.{key} is missing")
        command = c.get("command") or []
        if not command or command[0] not in IMAGE_BINARIES:
            problem(cw, f"command must start with one of the image's binaries, not {command!r}")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if "exec" in c.get(probe, {}):
                problem(cw, f"{probe} uses exec: the image has no shell or probe binary")
        for hook in ("preStop", "postStart"):
            if "exec" in c.get("lifecycle", {}).get(hook, {}):
                problem(cw, f"lifecycle.{hook} uses exec: the image has no shell")
        for key, entry in env_of(c).items():
            if SECRET_LIKE.search(key) and "value" in entry:
                problem(cw, f"{key} is written in the manifest; reference a Secret instead")
        policy = env_value(c, "OPJOURNAL_SERVER__POLICY_FILE")
        if policy:
            directory, filename = os.path.split(policy)
            mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == directory]
            if not mounts:
                problem(cw, f"OPJOURNAL_SERVER__POLICY_FILE={policy} is not under a volume mount")
                continue
            mount = mounts[0]
            if mount.get("readOnly") is not True:
                problem(cw, f"the policy mount {directory} must be readOnly")
            source = volumes.get(mount["name"], {}).get("configMap", {}).get("name")
            if source not in configmaps:
                problem(cw, f"the policy volume names ConfigMap {source!r}, not rendered here")
            elif filename not in configmaps[source].get("data", {}):
                problem(cw, f"ConfigMap {source} has no key {filename}")


def grpc_probe(where: str, c: dict, probe: str, port: int | None, service: str) -> None:
    spec = c.get(probe, {}).get("grpc")
    if spec is None:
        problem(where, f"{probe} must be a native grpc probe")
        return
    if spec.get("port") != port:
        problem(where, f"{probe} probes port {spec.get('port')}, the process listens on {port}")
    if spec.get("service") != service:
        problem(where, f"{probe} must ask for the health entry {service!r}")


def check_metrics(where: str, template: dict, c: dict, variable: str) -> None:
    """The admin port serving /metrics: listened on every address, declared as the container
    port named metrics, and the one the Prometheus scrape annotations name."""
    listen = env_value(c, variable)
    if not listen or not listen.startswith("0.0.0.0:"):
        problem(where, f"{variable} must listen on every address (Prometheus scrapes the "
                f"pod's IP), not {listen!r}")
        return
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if ports.get("metrics") != port_of(listen):
        problem(where, f"the container port named metrics ({ports.get('metrics')}) is not "
                f"{listen}")
    annotations = template["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true":
        problem(where, 'the pod needs the annotation prometheus.io/scrape: "true"')
    if annotations.get("prometheus.io/port") != str(port_of(listen)):
        problem(where, f"prometheus.io/port ({annotations.get('prometheus.io/port')}) is not "
                f"the metrics port {port_of(listen)}")
    if annotations.get("prometheus.io/path", "/metrics") != "/metrics":
        problem(where, "prometheus.io/path must be /metrics")
    if not env_value(c, "OTEL_SERVICE_NAME"):
        problem(where, "OTEL_SERVICE_NAME must name the process in traces and metrics")


def check_server(where: str, pod: dict) -> None:
    c = pod["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    listen = env_value(c, "OPJOURNAL_SERVER__LISTEN")
    if not listen or not listen.startswith("0.0.0.0:"):
        problem(where, f"OPJOURNAL_SERVER__LISTEN must listen on every address, not {listen!r}")
    if port_of(listen) != ports.get("grpc"):
        problem(where, f"the container port named grpc ({ports.get('grpc')}) is not {listen}")
    health = env_value(c, "OPJOURNAL_SERVER__HEALTH_LISTEN")
    if health is not None:
        if not health.startswith("0.0.0.0:"):
            problem(where, f"OPJOURNAL_SERVER__HEALTH_LISTEN must listen on every address (the kubelet "
                    f"probes the pod's IP), not {health!r}")
        if port_of(health) != ports.get("health"):
            problem(where, f"the container port named health ({ports.get('health')}) is not "
                    f"{health}")
    # With a health listener, the probes use it (the gRPC port may speak TLS).
    for probe, service in (("startupProbe", "liveness"), ("livenessProbe", "liveness"),
                           ("readinessProbe", "readiness")):
        grpc_probe(where, c, probe, health_port(c), service)
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    drain_delay = float(env_value(c, "OPJOURNAL_SERVER__DRAIN_DELAY") or 0)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= pre_stop + drain_delay + DRAIN_BUDGET_SECONDS:
        problem(where, f"terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop} "
                f"+ drain_delay_seconds {drain_delay} + drain {DRAIN_BUDGET_SECONDS}")
    if "valueFrom" not in env_of(c).get("OPJOURNAL_DATABASE__URL", {}):
        problem(where, "OPJOURNAL_DATABASE__URL must come from a Secret")


def check_reconciler(where: str, pod: dict) -> None:
    c = pod["containers"][0]
    listen = env_value(c, "OPJOURNAL_RECONCILE__HEALTH_LISTEN")
    if not listen or not listen.startswith("0.0.0.0:"):
        problem(where, "OPJOURNAL_RECONCILE__HEALTH_LISTEN must listen on every address "
                f"(the kubelet probes the pod's IP), not {listen!r}")
    grpc_probe(where, c, "startupProbe", port_of(listen), "liveness")
    grpc_probe(where, c, "livenessProbe", port_of(listen), "liveness")
    grpc_probe(where, c, "readinessProbe", port_of(listen), "readiness")
    if "valueFrom" not in env_of(c).get("OPJOURNAL_DATABASE__URL", {}):
        problem(where, "OPJOURNAL_DATABASE__URL must come from a Secret")


def check_monitoring(docs: list, pod_templates: dict) -> None:
    """The monitoring component: its PodMonitor scrapes the metrics port of the server's and
    the worker's pods, and its PrometheusRule carries deploy/monitoring/rules.yaml."""
    for doc in docs:
        where = name(doc)
        if doc["kind"] == "PodMonitor":
            spec = doc["spec"]
            selector = spec["selector"].get("matchLabels", {})
            scraped = {owner: t for owner, t in pod_templates.items()
                       if matches(selector, t["metadata"].get("labels", {}))}
            components = {t["metadata"]["labels"].get("app.kubernetes.io/component")
                          for t in scraped.values()}
            if not {"server", "reconciler"} <= components:
                problem(where, f"selects the pods of {sorted(scraped) or 'nothing'}, not "
                        "both the server's and the reconciler's")
            for endpoint in spec.get("podMetricsEndpoints", []):
                for owner, template in scraped.items():
                    if template["metadata"]["labels"].get(
                            "app.kubernetes.io/component") not in ("server", "reconciler"):
                        continue
                    ports = {p.get("name") for c in template["spec"]["containers"]
                             for p in c.get("ports", [])}
                    if endpoint.get("port") not in ports:
                        problem(where, f"endpoint port {endpoint.get('port')!r} is not a "
                                f"container port of {owner}")
                if endpoint.get("path", "/metrics") != "/metrics":
                    problem(where, "the metrics are served at /metrics")
        if doc["kind"] == "PrometheusRule":
            with open(RULES_FILE) as f:
                rules = yaml.safe_load(f)
            if doc["spec"].get("groups") != rules["groups"]:
                problem(where, "spec.groups differ from deploy/monitoring/rules.yaml: run "
                        "scripts/check-monitoring --write")


def check_policies(configmaps: dict, binary: str) -> None:
    """Runs `opjournal check-config` on every policy file held in a ConfigMap."""
    for cm_name, cm in configmaps.items():
        for key, text in cm.get("data", {}).items():
            if not key.endswith((".yaml", ".yml")):
                continue
            env = {k: v for k, v in os.environ.items() if not k.startswith("OPJOURNAL_")}
            # Adapter headers are read from the environment at start; any value will do here.
            for variable in re.findall(r"\benv:\s*([A-Za-z_][A-Za-z0-9_]*)", text):
                env[variable] = "placeholder"
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
                f.write(text)
                f.flush()
                run = subprocess.run([binary, "check-config", "--policy", f.name], env=env,
                                     capture_output=True, text=True, timeout=60)
            if run.returncode != 0:
                output = (run.stdout + run.stderr).strip().replace(f.name, key)
                problem(f"ConfigMap/{cm_name}", f"opjournal check-config refused {key}:\n{output}")
            else:
                print(f"  policy {key} of ConfigMap/{cm_name}: accepted by {binary} check-config")


def check_documents(overlay: str, docs: list[dict], policy_bin: str | None = None) -> list[str]:
    """Every problem of the rendered `docs` of `overlay`, as `where: what` lines."""
    problems.clear()
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pods = []  # (owner, pod labels)
    problems.extend(custom_resources.validate(docs))
    check_monitoring(docs, {name(d): d["spec"]["template"] for d in docs
                            if d["kind"] in WORKLOADS})

    for doc in docs:
        where = name(doc)
        labels = doc["metadata"].get("labels", {})
        if doc["kind"] == "Secret":
            problem(where, "Secrets are created outside this tree; reference them by name")
        for key in RECOMMENDED:
            if key not in labels:
                problem(where, f"label {key} is missing")
        if doc["kind"] not in WORKLOADS:
            continue
        template = doc["spec"]["template"]
        pod = template["spec"]
        pod_labels = template["metadata"].get("labels", {})
        pods.append((where, pod_labels))
        component = pod_labels.get("app.kubernetes.io/component")
        if not component:
            problem(where, "pod label app.kubernetes.io/component is missing")
        if doc["kind"] == "Deployment":
            if not matches(doc["spec"]["selector"].get("matchLabels", {}), pod_labels):
                problem(where, "spec.selector does not select the pod template's labels")
        for tsc in pod.get("topologySpreadConstraints", []):
            if not matches(tsc["labelSelector"].get("matchLabels", {}), pod_labels):
                problem(where, "a topology spread constraint does not select its own pods")
        anti = pod.get("affinity", {}).get("podAntiAffinity", {})
        for term in anti.get("preferredDuringSchedulingIgnoredDuringExecution", []):
            if not matches(term["podAffinityTerm"]["labelSelector"].get("matchLabels", {}),
                           pod_labels):
                problem(where, "a pod anti-affinity term does not select its own pods")
        check_pod(where, pod, configmaps)
        if component == "server":
            check_server(where, pod)
            check_metrics(where, template, pod["containers"][0], "OPJOURNAL_SERVER__METRICS_LISTEN")
        elif component == "reconciler":
            check_reconciler(where, pod)
            check_metrics(where, template, pod["containers"][0],
                          "OPJOURNAL_RECONCILE__METRICS_LISTEN")
        if overlay == "prod":
            for c in pod["containers"]:
                if "@sha256:" not in c["image"]:
                    problem(where, f"prod images are pinned by digest, not {c['image']}")

    def selected(selector: dict) -> list[str]:
        return [owner for owner, labels in pods if matches(selector, labels)]

    replicas = {name(d): d["spec"].get("replicas", 1) for d in docs if d["kind"] == "Deployment"}
    for doc in docs:
        where = name(doc)
        if doc["kind"] == "Service":
            owners = selected(doc["spec"].get("selector", {}))
            if len(owners) != 1:
                problem(where, f"selects the pods of {owners or 'nothing'}, not of one workload")
            if doc["metadata"]["name"] == "opjournal":
                ports = {p.get("name"): p for p in doc["spec"]["ports"]}
                if "grpc" not in ports or ports["grpc"].get("appProtocol") != "grpc":
                    problem(where, "needs a port named grpc with appProtocol grpc")
        if doc["kind"] == "PodDisruptionBudget":
            spec = doc["spec"]
            owners = selected(spec["selector"].get("matchLabels", {}))
            if len(owners) != 1 or not owners[0].startswith("Deployment/"):
                problem(where, f"selects the pods of {owners or 'nothing'}, not of one Deployment")
            if "minAvailable" in spec and "maxUnavailable" in spec:
                problem(where, "sets both minAvailable and maxUnavailable")
            minimum = spec.get("minAvailable")
            if isinstance(minimum, int) and owners and minimum >= replicas.get(owners[0], 1):
                problem(where, f"minAvailable {minimum} blocks every drain of "
                        f"{replicas.get(owners[0], 1)} replicas")
        if doc["kind"] == "Job":
            c = doc["spec"]["template"]["spec"]["containers"][0]
            if (c.get("command") or [None])[0] != "/usr/local/bin/opjournal" or \
                    c.get("args") != ["migrate"]:
                problem(where, "the migration Job must run `opjournal migrate`")

    components = {labels.get("app.kubernetes.io/component") for _, labels in pods}
    for needed in ("server", "reconciler", "migration"):
        if needed not in components:
            problem(overlay, f"no {needed} workload rendered")

    problems.extend(check_security(overlay, docs))

    if policy_bin:
        check_policies(configmaps, policy_bin)
    return list(problems)


def secrets_referenced(docs: list[dict]) -> list[str]:
    """Secret/key of every secretKeyRef and Secret of every volume of the workloads."""
    keys = {
        f"{e['valueFrom']['secretKeyRef']['name']}/{e['valueFrom']['secretKeyRef']['key']}"
        for d in docs if d["kind"] in WORKLOADS
        for c in d["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
    }
    volumes = {
        f"{v['secret']['secretName']} (volume)"
        for d in docs if d["kind"] in WORKLOADS
        for v in d["spec"]["template"]["spec"].get("volumes", []) if "secret" in v
    }
    return sorted(keys | volumes)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("overlay")
    parser.add_argument("rendered")
    parser.add_argument("--policy-bin")
    parser.add_argument("--dockerfile")
    args = parser.parse_args()

    if args.dockerfile:
        with open(args.dockerfile) as f:
            built = set(re.findall(r"target/release/([A-Za-z0-9_-]+)", f.read()))
        if not built:
            print(f"{args.dockerfile}: copies no binary out of target/release")
            return 1
        IMAGE_BINARIES.clear()
        IMAGE_BINARIES.update(f"/usr/local/bin/{b}" for b in built)

    with open(args.rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if not docs:
        print(f"{args.rendered}: no resources rendered")
        return 1
    found = check_documents(args.overlay, docs, args.policy_bin)
    custom = [name(d) for d in docs if custom_resources.has_schema(d)]
    if custom:
        print(f"  custom resources, against deploy/tools/schemas: {', '.join(custom)}")
    print(f"  Secrets referenced (created outside this tree): {', '.join(secrets_referenced(docs))}")
    for p in found:
        print(f"FAILED {args.overlay}: {p}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
