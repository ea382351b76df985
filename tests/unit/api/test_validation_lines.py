"""`api.validation.validation_lines`: one line per pydantic problem of a file, shared by the
router's `--config` / `--slo-config` / `--config-json` and the router's API key file; a value
under a secret key (`keys`, `keySha256`) is never echoed, whichever spelling the file used."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from splitserve.api.validation import validation_lines


class _Tenant(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, validate_by_name=True, validate_by_alias=True
    )
    name: str = Field(pattern=r"^[a-z]+$")
    keys: tuple[str, ...] = ()
    key_sha256: tuple[str, ...] = ()
    port: int = 0


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenants: tuple[_Tenant, ...]


SECRET = frozenset({"keys", "keySha256", "key_sha256"})


def _error(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _File.model_validate(data)
    return info.value


def test_one_line_per_problem_naming_the_file_the_key_and_the_value() -> None:
    err = _error({"tenants": [{"name": "Bad!", "port": "x"}]})
    lines = validation_lines(Path("k.yaml"), err).splitlines()
    assert lines == [
        "k.yaml: tenants.0.name: String should match pattern '^[a-z]+$' (got 'Bad!')",
        "k.yaml: tenants.0.port: Input should be a valid integer, unable to parse string as an "
        "integer (got 'x')",
    ]


@pytest.mark.parametrize(
    "tenant",
    [
        {"name": "a", "keys": [12345678]},
        {"name": "a", "keys": 12345678},
        {"name": "a", "keySha256": 12345678},  # the file's spelling: the loc says keySha256
        {"name": "a", "keySha256": [12345678]},
        {"name": "a", "key_sha256": [12345678]},
    ],
)
def test_a_value_under_a_secret_key_is_never_echoed(tenant: dict[str, object]) -> None:
    text = validation_lines(Path("k.yaml"), _error({"tenants": [tenant]}), secret=SECRET)
    assert "tenants.0.key" in text
    assert "12345678" not in text


def test_only_plain_values_are_echoed() -> None:
    # a missing key's input is the whole mapping around it (with its secrets): not echoed
    text = validation_lines(Path("k.yaml"), _error({"tenants": [{"keys": ["sk-secret-1"]}]}))
    assert text == "k.yaml: tenants.0.name: Field required"
    assert "sk-secret" not in text


def test_prefix_and_names_say_the_key_as_the_file_writes_it() -> None:
    err = _error({"tenants": "x"})
    text = validation_lines(Path("f.yaml"), err, prefix="router.", names={"tenants": "tenantList"})
    assert text == "f.yaml: router.tenantList: Input should be a valid tuple (got 'x')"


def test_a_whole_model_problem_says_top_level() -> None:
    text = validation_lines(Path("f.yaml"), _error([1]))
    assert text.startswith("f.yaml: (top level): ")


def test_one_line_joins_the_problems_and_echoes_only_values_that_say_something() -> None:
    from splitserve.api.validation import one_line

    class Pool(BaseModel, extra="forbid"):
        replicas: int
        name: str

        @model_validator(mode="after")
        def _named(self) -> Pool:
            if self.name == "bad":
                raise ValueError("name 'bad' is taken")
            return self

    with pytest.raises(ValidationError) as bad:
        Pool.model_validate({"replicas": "many", "extra": 1})
    assert one_line(bad.value) == (
        "replicas='many': Input should be a valid integer, unable to parse string as an integer; "
        "name: Field required; extra: Extra inputs are not permitted"
    )
    with pytest.raises(ValidationError) as whole:
        Pool.model_validate({"replicas": 1, "name": "bad"})
    assert one_line(whole.value) == "name 'bad' is taken"  # no "Value error, ", no empty key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [\n", "not YAML (line 2): expected the node content, but found '<stream end>'"),
        ("a: b: c\n", "not YAML (line 1): mapping values are not allowed here"),
    ],
)
def test_yaml_problem_is_one_line_with_the_line(text: str, expected: str) -> None:
    import yaml

    from splitserve.api.validation import yaml_problem

    with pytest.raises(yaml.YAMLError) as err:
        yaml.safe_load(text)
    assert yaml_problem(err.value) == expected
