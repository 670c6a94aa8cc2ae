"""The shared client scenarios (``clients/scenarios.yaml``, read its header) through the sync
client and through the asyncio client.

``tests/it/client_scenarios.rs`` runs this file with ``OPJOURNAL_TEST_SERVER``,
``OPJOURNAL_TEST_SANDBOX_URL``, ``OPJOURNAL_TEST_CONTROL_URL`` and
``OPJOURNAL_SCENARIO_PREFIX`` set; every scenario runs twice, under the prefixes
``{prefix}-sync`` (``JournalClient.execute``) and ``{prefix}-async``
(``AsyncJournalClient.execute``). Each step's answer is held against ``expect``, and each
scenario's ``final`` against GetOperation and the sandbox's effect counts; the Rust test
then checks the rows and counts again itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from opjournal.v1 import journal_pb2 as pb
from opjournal_client import (
    AsyncJournalClient,
    DuplicateIntentSuspected,
    FailedFinal,
    IdempotencyKeyReusedError,
    InProgress,
    JournalClient,
    LeaseExpiredBeforeCallError,
    LeaseLostError,
    OperationNotFoundError,
    ProviderCall,
    ProviderRejected,
    ProviderResult,
    Succeeded,
    VerificationRequired,
)

SCENARIO_FILE = Path(__file__).resolve().parents[2] / "scenarios.yaml"
SPEC = yaml.safe_load(SCENARIO_FILE.read_text())
assert SPEC["version"] == 1, "this runner reads version 1 of clients/scenarios.yaml"
DEFAULTS = SPEC["defaults"]

#: The provider function's HTTP timeout (the file's header: 1 second).
PROVIDER_TIMEOUT = 1.0


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: run this file through `cargo test --test client_scenarios`"
        )
    return value


@dataclass
class Env:
    server: str
    sandbox: str
    control: str
    prefix: str


@pytest.fixture(scope="module")
def env() -> Env:
    return Env(
        server=_env("OPJOURNAL_TEST_SERVER"),
        sandbox=_env("OPJOURNAL_TEST_SANDBOX_URL").rstrip("/"),
        control=_env("OPJOURNAL_TEST_CONTROL_URL").rstrip("/"),
        prefix=_env("OPJOURNAL_SCENARIO_PREFIX"),
    )


def _post(url: str, body: Any, headers: Optional[dict[str, str]] = None, timeout: float = 30.0) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


@dataclass
class Run:
    """One scenario under one prefix: its keys, payloads and what the provider returned."""

    env: Env
    mode: str
    scenario: dict[str, Any]
    #: The payment id the provider returned, per step key.
    paid: dict[str, str] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return f"{self.env.prefix}-{self.mode}"

    @property
    def run_id(self) -> str:
        return f"{self.prefix}:{self.scenario['name']}"

    def key(self, step_key: str) -> str:
        return f"{self.run_id}:{step_key}"

    def payload(self, patch: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        return {**DEFAULTS["payload"], "run": self.run_id, **(patch or {})}

    def control(self, step: dict[str, Any]) -> None:
        body = dict(step.get("body") or {})
        body["operation_key"] = self.key(body.pop("key", "main"))
        body.setdefault("action_type", DEFAULTS["action_type"])
        body.setdefault("payload", self.payload())
        _post(f"{self.env.control}/{step['path']}", body)

    def provide(self, behaviour: str, step_key: str, action_type: str, payload: dict[str, Any], call: ProviderCall) -> ProviderResult:
        """The provider function of the file's header, for one behaviour."""
        if behaviour == "none":
            raise AssertionError("the provider function was called for a `provider: none` step")
        if behaviour == "raise":
            raise RuntimeError("an unexpected error before any provider call")
        fault = {
            "commit-then-timeout": "commit-then-timeout",
            "fail-before-store": "fail-before-store",
            "reject": "reject",
        }.get(behaviour)
        headers = {"Idempotency-Key": call.provider_key}
        if fault:
            headers["X-Sandbox-Fault"] = fault
        try:
            payment = _post(f"{self.env.sandbox}/v1/payments", payload, headers, PROVIDER_TIMEOUT)
        except urllib.error.HTTPError as error:
            if behaviour == "reject" and error.code == 402:
                raise ProviderRejected("card_declined") from error
            raise
        self.paid[step_key] = payment["id"]
        if behaviour == "restart_journal":
            _post(f"{self.env.control}/journal/restart", {"down_ms": 1500})
        elif behaviour == "takeover":
            _post(
                f"{self.env.control}/lease/takeover",
                {"operation_key": self.key(step_key), "action_type": action_type, "payload": payload},
            )
        elif behaviour != "ok":
            raise AssertionError(f"unknown provider behaviour {behaviour!r}")
        return ProviderResult(external_id=payment["id"], result=payment)

    def execute_args(self, step: dict[str, Any]) -> tuple[str, str, str, dict[str, Any], dict[str, Any], str]:
        step_key = step.get("key", "main")
        action_type = step.get("action_type", DEFAULTS["action_type"])
        payload = self.payload(step.get("payload_patch"))
        options = {
            "in_progress_wait": step.get("in_progress_wait_ms", 0) / 1000,
            "settle_wait": step.get("settle_wait_ms", 0) / 1000,
            "lease_seconds": step.get("lease_seconds", 0),
        }
        return step_key, self.key(step_key), action_type, payload, options, step["provider"]

    def check(self, step_key: str, answer: Any, expect: dict[str, Any], where: str) -> None:
        """Holds an outcome (or the typed error raised) against ``expect``."""
        kinds: dict[str, type] = {
            "succeeded": Succeeded,
            "failed_final": FailedFinal,
            "verification_required": VerificationRequired,
            "in_progress": InProgress,
            "duplicate_intent_suspected": DuplicateIntentSuspected,
            "conflict": IdempotencyKeyReusedError,
            "lease_lost": LeaseLostError,
            "lease_expired": LeaseExpiredBeforeCallError,
        }
        wanted = kinds[expect["outcome"]]
        assert isinstance(answer, wanted), f"{where}: expected {expect['outcome']}, got {answer!r}"
        if isinstance(answer, (Succeeded, FailedFinal)) and "replayed" in expect:
            assert answer.replayed == expect["replayed"], f"{where}: replayed"
        if isinstance(answer, VerificationRequired) and "reported" in expect:
            assert answer.reported == expect["reported"], f"{where}: reported"
        if "error_code" in expect:
            assert getattr(answer, "error_code") == expect["error_code"], f"{where}: error_code"
        if expect.get("external_id_from_provider"):
            assert isinstance(answer, Succeeded)
            assert answer.external_id == self.paid[step_key], f"{where}: external id"
        if "duplicate_of" in expect:
            assert isinstance(answer, DuplicateIntentSuspected)
            assert answer.duplicate_of_operation_key == self.key(expect["duplicate_of"])

    def effects(self, provider_key: str) -> dict[str, int]:
        quoted = urllib.parse.quote(provider_key, safe="")
        with urllib.request.urlopen(f"{self.env.sandbox}/v1/effects/{quoted}", timeout=5) as r:
            counts = json.load(r)
        return {name: counts[name] for name in ("requests", "effects")}

    def check_final(self, get: Callable[[str], pb.Operation]) -> None:
        for step_key, final in self.scenario["final"].items():
            key = self.key(step_key)
            where = f"{self.run_id} final {step_key}"
            if final.get("row") == "none":
                with pytest.raises(OperationNotFoundError):
                    get(key)
            else:
                row = get(key)
                status = pb.OperationStatus.Name(row.status).removeprefix("OPERATION_STATUS_")
                assert status.lower() == final["status"], f"{where}: status"
                assert row.attempt_count == final["attempt_count"], f"{where}: attempt_count"
                if "error_code" in final:
                    assert row.error_code == final["error_code"], f"{where}: error_code"
            # The default namespace: the provider key is the operation key.
            counts = self.effects(key)
            assert counts == {"requests": final["requests"], "effects": final["effects"]}, where


SCENARIOS = SPEC["scenarios"]
IDS = [scenario["name"] for scenario in SCENARIOS]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_sync(env: Env, scenario: dict[str, Any]) -> None:
    run = Run(env, "sync", scenario)
    with JournalClient.connect(env.server) as journal:
        for number, step in enumerate(scenario["steps"], 1):
            where = f"{run.run_id} step {number}"
            if "control" in step:
                run.control(step["control"])
                continue
            step_key, key, action_type, payload, options, behaviour = run.execute_args(step["execute"])
            calls: list[str] = []

            def call(provider_call: ProviderCall) -> ProviderResult:
                calls.append(provider_call.provider_key)
                return run.provide(behaviour, step_key, action_type, payload, provider_call)

            try:
                answer: Any = journal.execute(key, action_type, payload, call, **options)
            except (IdempotencyKeyReusedError, LeaseLostError, LeaseExpiredBeforeCallError) as error:
                answer = error
            if behaviour == "none":
                assert not calls, f"{where}: the provider function was called"
            run.check(step_key, answer, step["expect"], where)
        run.check_final(journal.get)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_async(env: Env, scenario: dict[str, Any]) -> None:
    run = Run(env, "async", scenario)

    async def main() -> None:
        async with AsyncJournalClient.connect(env.server) as journal:
            for number, step in enumerate(scenario["steps"], 1):
                where = f"{run.run_id} step {number}"
                if "control" in step:
                    await asyncio.to_thread(run.control, step["control"])
                    continue
                step_key, key, action_type, payload, options, behaviour = run.execute_args(
                    step["execute"]
                )
                calls: list[str] = []

                async def call(provider_call: ProviderCall) -> ProviderResult:
                    calls.append(provider_call.provider_key)
                    return await asyncio.to_thread(
                        run.provide, behaviour, step_key, action_type, payload, provider_call
                    )

                try:
                    answer: Any = await journal.execute(key, action_type, payload, call, **options)
                except (IdempotencyKeyReusedError, LeaseLostError, LeaseExpiredBeforeCallError) as error:
                    answer = error
                if behaviour == "none":
                    assert not calls, f"{where}: the provider function was called"
                run.check(step_key, answer, step["expect"], where)
            finals: dict[str, Any] = {}
            for step_key in scenario["final"]:
                try:
                    finals[run.key(step_key)] = await journal.get(run.key(step_key))
                except OperationNotFoundError as error:
                    finals[run.key(step_key)] = error

        def get(key: str) -> pb.Operation:
            found = finals[key]
            if isinstance(found, Exception):
                raise found
            return found

        run.check_final(get)

    asyncio.run(main())
