"""The checks can fail: each test breaks one thing in a rendered overlay and expects
check_manifests.py to name it, and the overlays as rendered pass. Run by deploy/validate
after rendering, with RENDERED_DIR naming the directory of the renderings:

    RENDERED_DIR=target/deploy-tools/rendered python -m unittest deploy/tools/test_check_manifests.py
"""

from __future__ import annotations

import copy
import os
import sys
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_manifests  # noqa: E402


def rendered(overlay: str) -> list[dict]:
    directory = os.environ.get("RENDERED_DIR")
    if not directory:
        raise RuntimeError("set RENDERED_DIR to the renderings' directory (deploy/validate does)")
    with open(os.path.join(directory, f"{overlay}.yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs: list[dict], kind: str, name: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def server(docs: list[dict]) -> dict:
    return find(docs, "Deployment", "opjournal-server")["spec"]["template"]["spec"]


def container(docs: list[dict]) -> dict:
    return server(docs)["containers"][0]


def drop_env(docs: list[dict], variable: str) -> None:
    c = container(docs)
    c["env"] = [e for e in c["env"] if e["name"] != variable]


def set_env(docs: list[dict], variable: str, value: str) -> None:
    drop_env(docs, variable)
    container(docs)["env"].append({"name": variable, "value": value})


def policy(docs: list[dict], name: str) -> dict:
    return find(docs, "NetworkPolicy", name)["spec"]


class Prod(unittest.TestCase):
    docs: list[dict]

    @classmethod
    def setUpClass(cls) -> None:
        cls.docs = rendered("prod")

    def failures(self, mutate) -> list[str]:
        docs = copy.deepcopy(self.docs)
        mutate(docs)
        return check_manifests.check_documents("prod", docs)

    def assertRefused(self, mutate, expected: str) -> None:
        found = self.failures(mutate)
        self.assertTrue(any(expected in p for p in found),
                        f"expected a problem with {expected!r}, got {found}")

    def test_the_rendered_overlay_passes(self) -> None:
        self.assertEqual(self.failures(lambda docs: None), [])

    def test_authentication_is_required(self) -> None:
        self.assertRefused(lambda d: drop_env(d, "OPJOURNAL_AUTH__TOKENS_FILE"), "authentication is off")

    def test_the_insecure_flag_is_refused(self) -> None:
        self.assertRefused(lambda d: set_env(d, "OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED", "true"),
                           "must not be set in prod")

    def test_tokens_come_from_a_secret(self) -> None:
        def from_config_map(docs):
            for volume in server(docs)["volumes"]:
                if volume["name"] == "tokens":
                    volume.pop("secret")
                    volume["configMap"] = {"name": "opjournal-policy"}
        self.assertRefused(from_config_map, "must come from a Secret volume")
        self.assertRefused(lambda d: set_env(d, "OPJOURNAL_AUTH__TOKENS", "[]"),
                           "OPJOURNAL_AUTH__TOKENS must come from a Secret")

    def test_tls_is_required_and_the_probes_use_the_plaintext_health_port(self) -> None:
        def no_tls(docs):
            drop_env(docs, "OPJOURNAL_TLS__CERT_FILE")
            drop_env(docs, "OPJOURNAL_TLS__KEY_FILE")
        self.assertRefused(no_tls, "TLS is off")
        self.assertRefused(lambda d: drop_env(d, "OPJOURNAL_SERVER__HEALTH_LISTEN"),
                           "OPJOURNAL_SERVER__HEALTH_LISTEN is not set")

        def probe_the_tls_port(docs):
            container(docs)["readinessProbe"]["grpc"]["port"] = 50051
        self.assertRefused(probe_the_tls_port, "readinessProbe probes port 50051")

    def test_a_renewed_certificate_must_reach_the_pod(self) -> None:
        def sub_path(docs):
            for mount in container(docs)["volumeMounts"]:
                if mount["name"] == "tls":
                    mount["subPath"] = "tls.crt"
        self.assertRefused(sub_path, "uses subPath")

        def unreadable(docs):
            server(docs)["securityContext"].pop("fsGroup")
        self.assertRefused(unreadable, "the process cannot read its file")

    def test_a_network_policy_is_required(self) -> None:
        def none(docs):
            docs[:] = [d for d in docs if d["kind"] != "NetworkPolicy"]
        self.assertRefused(none, "no NetworkPolicy")

        def no_default_deny(docs):
            docs[:] = [d for d in docs if d["metadata"]["name"] != "opjournal-default-deny-ingress"]
        self.assertRefused(no_default_deny, "no default-deny NetworkPolicy")

        def server_unselected(docs):
            no_default_deny(docs)
            policy(docs, "opjournal-server")["podSelector"]["matchLabels"][
                "app.kubernetes.io/component"] = "other"
        self.assertRefused(server_unselected, "no NetworkPolicy selects its pods")

    def test_the_grpc_port_admits_only_caller_namespaces(self) -> None:
        def every_namespace(docs):
            policy(docs, "opjournal-server")["ingress"][0]["from"] = [{"namespaceSelector": {}}]
        self.assertRefused(every_namespace, "must name namespaces by matchLabels")

        def every_source(docs):
            policy(docs, "opjournal-server")["ingress"][0].pop("from")
        self.assertRefused(every_source, "admits every source")

        def an_address_block(docs):
            policy(docs, "opjournal-server")["ingress"][0]["from"].append(
                {"ipBlock": {"cidr": "0.0.0.0/0"}})
        self.assertRefused(an_address_block, "ipBlock")

        def own_namespace(docs):
            policy(docs, "opjournal-server")["ingress"][0]["from"].append({"podSelector": {}})
        self.assertRefused(own_namespace, "without namespaceSelector")

        def another_label(docs):
            policy(docs, "opjournal-server")["ingress"][0]["from"] = [
                {"namespaceSelector": {"matchLabels": {"team": "payments"}}}]
        self.assertRefused(another_label, "the grpc port admits more than the callers")

        def no_grpc(docs):
            del policy(docs, "opjournal-server")["ingress"][0]
        self.assertRefused(no_grpc, "no caller namespace is admitted")

    def test_the_other_ports_admit_only_the_scraper_or_nobody(self) -> None:
        def every_port(docs):
            policy(docs, "opjournal-server")["ingress"][0].pop("ports")
        self.assertRefused(every_port, "admits every port")

        def health_to_callers(docs):
            policy(docs, "opjournal-server")["ingress"][0]["ports"].append(
                {"port": "health", "protocol": "TCP"})
        self.assertRefused(health_to_callers, "port health is admitted")

        def metrics_to_callers(docs):
            policy(docs, "opjournal-server")["ingress"][0]["ports"].append(
                {"port": 9464, "protocol": "TCP"})
        self.assertRefused(metrics_to_callers, "the metrics port admits more than the scraper")

        def worker_unscraped(docs):
            policy(docs, "opjournal-reconciler")["ingress"] = []
        self.assertRefused(worker_unscraped, "the metrics scraper is not admitted")

    def test_custom_resources_follow_their_schemas(self) -> None:
        def misspelt_field(docs):
            find(docs, "PodMonitor", "opjournal")["spec"]["podMetricsEndpoints"][0][
                "scrapeTimout"] = "10s"
        self.assertRefused(misspelt_field, "'scrapeTimout' was unexpected")

        def bad_duration(docs):
            find(docs, "PrometheusRule", "opjournal")["spec"]["groups"][0]["rules"][0][
                "for"] = "1 minute"
        self.assertRefused(bad_duration, "'1 minute' does not match")

    def test_the_pod_monitor_scrapes_the_metrics_port_of_both_kinds_of_pod(self) -> None:
        def server_only(docs):
            find(docs, "PodMonitor", "opjournal")["spec"]["selector"]["matchLabels"][
                "app.kubernetes.io/component"] = "server"
        self.assertRefused(server_only, "not both the server's and the reconciler's")

        def another_port(docs):
            find(docs, "PodMonitor", "opjournal")["spec"]["podMetricsEndpoints"][0][
                "port"] = "grpc-metrics"
        self.assertRefused(another_port, "'grpc-metrics' is not a container port")

    def test_the_prometheus_rule_carries_the_rules_file(self) -> None:
        def edited(docs):
            rule = find(docs, "PrometheusRule", "opjournal")["spec"]["groups"][0]["rules"][0]
            rule["labels"]["severity"] = "info"
        self.assertRefused(edited, "differ from deploy/monitoring/rules.yaml")


class Elsewhere(unittest.TestCase):
    def test_the_rendered_base_and_dev_pass(self) -> None:
        for overlay in ("base", "dev"):
            self.assertEqual(check_manifests.check_documents(overlay, rendered(overlay)), [],
                             overlay)

    def test_without_tokens_the_insecure_flag_must_be_explicit(self) -> None:
        docs = rendered("dev")
        drop_env(docs, "OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED")
        found = check_manifests.check_documents("dev", docs)
        self.assertTrue(any("refuses to listen on 0.0.0.0 without tokens" in p for p in found),
                        found)

    def test_the_insecure_flag_beside_tokens_is_refused(self) -> None:
        docs = rendered("base")
        set_env(docs, "OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED", "true")
        found = check_manifests.check_documents("base", docs)
        self.assertTrue(any("set beside tokens" in p for p in found), found)


if __name__ == "__main__":
    unittest.main()
