"""Who may reach a rendered overlay's server, and how: the checks of check_manifests.py that
concern authentication, TLS and NetworkPolicies.

- Authentication: the server's bearer tokens come from a Secret (OPJOURNAL_AUTH__TOKENS_FILE on a
  Secret volume, or OPJOURNAL_AUTH__TOKENS from a secretKeyRef). Outside prod a server without
  tokens must say so (OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED=true, or it refuses to listen
  on 0.0.0.0); in prod it must have tokens and must not set that flag.
- TLS: certificate and key files from one Secret volume, mounted whole (a subPath mount never
  sees a renewal) and readable by the process; with TLS on, health is served in plaintext on
  OPJOURNAL_SERVER__HEALTH_LISTEN for the kubelet's probes. Prod serves TLS.
- NetworkPolicies, checked for their shape wherever they exist, required in prod: every
  server and worker pod is selected by an ingress policy; every rule names its ports and its
  sources; every source is a namespace named by labels (never an ipBlock, an empty selector
  or the policy's own namespace); the grpc port admits only caller namespaces (label
  opjournal.dev/caller=true, or named), the metrics port only the scraper (a named namespace
  and its pods' labels), and no other port anyone (the kubelet is always admitted). Prod also
  needs a default-deny policy over every pod of the namespace.
"""

from __future__ import annotations

import os

# The label of the namespaces whose pods may call the journal.
CALLER_LABEL = "opjournal.dev/caller"
# The label Kubernetes puts on every namespace, holding its name.
NAMESPACE_NAME = "kubernetes.io/metadata.name"
INSECURE = "OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED"
COMPONENT = "app.kubernetes.io/component"


class Findings:
    """Problems found, each once, in the order found."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        text = f"{where}: {message}"
        if text not in self.items:
            self.items.append(text)


def env_of(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def env_value(container: dict, key: str) -> str | None:
    entry = env_of(container).get(key)
    return None if entry is None else entry.get("value")


def port_of(address: str | None) -> int | None:
    if not address or ":" not in address:
        return None
    return int(address.rsplit(":", 1)[1])


def secret_file(where: str, pod: dict, c: dict, variable: str, found: Findings) -> str | None:
    """The Secret behind the file that `variable` names, if it comes from one as it should."""
    path = env_value(c, variable)
    if not path:
        return None
    directory, filename = os.path.split(path)
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == directory]
    if not mounts:
        found.add(where, f"{variable}={path} is not under a volume mount")
        return None
    mount = mounts[0]
    if mount.get("readOnly") is not True:
        found.add(where, f"the mount {directory} of {variable} must be readOnly")
    if "subPath" in mount or "subPathExpr" in mount:
        found.add(where, f"the mount {directory} of {variable} uses subPath: a changed Secret "
                  "never reaches it")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    secret = volumes.get(mount["name"], {}).get("secret")
    if secret is None:
        found.add(where, f"{variable}={path} must come from a Secret volume")
        return None
    items = secret.get("items")
    if items is not None and filename not in [i.get("path") for i in items]:
        found.add(where, f"the Secret volume of {variable} has no item {filename}")
    mode = secret.get("defaultMode", 0o644)
    group_read = mode & 0o040 and pod.get("securityContext", {}).get("fsGroup") is not None
    if not (mode & 0o004 or group_read):
        found.add(where, f"{variable}: the process cannot read its file (defaultMode "
                  f"{mode:#o} with no fsGroup); use 0440 with fsGroup")
    return secret.get("secretName")


def check_authentication(overlay: str, where: str, pod: dict, c: dict, found: Findings) -> None:
    from_file = secret_file(where, pod, c, "OPJOURNAL_AUTH__TOKENS_FILE", found)
    inline = env_of(c).get("OPJOURNAL_AUTH__TOKENS")
    from_env = inline is not None and "secretKeyRef" in inline.get("valueFrom", {})
    if inline is not None and not from_env:
        found.add(where, "OPJOURNAL_AUTH__TOKENS must come from a Secret (secretKeyRef)")
    has_tokens = bool(from_file or from_env)
    flagged = INSECURE in env_of(c)
    insecure = (env_value(c, INSECURE) or "").lower() == "true"
    if overlay == "prod":
        if not has_tokens:
            found.add(where, "authentication is off: prod needs bearer tokens from a Secret "
                      "(OPJOURNAL_AUTH__TOKENS_FILE on a Secret volume, or OPJOURNAL_AUTH__TOKENS from a "
                      "secretKeyRef)")
        if flagged:
            found.add(where, f"{INSECURE} must not be set in prod")
    elif not has_tokens and not insecure:
        found.add(where, f"no bearer tokens, and {INSECURE} is not \"true\": the server refuses "
                  "to listen on 0.0.0.0 without tokens")
    elif has_tokens and flagged:
        found.add(where, f"{INSECURE} is set beside tokens: drop it")


def check_tls(overlay: str, where: str, pod: dict, c: dict, found: Findings) -> None:
    cert = env_value(c, "OPJOURNAL_TLS__CERT_FILE")
    key = env_value(c, "OPJOURNAL_TLS__KEY_FILE")
    if not cert and not key:
        if overlay == "prod":
            found.add(where, "TLS is off: prod serves TLS from a Secret (OPJOURNAL_TLS__CERT_FILE "
                      "and OPJOURNAL_TLS__KEY_FILE); for a mesh's mTLS, use an overlay of your own")
        return
    if not cert or not key:
        found.add(where, "OPJOURNAL_TLS__CERT_FILE and OPJOURNAL_TLS__KEY_FILE go together")
    secrets = {secret_file(where, pod, c, v, found)
               for v in ("OPJOURNAL_TLS__CERT_FILE", "OPJOURNAL_TLS__KEY_FILE") if env_value(c, v)}
    if len(secrets) != 1:
        found.add(where, "the certificate and its key must come from one Secret (renewed together)")
    secret_file(where, pod, c, "OPJOURNAL_TLS__CLIENT_CA_FILE", found)
    health = env_value(c, "OPJOURNAL_SERVER__HEALTH_LISTEN")
    if not health:
        found.add(where, "TLS is on but OPJOURNAL_SERVER__HEALTH_LISTEN is not set: the kubelet's grpc "
                  "probes speak plaintext only")


def health_port(c: dict) -> int | None:
    """The port the kubelet's probes must use: the plaintext health listener, if any."""
    return port_of(env_value(c, "OPJOURNAL_SERVER__HEALTH_LISTEN") or env_value(c, "OPJOURNAL_SERVER__LISTEN"))


def selects(selector: dict | None, labels: dict) -> bool:
    selector = selector or {}
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def is_ingress(policy: dict) -> bool:
    types = policy["spec"].get("policyTypes")
    return "Ingress" in types if types else True


def check_peer(where: str, peer: dict, found: Findings) -> None:
    if "ipBlock" in peer:
        found.add(where, "an ipBlock source admits addresses, not namespaces")
        return
    namespaces = peer.get("namespaceSelector")
    if namespaces is None:
        found.add(where, "a source without namespaceSelector admits the policy's own namespace; "
                  "name the namespaces")
    elif not namespaces.get("matchLabels") or namespaces.get("matchExpressions"):
        found.add(where, "a namespaceSelector must name namespaces by matchLabels alone (an "
                  "empty one admits every namespace)")
    pods = peer.get("podSelector")
    if pods is not None and pods.get("matchExpressions"):
        found.add(where, "a podSelector must use matchLabels alone")


def is_caller(peer: dict) -> bool:
    labels = (peer.get("namespaceSelector") or {}).get("matchLabels", {})
    return labels.get(CALLER_LABEL) == "true" or NAMESPACE_NAME in labels


def is_scraper(peer: dict) -> bool:
    labels = (peer.get("namespaceSelector") or {}).get("matchLabels", {})
    return NAMESPACE_NAME in labels and bool((peer.get("podSelector") or {}).get("matchLabels"))


def check_network_policies(overlay: str, docs: list[dict], found: Findings) -> None:
    policies = [d for d in docs if d["kind"] == "NetworkPolicy" and is_ingress(d)]
    for policy in policies:
        for i, rule in enumerate(policy["spec"].get("ingress", [])):
            where = f"NetworkPolicy/{policy['metadata']['name']} ingress[{i}]"
            if not rule.get("from"):
                found.add(where, "admits every source (no from): name the namespaces")
            if not rule.get("ports"):
                found.add(where, "admits every port (no ports): name grpc or metrics")
            for peer in rule.get("from") or []:
                check_peer(where, peer, found)
            for port in rule.get("ports") or []:
                if port.get("port") is None or "endPort" in port:
                    found.add(where, "names no single port: every port or a range is admitted")
    if overlay == "prod":
        if not policies:
            found.add(overlay, "no NetworkPolicy: every pod in the cluster reaches the server")
        if not any(not p["spec"].get("podSelector") and not p["spec"].get("ingress")
                   for p in policies):
            found.add(overlay, "no default-deny NetworkPolicy (podSelector {}, no ingress rule): "
                      "pods without a policy of their own admit every caller")
    if not policies:
        return
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        template = doc["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        component = labels.get(COMPONENT)
        if component not in ("server", "reconciler"):
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        c = template["spec"]["containers"][0]
        names = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
        applying = [p for p in policies if selects(p["spec"].get("podSelector"), labels)]
        if not applying:
            found.add(where, "no NetworkPolicy selects its pods: every pod in the cluster "
                      "reaches them")
            continue
        admitted: dict[str, list[dict]] = {}
        for policy in applying:
            for rule in policy["spec"].get("ingress", []):
                for port in rule.get("ports") or [{"port": None}]:
                    number = port.get("port")
                    if number is None:
                        port_name = "(every port)"
                    elif isinstance(number, int):
                        port_name = names.get(number) or str(number)
                    else:
                        port_name = str(number)
                    admitted.setdefault(port_name, []).extend(rule.get("from") or [{}])
        for port_name, peers in admitted.items():
            if port_name == "grpc" and component == "server":
                if not all(is_caller(p) for p in peers):
                    found.add(where, f"the grpc port admits more than the callers' namespaces "
                              f"(label {CALLER_LABEL}=\"true\", or named)")
            elif port_name == "metrics":
                if not all(is_scraper(p) for p in peers):
                    found.add(where, "the metrics port admits more than the scraper (a named "
                              "namespace and its pods' labels)")
            else:
                found.add(where, f"port {port_name} is admitted to other pods; nothing but the "
                          "kubelet (always admitted) needs it")
        if component == "server" and "grpc" not in admitted:
            found.add(where, "no caller namespace is admitted to the grpc port")
        if "metrics" not in admitted:
            found.add(where, "the metrics scraper is not admitted to the metrics port")


def check_security(overlay: str, docs: list[dict]) -> list[str]:
    """Every security problem of the rendered `docs` of `overlay`."""
    found = Findings()
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        template = doc["spec"]["template"]
        if template["metadata"].get("labels", {}).get(COMPONENT) != "server":
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        pod = template["spec"]
        c = pod["containers"][0]
        check_authentication(overlay, where, pod, c, found)
        check_tls(overlay, where, pod, c, found)
    check_network_policies(overlay, docs, found)
    return found.items
