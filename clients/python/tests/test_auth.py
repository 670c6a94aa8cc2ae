"""Bearer tokens and namespaces through the Python client, against a server that requires
tokens (``tests/it/python_client.rs`` starts it knowing only ``OPJOURNAL_TEST_TOKEN``, a
``client`` of the namespace ``tenant-a``)."""

from __future__ import annotations

import os

import grpc
import pytest

from conftest import PAY_817, Sandbox
from opjournal_client import (
    JournalClient,
    PermissionDeniedError,
    ProviderCall,
    ProviderResult,
    Succeeded,
    UnauthenticatedError,
)

KEY = "py:auth:payment"


@pytest.fixture()
def token() -> str:
    return os.environ["OPJOURNAL_TEST_TOKEN"]


def test_a_call_without_a_token_is_unauthenticated(client: JournalClient) -> None:
    with pytest.raises(UnauthenticatedError) as refused:
        client.begin(KEY, "create_payment", PAY_817, namespace="tenant-a")
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.reason == "MISSING_CREDENTIALS"


def test_a_wrong_token_is_unauthenticated() -> None:
    with JournalClient.connect(os.environ["OPJOURNAL_TEST_SERVER"], token="tok-wrong.0000") as c:
        with pytest.raises(UnauthenticatedError) as refused:
            c.begin(KEY, "create_payment", PAY_817, namespace="tenant-a")
    assert refused.value.reason == "INVALID_CREDENTIALS"


def test_the_token_reaches_its_namespace_and_no_other(token: str, sandbox: Sandbox) -> None:
    provider_keys: list[str] = []

    def pay(call: ProviderCall) -> ProviderResult:
        provider_keys.append(call.provider_key)
        payment = sandbox.pay(call.provider_key, PAY_817)
        return ProviderResult(external_id=payment["id"], result=payment)

    with JournalClient.connect(os.environ["OPJOURNAL_TEST_SERVER"], token=token) as tenant_a:
        done = tenant_a.execute(KEY, "create_payment", PAY_817, pay, namespace="tenant-a")
        assert isinstance(done, Succeeded)
        assert done.operation.namespace == "tenant-a"
        assert provider_keys == [f"tenant-a/{KEY}"], "the provider key carries the namespace"

        with pytest.raises(PermissionDeniedError) as denied:
            tenant_a.execute(KEY, "create_payment", PAY_817, pay, namespace="tenant-b")
        assert denied.value.reason == "NAMESPACE_NOT_ALLOWED"
    assert len(provider_keys) == 1
