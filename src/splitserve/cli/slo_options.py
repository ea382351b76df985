"""SLO options shared by `splitserve router serve` and `splitserve up`.

`--slo-class NAME:key=value,...` declares one class with the `LLMService` CRD's keys
(`ttftMs`, `tpotMs`, `percentile`, `attainment`, `priority`, `sheddable`,
`jobCompletionSeconds`, `allowOverrides`), e.g. `--slo-class chat:ttftMs=300,tpotMs=40,priority=10`.
`--slo-config FILE` reads the same things as YAML, shaped like an `LLMService` spec:
`sloClasses: [...]`, `defaultSloClass: NAME`, and optionally
`router: {placementProfile, disaggregation, lengthPredictor, admissionQueueCapacity,
admission, maxOutstandingPerWorker, unfittedPrefillsPerWorker}` (`admission: false` dispatches
every request at once: the wave-1 router; `maxOutstandingPerWorker` caps the requests in flight
per decode-capable worker before admission queues; `unfittedPrefillsPerWorker`, default 4, caps
those per prefill-side worker while no prefill rate is fitted, null or 0 as in the CRD: no cap).
Classes given as flags come after the file's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings, SloSettings
from splitserve.api.validation import one_line, utf8_problem, validation_lines, yaml_problem

F = TypeVar("F", bound=Callable[..., Any])

_FILE_KEYS = {  # SloSettings' fields -> the keys of --slo-config that set them
    "classes": "sloClasses",
    "default_class": "defaultSloClass",
    "length_predictor": "router.lengthPredictor",
    "queue_capacity": "router.admissionQueueCapacity",
    "admission": "router.admission",
    "max_outstanding_per_worker": "router.maxOutstandingPerWorker",
    "unfitted_prefills_per_worker": "router.unfittedPrefillsPerWorker",
}
_BOOL = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def parse_slo_class(text: str) -> v1.SloClassSpec:
    """`NAME:key=value,...` -> a validated class. Raises `click.BadParameter` naming the flag."""
    name, _, rest = text.partition(":")
    values: dict[str, Any] = {"name": name}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise click.BadParameter(f"{item!r}: expected key=value", param_hint="--slo-class")
        key = key.strip()
        if key == "name":  # was: silently replaced NAME
            raise click.BadParameter(
                f"{text!r}: the class's name is the part before ':', not a key",
                param_hint="--slo-class",
            )
        if key in values:  # was: the last value silently won
            raise click.BadParameter(f"{text!r}: {key} given twice", param_hint="--slo-class")
        values[key] = (
            _BOOL.get(value.lower(), value) if key in ("sheddable", "allowOverrides") else value
        )
    try:
        return v1.SloClassSpec.model_validate(values)
    except ValidationError as err:
        raise click.BadParameter(one_line(err), param_hint="--slo-class") from None


def slo_options(f: F) -> F:
    """The SLO flags, as click options."""
    for opt in reversed(
        [
            click.option(
                "--slo-class",
                "slo_classes",
                multiple=True,
                help="An SLO class, NAME:ttftMs=..,tpotMs=..,priority=..,sheddable=true "
                "(repeatable; the CRD's keys).",
            ),
            click.option("--default-slo-class", default=None, help="Class of unlabelled requests."),
            click.option(
                "--slo-config",
                type=click.Path(path_type=Path, exists=True, dir_okay=False),
                default=None,
                help="YAML with sloClasses, defaultSloClass and router settings (as in a CRD).",
            ),
            click.option(
                "--placement-profile",
                type=click.Choice([p.value for p in v1.PlacementProfile]),
                default=None,
                help="Placement profile (default: default).",
            ),
            click.option(
                "--disaggregation",
                type=click.Choice([d.value for d in v1.Disaggregation]),
                default=None,
                help="When to split prefill and decode (default: Auto).",
            ),
        ]
    ):
        f = opt(f)
    return f


def slo_args(opts: dict[str, Any]) -> list[str]:
    """The same options as command-line arguments (for `up` to pass to the router)."""
    args: list[str] = []
    for c in opts.get("slo_classes") or ():
        args += ["--slo-class", c]
    for flag, key in (
        ("--default-slo-class", "default_slo_class"),
        ("--slo-config", "slo_config"),
        ("--placement-profile", "placement_profile"),
        ("--disaggregation", "disaggregation"),
    ):
        if opts.get(key) is not None:
            args += [flag, str(opts[key])]
    return args


class _KeyGivenTwice(yaml.YAMLError):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(f"line {line}: {key} given twice (YAML keeps only the last)")


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a mapping key given twice (safe_load keeps the last value:
    a file's first `sloClasses:`, or a class's first `ttftMs:`, was lost without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):  # (an unhashable key is yaml's own error below)
                continue
            if key in seen:
                raise _KeyGivenTwice(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, flag: str) -> Any:
    """A YAML file's content; one that is not UTF-8 text or not YAML, or that gives a key twice
    in one mapping, is a usage error naming `flag`, the file and the line (it was yaml's or the
    codec's traceback; a repeated key's last value won)."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as err:
        raise click.BadParameter(f"{path}: {utf8_problem(err)}", param_hint=flag) from None
    except _KeyGivenTwice as err:
        raise click.BadParameter(f"{path}: {err}", param_hint=flag) from None
    except yaml.YAMLError as err:
        raise click.BadParameter(f"{path}: {yaml_problem(err)}", param_hint=flag) from None


def slo_settings(
    slo_classes: Sequence[str],
    default_slo_class: str | None,
    slo_config: Path | None,
    placement_profile: str | None,
    disaggregation: str | None,
    placement: PlacementSettings,
    base: SloSettings | None = None,
) -> tuple[SloSettings | None, PlacementSettings]:
    """(SLO settings or None when no SLO option was given, placement settings).

    `base`: the settings the options override (`router serve --config`'s): the options replace
    what they set (classes given replace its classes; a default class alone picks one of them)
    and it keeps the rest. None: the defaults."""
    file: dict[str, Any] = {}
    if slo_config is not None:
        data = read_yaml(slo_config, "--slo-config")
        if not isinstance(data, dict):
            raise click.BadParameter(f"{slo_config}: not a YAML mapping", param_hint="--slo-config")
        unknown = set(data) - {"sloClasses", "defaultSloClass", "router"}
        if unknown:
            raise click.BadParameter(
                f"{slo_config}: unknown keys {sorted(unknown)}", param_hint="--slo-config"
            )
        file = data
    router_value = file.get("router")  # `router:` with no value: none (`[]`, `0`: refused)
    router_value = {} if router_value is None else router_value
    if not isinstance(router_value, dict):  # was dict("abc")'s traceback
        raise click.BadParameter(
            f"{slo_config}: router: must be a mapping of router settings, got "
            f"{type(router_value).__name__}",
            param_hint="--slo-config",
        )
    router = dict(router_value)
    file_classes = file.get("sloClasses")
    file_classes = [] if file_classes is None else file_classes
    if not isinstance(file_classes, list):  # was iterating an int
        raise click.BadParameter(
            f"{slo_config}: sloClasses: must be a list of classes, got "
            f"{type(file_classes).__name__}",
            param_hint="--slo-config",
        )
    unknown_router = set(router) - {
        "placementProfile",
        "disaggregation",
        "lengthPredictor",
        "admissionQueueCapacity",
        "admission",
        "maxOutstandingPerWorker",
        "unfittedPrefillsPerWorker",
    }
    if unknown_router:
        raise click.BadParameter(
            f"{slo_config}: unknown router keys {sorted(unknown_router)}",
            param_hint="--slo-config",
        )
    gate_keys = {"admissionQueueCapacity", "maxOutstandingPerWorker", "unfittedPrefillsPerWorker"}
    if router.get("admission") is False and (inert := sorted(gate_keys & set(router))):
        raise click.BadParameter(  # the gate is off: they were accepted and never applied
            f"{slo_config}: router: {', '.join(inert)} set the admission gate, which "
            "`admission: false` turns off; drop one or the other",
            param_hint="--slo-config",
        )
    classes = []
    for i, c in enumerate(file_classes):
        try:
            classes.append(v1.SloClassSpec.model_validate(c))
        except ValidationError as err:  # one line per problem (was pydantic's block)
            assert slo_config is not None
            why = validation_lines(slo_config, err, f"sloClasses.{i}.")
            raise click.BadParameter(why, param_hint="--slo-config") from None
    try:
        classes += [parse_slo_class(c) for c in slo_classes]
        update: dict[str, Any] = {}
        if placement_profile:
            update["profile"] = v1.PlacementProfile(placement_profile)
        elif "placementProfile" in router:
            update["profile"] = _file_enum(v1.PlacementProfile, router, "placementProfile")
        if disaggregation:
            update["disaggregation"] = v1.Disaggregation(disaggregation)
        elif "disaggregation" in router:
            update["disaggregation"] = _file_enum(v1.Disaggregation, router, "disaggregation")
        placement = placement.model_copy(update=update)
        default = default_slo_class or file.get("defaultSloClass")
        if not classes and default is None and not router:
            return None, placement
        # The file's values go to SloSettings as written, so pydantic refuses what it cannot
        # read ("maybe", 2.7) instead of bool() / int() turning "false" into True or 2.7 into 2.
        slo: dict[str, Any] = {}
        if base is not None:  # was dropped: --slo-class reset the file's queue capacity, ...
            slo = {name: getattr(base, name) for name in SloSettings.model_fields}
        if classes or base is None:
            slo["classes"], slo["default_class"] = tuple(classes), default
        elif default is not None:  # one of the base's classes
            slo["default_class"] = default
        if "lengthPredictor" in router:
            slo["length_predictor"] = _file_enum(v1.LengthPredictor, router, "lengthPredictor")
        if "admissionQueueCapacity" in router:
            slo["queue_capacity"] = router["admissionQueueCapacity"]
        if "admission" in router:  # local switch (benchmarks): false = the wave-1 router
            slo["admission"] = router["admission"]
        if "maxOutstandingPerWorker" in router:
            slo["max_outstanding_per_worker"] = router["maxOutstandingPerWorker"]
        if "unfittedPrefillsPerWorker" in router:  # null or 0 (the CRD's): no cap before a fit
            n = router["unfittedPrefillsPerWorker"]
            zero = type(n) is int and n == 0  # not False: a bool is refused as written
            if type(n) is int and n < 0:
                raise ValueError(
                    f"router.unfittedPrefillsPerWorker: must be >= 0 (0 or null: no cap), got {n}"
                )
            slo["unfitted_prefills_per_worker"] = None if n is None or zero else n
        return SloSettings(**slo), placement
    except ValidationError as err:  # one line per problem (was pydantic's block)
        if slo_config is not None:
            why = validation_lines(slo_config, err, names=_FILE_KEYS)
        else:
            why = one_line(err)
        raise click.BadParameter(why, param_hint="--slo-class / --slo-config") from None
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--slo-class / --slo-config") from err


_E = TypeVar("_E", bound=enum.Enum)


def _file_enum(kind: type[_E], router: dict[str, Any], key: str) -> _E:
    """`router[key]` as `kind`; a value it does not have is a 400-like usage error naming
    `router.<key>` and the values it may take (was "'bogus' is not a valid PlacementProfile")."""
    value = router[key]
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(str(m.value) for m in kind)
        raise click.BadParameter(
            f"router.{key}: {value!r} is not one of {known}", param_hint="--slo-config"
        ) from None
