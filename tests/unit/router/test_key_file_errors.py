"""A key file with bad values: one line per problem naming the file and the key path; a key
in clear is never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.router.auth import load_key_file


def test_a_bad_value_is_one_line_per_problem_and_no_key_is_echoed(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(
        "tenants:\n"
        "  - name: 'bad name!'\n"
        "    keys: [sekrit-key-1]\n"
        "  - name: b\n"
        "    keys: 12345678\n"
    )
    with pytest.raises(ValueError, match="tenants") as info:
        load_key_file(path)
    text = str(info.value)
    assert "validation error" not in text
    assert "errors.pydantic.dev" not in text
    lines = text.splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines), text
    assert any("tenants.0.name" in line and "'bad name!'" in line for line in lines), text
    assert any("tenants.1.keys" in line for line in lines), text
    assert "sekrit-key-1" not in text
    assert "12345678" not in text


@pytest.mark.parametrize("digests", ["12345678", "[12345678]"])
def test_a_bad_digest_under_the_files_camel_case_spelling_is_not_echoed(
    tmp_path: Path, digests: str
) -> None:
    # the check looked for 'key_sha256' in the key path; pydantic names the file's spelling,
    # 'keySha256', so the digest was echoed ('(got 12345678)')
    path = tmp_path / "keys.yaml"
    path.write_text(f"tenants:\n  - name: a\n    keySha256: {digests}\n")
    with pytest.raises(ValueError, match="keySha256") as info:
        load_key_file(path)
    assert "12345678" not in str(info.value)


@pytest.mark.parametrize("field", ["key", "apiKey", "secret"])
def test_the_value_of_a_misspelled_field_is_not_echoed(tmp_path: Path, field: str) -> None:
    # `key: sk-...` (for `keys`) was echoed to stderr and, on a reload, into the router's log:
    # `tenants.0.key: Extra inputs are not permitted (got 'sk-leaky-secret1')`
    path = tmp_path / "keys.yaml"
    path.write_text(
        f"tenants:\n  - name: a\n    keys: [sk-good-key-1]\n    {field}: sk-leaky-secret1\n"
    )
    with pytest.raises(ValueError, match=f"tenants.0.{field}: Extra inputs") as info:
        load_key_file(path)
    assert "sk-leaky" not in str(info.value)


def test_a_key_that_is_not_visible_ascii_is_refused(tmp_path: Path) -> None:
    # it loaded, but could never authenticate: the header is read as latin-1, the key hashed
    # as UTF-8
    path = tmp_path / "keys.yaml"
    path.write_text('tenants:\n  - name: a\n    keys: ["sk-ключ-12345"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"keys: .*visible ASCII") as info:
        load_key_file(path)
    assert "ключ" not in str(info.value)


def test_a_bad_tenant_adds_no_line_saying_there_are_none(tmp_path: Path) -> None:
    # every error came with `tenants: Tuple should have at least 1 item after validation, not 0`
    path = tmp_path / "keys.yaml"
    path.write_text("tenants:\n  - name: a\n")
    with pytest.raises(ValueError, match="keys or keySha256") as info:
        load_key_file(path)
    assert len(str(info.value).splitlines()) == 1, info.value
    path.write_text("tenants: []\n")
    with pytest.raises(ValueError, match=r"tenants: .*at least one tenant"):
        load_key_file(path)
