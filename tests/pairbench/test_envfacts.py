"""Tests for the fact registry: planted sources in, an allowlisted environment.json out."""

from __future__ import annotations

import json

from pairbench.core import artifacts
from pairbench.publish import envfacts

from sanitize_support import identity, planted_facts, planted_strings


def test_registry_is_complete_and_typed():
    keys = [f.key for f in envfacts.FACTS]
    assert len(keys) == len(set(keys))
    for f in envfacts.FACTS:
        assert f.type in ("str", "int", "list[str]", "list[gpu]") and f.description
    private = {f.key for f in envfacts.FACTS if not f.public}
    for must_be_private in ("hostname", "username", "home", "ip_addresses", "mac_addresses", "git_user_email",
                            "secret_env_values", "gpu_uuids", "gpu_pci_bus_ids", "gpu_serials"):
        assert must_be_private in private
    # environment.json's schema lists exactly the public facts (plus schema/inputs)
    schema = artifacts.load_schema("environment")
    assert set(schema["properties"]) == set(envfacts.PUBLIC_KEYS) | {"schema", "inputs"}


def test_collect_with_planted_sources():
    facts = planted_facts()
    assert set(facts) == set(envfacts.FACT_BY_KEY)
    assert facts["hostname"] == "zq-devbox-07" and facts["domain"] == "corp.zqexample.net"
    assert facts["username"] == "zq_alice" and facts["home"] == "/home/zq_alice"
    assert facts["git_user_email"] == "zq.alice@corp.zqexample.net"
    assert facts["ip_addresses"] == ["10.23.45.67", "192.168.178.42", "2001:db8:abcd:12::7", "fe80::3e22:fbff:fe4a:5e91"]
    assert facts["mac_addresses"] == ["3c:22:fb:4a:5e:91", "a4:83:e7:1d:2c:0b"]
    assert facts["secret_env_names"] == ["DB_PASSWORD", "HF_TOKEN", "ZQ_API_KEY"]
    assert facts["gpu_count"] == 2 and facts["gpu_driver_version"] == "550.54.15" and facts["cuda_version"] == "12.4"
    assert facts["gpu_pci_bus_ids"] == ["00000000:3B:00.0", "00000000:86:00.0"]


def test_public_is_an_allowlist_with_pseudonymous_gpus():
    facts = planted_facts(engine_version="pairbench-engine 0.1.0")
    body = envfacts.public(facts)
    artifacts.validate("environment", {**body, "schema": "pairbench.environment/v1"})
    assert body["gpus"] == [
        {"id": "gpu0", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * 1024 * 1024},
        {"id": "gpu1", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * 1024 * 1024},
    ]
    text = json.dumps(body)
    for planted in planted_strings():
        assert planted.lower() not in text.lower(), planted


def test_identifiers_by_category():
    ids = envfacts.identifiers(planted_facts())
    env = identity()["environ"]
    assert ids["secret"] == sorted([env["ZQ_API_KEY"], env["HF_TOKEN"], env["DB_PASSWORD"]])
    assert ids["username"] == ["zq_alice"] and ids["home"] == ["/home/zq_alice"]
    assert ids["fqdn"] == []  # host.domain: replaced part by part
    assert ids["gpu_uuid"] == ["GPU-0b9e8d7c-6a5f-4e3d-9c2b-1a0f9e8d7c6b", "GPU-5a1c2f3e-8b9d-4e6f-a0b1-c2d3e4f5a6b7"]
    assert ids["serial"] == ["1324020012345", "1324020067890"]
    assert ids["git_name"] == ["Zq Alice"]


def test_collectors_tolerate_missing_sources():
    facts = envfacts.collect(environ={}, run=lambda argv: None, if_addrs={}, torch=False,
                             gethostname=lambda: "", getfqdn=lambda: "")
    assert facts["gpus"] == [] and facts["gpu_count"] == 0 and facts["cuda_version"] is None
    assert facts["git_user_email"] is None and facts["secret_env_values"] == []
    assert facts["ip_addresses"] == [] and facts["mac_addresses"] == []
    body = envfacts.public(facts)
    artifacts.validate("environment", {**body, "schema": "pairbench.environment/v1"})


def test_gpu_collector_skips_unsupported_fields():
    out = "0, Tesla T4, 15360, 535.1, GPU-5a1c2f3e-8b9d-4e6f-a0b1-c2d3e4f5a6b7, 00000000:00:1E.0, [N/A]\n"
    facts = envfacts.collect_gpus(lambda argv: out if len(argv) > 1 else None)
    assert facts["gpu_serials"] == [] and facts["gpus"][0]["id"] == "gpu0" and facts["cuda_version"] is None


def test_secret_env_ignores_short_values_and_other_names():
    facts = envfacts.collect_secret_env({"MONKEY_BUSINESS": "bananas", "PAGER": "less", "GH_TOKEN": "1",
                                         "X_SECRET": "s3cr3t!", "TOKENIZERS_PARALLELISM": "false",
                                         "MAX_TOKENS": "100000", "API_KEY": "short"})
    assert facts["secret_env_names"] == ["API_KEY", "GH_TOKEN", "MAX_TOKENS", "MONKEY_BUSINESS",
                                         "TOKENIZERS_PARALLELISM", "X_SECRET"]
    # values become literals replaced everywhere: trivial ones ("false", numbers, < 6 chars) would wreck tables
    assert facts["secret_env_values"] == ["bananas", "s3cr3t!"]


def test_localhost_names_are_not_identifiers():
    facts = envfacts.collect_host(gethostname=lambda: "zq-box", getfqdn=lambda: "localhost")
    assert facts == {"hostname": "zq-box", "fqdn": None, "domain": None}
    facts = envfacts.collect_host(gethostname=lambda: "zq-box", getfqdn=lambda: "zq-box.localdomain")
    assert facts["domain"] is None and facts["fqdn"] == "zq-box.localdomain"


def test_environment_describes_the_measuring_node_with_the_publishing_jobs_software():
    node = planted_facts()  # the node that measured: the planted zq identity, with two H100s
    here = {**planted_facts(engine_version="pairbench-engine 0.2.0"), "hostname": "zq-login-01", "fqdn": None,
            "domain": None, "cpu_model": "ZQ Login CPU", "memory_total_bytes": 8 << 30, "gpu_count": 0, "gpus": [],
            "python_version": "3.12.1", "secret_env_values": ["zq-login-secret-7"]}
    stored = envfacts.node_facts(node)
    # what the measuring job writes under private/: machine facts and identifiers, no software, no secret
    assert "secret_env_values" not in stored and not envfacts.SOFTWARE_KEYS & set(stored)
    assert stored["hostname"] == "zq-devbox-07" and stored["gpu_count"] == 2
    assert json.loads(json.dumps(stored)) == stored
    body = envfacts.public(envfacts.on_node(here, stored))
    assert (body["cpu_model"], body["gpu_count"], body["python_version"], body["engine_version"]) == (
        node["cpu_model"], 2, "3.12.1", "pairbench-engine 0.2.0")
    assert body["memory_total_bytes"] == node["memory_total_bytes"]
    ids = envfacts.merged_identifiers(here, stored)
    assert ids["hostname"] == ["zq-devbox-07", "zq-login-01"]
    assert ids["secret"] == ["zq-login-secret-7"]  # the node's credentials were never stored
    assert ids["serial"] == ["1324020012345", "1324020067890"]
