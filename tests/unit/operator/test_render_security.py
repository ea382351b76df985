"""Issue 19: what the operator renders for security (API-key Secret on the router)."""

from __future__ import annotations

import yaml

from splitserve.api.router import RouterFile
from splitserve.operator import render
from tests.unit.operator.test_render_pod import make_spec, objects, router_pod


def test_api_key_secret_is_mounted_and_named_in_router_yaml() -> None:
    spec = make_spec(router={"apiKeySecret": "llama-keys"})
    pod = router_pod(spec)
    assert {"name": "api-keys", "secret": {"secretName": "llama-keys"}} in pod["volumes"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "api-keys")
    assert mount == {"name": "api-keys", "mountPath": render.API_KEYS_PATH, "readOnly": True}
    # Not nested in the ConfigMap's (read-only) mount.
    assert not mount["mountPath"].startswith(render.ROUTER_CONFIG_PATH + "/")
    text = objects(spec)[("ConfigMap", "llama-router")]["data"][render.CONFIG_KEY]
    parsed, ignored = RouterFile.from_configmap(yaml.safe_load(text))
    assert ignored == ()
    config = parsed.router_config()
    assert config.auth.key_file == f"{render.API_KEYS_PATH}/{render.API_KEYS_KEY}"


def test_without_a_secret_the_router_yaml_has_no_auth() -> None:
    spec = make_spec()
    text = objects(spec)[("ConfigMap", "llama-router")]["data"][render.CONFIG_KEY]
    assert "auth" not in yaml.safe_load(text)
    assert all(v["name"] != "api-keys" for v in router_pod(spec)["volumes"])
