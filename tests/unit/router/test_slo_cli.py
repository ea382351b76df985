"""`--slo-class`, `--slo-config`, `--placement-profile`, `--disaggregation` (router and up)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings
from splitserve.cli.main import cli
from splitserve.cli.slo_options import parse_slo_class, slo_args, slo_settings


def test_parse_slo_class() -> None:
    c = parse_slo_class("chat:ttftMs=300,tpotMs=40,priority=10,sheddable=true,allowOverrides=1")
    assert (c.name, c.ttft_ms, c.tpot_ms, c.priority, c.sheddable, c.allow_overrides) == (
        "chat",
        300,
        40,
        10,
        True,
        True,
    )
    with pytest.raises(click.BadParameter, match="key=value"):
        parse_slo_class("chat:ttftMs")
    with pytest.raises(click.BadParameter, match="ttftMs and tpotMs"):
        parse_slo_class("chat:ttftMs=300")


def test_settings_from_file_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "sloClasses": [{"name": "batch", "jobCompletionSeconds": 600, "sheddable": True}],
                "defaultSloClass": "batch",
                "router": {
                    "placementProfile": "tetriinfer",
                    "admissionQueueCapacity": 3,
                    "maxOutstandingPerWorker": 2,
                    "unfittedPrefillsPerWorker": 6,
                },
            }
        )
    )
    slo, placement = slo_settings(
        ["chat:ttftMs=300,tpotMs=40"], None, f, None, "Never", PlacementSettings()
    )
    assert slo is not None
    assert [c.name for c in slo.classes] == ["batch", "chat"]
    assert slo.default_class == "batch"
    assert slo.queue_capacity == 3
    assert slo.max_outstanding_per_worker == 2
    assert slo.unfitted_prefills_per_worker == 6
    assert placement.profile is v1.PlacementProfile.TETRIINFER
    assert placement.disaggregation is v1.Disaggregation.NEVER
    for off in (None, 0):  # null, or the CRD's 0: no cap before a fitted prefill rate
        f.write_text(yaml.safe_dump({"router": {"unfittedPrefillsPerWorker": off}}))
        slo, _ = slo_settings([], None, f, None, None, PlacementSettings())
        assert slo is not None
        assert slo.unfitted_prefills_per_worker is None, off
    none, same = slo_settings([], None, None, None, None, PlacementSettings())
    assert none is None
    assert same == PlacementSettings()
    f.write_text(yaml.safe_dump({"sloClassez": []}))
    with pytest.raises(click.BadParameter, match="unknown keys"):
        slo_settings([], None, f, None, None, PlacementSettings())
    with pytest.raises(click.BadParameter, match="default SLO class"):
        slo_settings(["chat:ttftMs=3,tpotMs=4"], "gold", None, None, None, PlacementSettings())


def test_up_passes_them_to_the_router() -> None:
    opts = {
        "slo_classes": ("a:ttftMs=1,tpotMs=2",),
        "default_slo_class": "a",
        "slo_config": None,
        "placement_profile": "aladdin",
        "disaggregation": None,
    }
    assert slo_args(opts) == [
        "--slo-class",
        "a:ttftMs=1,tpotMs=2",
        "--default-slo-class",
        "a",
        "--placement-profile",
        "aladdin",
    ]


def test_up_refuses_a_bad_class_before_starting_anything() -> None:
    result = CliRunner().invoke(cli, ["up", "--slo-class", "x:ttftMs=oops,tpotMs=1"])
    assert result.exit_code == 2
    assert "--slo-class" in result.output


@pytest.mark.parametrize(
    ("router", "field", "want"),
    [
        ({"admission": "false"}, "admission", False),  # bool("false") was True: ignored
        ({"admission": "no"}, "admission", False),
        ({"admission": False}, "admission", False),
        ({"maxOutstandingPerWorker": 3}, "max_outstanding_per_worker", 3),
        ({"unfittedPrefillsPerWorker": None}, "unfitted_prefills_per_worker", None),
    ],
)
def test_file_router_switches_are_read_as_written(
    tmp_path: Path, router: dict[str, object], field: str, want: object
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump({"router": router}))
    slo, _ = slo_settings([], None, f, None, None, PlacementSettings())
    assert slo is not None
    assert getattr(slo, field) == want


@pytest.mark.parametrize(
    ("router", "field"),
    [
        # the key as the file spells it (user20b: not the SloSettings field name)
        ({"admission": "maybe"}, r"router\.admission:"),  # bool("maybe") was True
        ({"maxOutstandingPerWorker": 2.7}, r"router\.maxOutstandingPerWorker:"),  # int(2.7) was 2
        ({"admissionQueueCapacity": 12.5}, r"router\.admissionQueueCapacity:"),
    ],
)
def test_file_router_values_that_cannot_be_read_are_refused(
    tmp_path: Path, router: dict[str, object], field: str
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump({"router": router}))
    with pytest.raises(click.BadParameter, match=field) as err:
        slo_settings([], None, f, None, None, PlacementSettings())
    assert err.value.param_hint == "--slo-class / --slo-config"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"router": "abc"}, r"router: must be a mapping of router settings, got str"),
        ({"router": [1, 2]}, r"router: must be a mapping of router settings, got list"),
        ({"sloClasses": 5}, r"sloClasses: must be a list of classes, got int"),
        # Empty values of the wrong type were taken as "none given" (`or []`), silently.
        ({"router": []}, r"router: must be a mapping of router settings, got list"),
        ({"router": 0}, r"router: must be a mapping of router settings, got int"),
        ({"router": ""}, r"router: must be a mapping of router settings, got str"),
        ({"sloClasses": {}}, r"sloClasses: must be a list of classes, got dict"),
        ({"sloClasses": ""}, r"sloClasses: must be a list of classes, got str"),
        ({"sloClasses": 0}, r"sloClasses: must be a list of classes, got int"),
        ({"router": {"placementProfile": "bogus"}}, r"router\.placementProfile: 'bogus' is not"),
        ({"router": {"disaggregation": "Often"}}, r"router\.disaggregation: 'Often' is not"),
        ({"router": {"lengthPredictor": None}}, r"router\.lengthPredictor: None is not one of"),
        # The file takes the CRD's 0 (no cap): -1 was refused as "greater than or equal to 1".
        (
            {"router": {"unfittedPrefillsPerWorker": -1}},
            r"router\.unfittedPrefillsPerWorker: must be >= 0 \(0 or null: no cap\), got -1",
        ),
    ],
)
def test_file_shapes_that_cannot_be_read_are_refused_naming_the_key(
    tmp_path: Path, data: dict[str, object], message: str
) -> None:
    """Each was a Python traceback (`dict('abc')`, iterating an int) or an enum's message that
    named no key."""
    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(click.BadParameter, match=message):
        slo_settings([], None, f, None, None, PlacementSettings())


def test_a_class_flag_refuses_name_and_repeated_keys() -> None:
    """`x:name=y,...` silently renamed the class y; `ttftMs=500,...,ttftMs=600` took 600."""
    with pytest.raises(click.BadParameter, match="the class's name is the part before ':'"):
        parse_slo_class("x:name=y,ttftMs=500,tpotMs=50")
    with pytest.raises(click.BadParameter, match="ttftMs given twice"):
        parse_slo_class("x:ttftMs=500,tpotMs=50,ttftMs=600")


def test_a_default_class_without_classes_names_the_implicit_one() -> None:
    with pytest.raises(click.BadParameter, match=r"is not one of \['default'\]"):
        slo_settings([], "nope", None, None, None, PlacementSettings())
    settings, _ = slo_settings([], "default", None, None, None, PlacementSettings())
    assert settings is not None
    assert settings.default_class == "default"


def test_an_infinite_target_is_refused_naming_the_key(tmp_path: Path) -> None:
    """`ttftMs=inf` (flag) or `ttftMs: .inf` (file) passed `gt=0` and stopped the router with a
    traceback from `SloPolicyClass` (`up`: after its workers had started)."""
    with pytest.raises(click.BadParameter, match=r"ttftMs='inf'"):
        parse_slo_class("a:ttftMs=inf,tpotMs=50")
    f = tmp_path / "slo.yaml"
    f.write_text("sloClasses:\n  - {name: a, ttftMs: 500, tpotMs: .inf}\n")
    finite = r"sloClasses\.0\.tpotMs: Input should be a finite"
    with pytest.raises(click.BadParameter, match=finite):
        slo_settings([], None, f, None, None, PlacementSettings())


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"router": {"admissionQueueCapacity": True}}, r"router\.admissionQueueCapacity"),
        ({"router": {"maxOutstandingPerWorker": True}}, r"router\.maxOutstandingPerWorker"),
        ({"router": {"unfittedPrefillsPerWorker": True}}, r"router\.unfittedPrefillsPerWorker"),
        ({"sloClasses": [{"name": "a", "ttftMs": True, "tpotMs": 50}]}, r"sloClasses\.0\.ttftMs"),
        (
            {"sloClasses": [{"name": "a", "ttftMs": 9, "tpotMs": 5, "priority": True}]},
            r"sloClasses\.0\.priority",
        ),
    ],
)
def test_a_boolean_where_a_number_is_wanted_is_refused(
    tmp_path: Path, data: dict[str, object], key: str
) -> None:
    """`admissionQueueCapacity: true` was a queue of 1, `ttftMs: true` a 1 ms target."""
    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(click.BadParameter, match=key + r": .*not a boolean"):
        slo_settings([], None, f, None, None, PlacementSettings())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sloClasses: []\nrouter: {}\nsloClasses: [{name: a, ttftMs: 5, tpotMs: 5}]\n",
            r"line 3: sloClasses given twice",
        ),
        (
            "sloClasses:\n  - name: a\n    ttftMs: 500\n    tpotMs: 50\n    ttftMs: 5\n",
            r"line 5: ttftMs given twice",
        ),
    ],
)
def test_a_key_given_twice_in_the_file_is_refused(tmp_path: Path, text: str, message: str) -> None:
    """YAML's last value won silently (the first list of classes, or the first target, lost)."""
    f = tmp_path / "slo.yaml"
    f.write_text(text)
    with pytest.raises(click.BadParameter, match=message):
        slo_settings([], None, f, None, None, PlacementSettings())


def test_a_class_declared_twice_is_named(tmp_path: Path) -> None:
    """Was "(top level): Value error, slo classes: names must be unique": which one?"""
    f = tmp_path / "slo.yaml"
    f.write_text("sloClasses: [{name: chat, ttftMs: 500, tpotMs: 50}]\n")
    with pytest.raises(click.BadParameter) as err:
        slo_settings(["chat:ttftMs=100,tpotMs=10"], None, f, None, None, PlacementSettings())
    message = err.value.format_message()
    assert "SLO class 'chat' declared twice" in message
    assert "Value error" not in message  # pydantic's wording, as `one_line` drops it
