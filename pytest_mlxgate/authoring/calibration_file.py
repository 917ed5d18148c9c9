"""A gate module's calibration as data: `<module dir>/calibration/<module stem>.json` (its check of the
module's limits: `authoring.calibration_check`).

`--mlx-calibrate` writes the file (`authoring.calibration_run`, in the worker that measured): the model,
the machine and versions, the code commit, the A/A floor, the lever's drift with its intervals, the
known-bad variant's (where the module declares `KNOWN_BAD`), speed and memory, and two digests that
say what it was measured on. `--mlx-aa` and a fast test read it back (`module_findings`) and check
the gate's limits, as its source declares them, against it by `calibrate.CHECK_RULE` (the rule
`suggest_limits` sizes by, with half its room): a limit the file shows wrong is a problem; a file
measured on other serving code, another lever or other sizes is stale, which says so and names
the command that refreshes it.

The serving code digest is `authoring.serving_code`'s. Only the standard library.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..common.atomic import atomic_write_bytes
from ..common.gate_calls import NOT_LITERAL, DeclaredLimit, call_name, declared_limits, literal
from ..config.names import BUILT_MODELS, DEFAULT_CANDIDATE, model_keys
from ..verdicts.calibration import AGREEMENT_METRICS
from .serving_code import assigned_name, source_digest

__all__ = [
    "CALIBRATION_DIR",
    "FORMAT",
    "GateSource",
    "Limit",
    "calibration_model",
    "calibration_path",
    "compact_drift",
    "read_calibration",
    "render",
    "schema_problems",
    "unusable",
    "write_calibration",
]

#: Bump when a field's meaning changes: a file of another format is stale.
FORMAT = 1
CALIBRATION_DIR = "calibration"
#: The metrics a drift table holds, as `assert_kl_below` names them.
KL_KEYS = ("mean", "median", "p90", "p95", "p99", "p999", "max", "ln_ppl", "top1", "same_top")
#: `assert_kl_below`'s keywords that are no limit a calibration sizes: the oracle's rule and its absolute term.
ORACLE_KEYS = ("relative", "relative_atol")
#: The assertions whose keyword arguments are a gate's limits.
KL_ASSERTION = "assert_kl_below"
SPEED_ASSERTIONS = frozenset({"assert_faster", "assert_smaller"})
#: The top-level order of a calibration file (everything nested is sorted): what, on what, then the figures.
_FIELDS = (
    "calibration_format",
    "module",
    "command",
    "measured_at",
    "code",
    "serving_code",
    "gate",
    "model",
    "machine",
    "versions",
    "lever",
    "shape",
    "aa_floor",
    "drift",
    "known_bad",
    "speed",
    "limits",
    "suggested",
    "check_rule",
)


# -- what a gate module declares --------------------------------------------------------------------


#: One limit a gate's source declares (`common.gate_calls`).
Limit = DeclaredLimit


@dataclass
class GateSource:
    """What a gate module's source declares, read without importing it."""

    path: Path
    limits: list[Limit]
    not_literal: list[str]  # limits given as expressions, which the check cannot read
    declares_known_bad: bool
    known_bad: object  # its literal value (None where not declared or not a literal)
    digest: dict[str, Any]  # the lever, sizes and known-bad as declared, and the local modules it imports

    @classmethod
    def read(cls, path: Path) -> GateSource:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
        limits, not_literal = declared_limits(tree, {KL_ASSERTION, *SPEED_ASSERTIONS})
        # the float32 oracle's rules (`relative=`) are judged against the oracle at every run, not against a file
        limits = [lim for lim in limits if not (lim.assertion == KL_ASSERTION and lim.key in ORACLE_KEYS)]
        declared: dict[str, str] = {}
        known_bad: object = None
        declares_known_bad = False
        for stmt in tree.body:
            target = assigned_name(stmt)
            if target in ("pytestmark", "KNOWN_BAD"):
                declared[target] = ast.dump(stmt)
            if target == "KNOWN_BAD" and isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                value = literal(stmt.value)  # not a literal: a whole lever, pytest.mark.mlx_lever(...)
                declares_known_bad = value is not None
                known_bad = None if value is NOT_LITERAL else value
        names = _imported(tree) + [name.partition(":")[0].partition(".")[0] for name in _known_bad_objects(tree)]
        local = {
            f"{name}.py": source_digest(path.parent / f"{name}.py")
            for name in sorted(set(names))
            if (path.parent / f"{name}.py").is_file()
        }
        parts = {**{k: hashlib.sha256(v.encode()).hexdigest() for k, v in declared.items()}, **local}
        whole = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return cls(path, limits, not_literal, declares_known_bad, known_bad, {"digest": whole, "parts": parts})

    def limits_of(self, test: str | None = None, *, kl: bool | None = None, model: str | None = None) -> list[Limit]:
        """The limits of one test (all of them: None), KL ones only (True) or speed ones only (False),
        on `model` (a per-model calibration's name; None: the embedded model's, the gate's own): the
        gate's, each replaced by the one `models={model: ...}` gives for the same test and key."""
        chosen = [
            lim
            for lim in self.limits
            if (test is None or lim.test == test) and (kl is None or (lim.assertion == KL_ASSERTION) == kl)
        ]
        own = {(lim.test, lim.assertion, lim.key): lim for lim in chosen if model is not None and lim.model == model}
        base = [lim for lim in chosen if lim.model is None]
        replaced = [own.pop((lim.test, lim.assertion, lim.key), lim) for lim in base]
        return replaced + list(own.values())


def _known_bad_objects(tree: ast.Module) -> list[str]:
    """The `module:attr` names KNOWN_BAD declares (a value "mymod:broken", or a whole lever's cand=, ref=
    and context=): the known-bad kernel's own file is part of what the calibration measured."""
    texts: list[object] = []
    for stmt in tree.body:
        if (
            assigned_name(stmt) != "KNOWN_BAD"
            or not isinstance(stmt, (ast.Assign, ast.AnnAssign))
            or stmt.value is None
        ):
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and call_name(value) == "mlx_lever":
            texts.extend(literal(k.value) for k in value.keywords if k.arg in ("cand", "ref", "context", "patch"))
        else:
            texts.append(literal(value))
    return [t for t in texts if isinstance(t, str) and ":" in t]


def _imported(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            names.extend(alias.name.partition(".")[0] for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
            names.append(stmt.module.partition(".")[0])
    return sorted(set(names))


# -- the file ---------------------------------------------------------------------------------------


def calibration_path(module: Path, model: str | None = None, dtype: str | None = None) -> Path:
    """Where a gate module's calibration lives: beside it, in `calibration/<stem>.json` for the embedded
    model, `calibration/<model>/<stem>.json` for another (`calibration_model`); measured in another precision
    than float32, `<stem>.<dtype>.json` beside it, so a bfloat16 calibration never replaces the float32 one."""
    folder = module.parent / CALIBRATION_DIR
    precision = f".{dtype}" if dtype and dtype != "float32" else ""
    return (folder / model if model else folder) / f"{module.stem}{precision}.json"


def calibration_model(name: str | None, repo_id: str | None) -> str | None:
    """The per-model calibration a candidate's measurement belongs to: None for the embedded default
    (and a local directory, which names no model), a built-in's alias (`gemma3-270m`), else the repo id
    as a folder name (`org--name`). So a calibration on one model never replaces another's."""
    keys = model_keys(name, repo_id)
    built = [k for k in keys if k in BUILT_MODELS]
    if built:
        return None if built[0] == DEFAULT_CANDIDATE else built[0]
    return repo_id.replace("/", "--") if repo_id else None


def calibration_candidate(model: str) -> str:
    """The `--mlx-candidate` that measures `model`'s calibration (`calibration_model`'s inverse): a
    built-in's alias, else the repo id its folder name stands for (the hub allows no "--" in a repo id)."""
    return model if model in BUILT_MODELS else model.replace("--", "/", 1)


def compact_drift(stats: Mapping[str, Any]) -> dict[str, Any]:
    """A KL statistics record (`KLStats.to_json()`) as the file's table: each metric's value and the two
    ends of its 95% interval (None where there is none; `max` is observed, so both ends are it)."""
    table: dict[str, Any] = {}
    for key in KL_KEYS:
        if key == "mean":
            value, interval = stats.get("mean"), stats.get("mean_ci")
        elif key == "max":
            value = stats.get("max")
            interval = [value, value]
        elif key == "ln_ppl":
            value, interval = stats.get("ln_ppl_ratio"), stats.get("ln_ppl_ratio_ci")
        elif key in AGREEMENT_METRICS:
            value, interval = stats.get(key), stats.get(f"{key}_ci")
        else:
            value, interval = stats.get(key), (stats.get("quantile_ci") or {}).get(key)
        lower, upper = (list(interval) + [None, None])[:2] if isinstance(interval, (list, tuple)) else (None, None)
        if value is None and lower is None and upper is None:
            continue
        table[key] = {"value": _finite(value), "lower": _finite(lower), "upper": _finite(upper)}
    return {"n_prompts": stats.get("n_prompts"), "n_tokens": stats.get("n_tokens"), "metrics": table}


def _finite(x: object) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN: a missing figure
    return value


def render(doc: Mapping[str, Any]) -> bytes:
    """The file's bytes: top-level fields in `_FIELDS` order, everything nested sorted, so one
    calibration always writes the same bytes and a diff shows only what was re-measured."""
    ordered = {k: _sorted(doc[k]) for k in _FIELDS if k in doc}
    ordered.update({k: _sorted(doc[k]) for k in sorted(doc) if k not in ordered})
    return (json.dumps(ordered, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()


def unusable(doc: Mapping[str, Any]) -> str | None:
    """Why a measurement must not replace a calibration file (None: it may): no interval for the
    lever's mean KL (too few prompts), or no A/A floor."""
    metrics = (doc.get("drift") or {}).get("metrics") or {}
    mean = metrics.get("mean") or {}
    if mean.get("upper") is None or mean.get("lower") is None:
        return "the lever's mean KL has no 95% interval (too few prompts): nothing to check a limit against"
    if not doc.get("aa_floor"):
        return "no A/A floor was measured"
    return None


def write_calibration(path: Path, doc: Mapping[str, Any]) -> None:
    """Write `doc` at `path` atomically (a reader sees the old file or the new one); ValueError, and
    the file on disk untouched, when the measurement is `unusable`."""
    why = unusable(doc)
    if why is not None:
        raise ValueError(why)
    data = render(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)


def read_calibration(path: Path) -> dict[str, Any] | None:
    """The calibration at `path`; None where there is none; ValueError naming the file when it is not
    a calibration this code reads."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}); calibrate again to rewrite it") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("calibration_format"), int):
        raise ValueError(f"{path}: not a calibration file (no calibration_format); calibrate again to rewrite it")
    wrong = schema_problems(doc)
    if wrong:
        raise ValueError(
            f"{path}: not a calibration this code can trust ({'; '.join(wrong)}); calibrate again to rewrite it"
        )
    return doc


def schema_problems(doc: Mapping[str, Any]) -> list[str]:
    """What in a calibration document is not what `--mlx-calibrate` writes, each field named: a format newer
    than this code, figures that are not finite numbers or sit outside their range (KL >= 0, agreement rates
    in [0, 1], an interval's lower end at or below its upper), parts of the wrong type. Empty: it reads."""
    out: list[str] = []
    fmt = doc.get("calibration_format")
    if isinstance(fmt, int) and fmt > FORMAT:
        out.append(f"calibration_format {fmt} is newer than this code's {FORMAT}: run the mlxgate that wrote it")
    for name in ("model", "machine", "aa_floor", "drift", "known_bad", "speed", "suggested"):
        if name in doc and doc[name] is not None and not isinstance(doc[name], Mapping):
            out.append(f"{name} is {type(doc[name]).__name__}, not an object")
    model = doc.get("model")
    if isinstance(model, Mapping):
        for key in ("name", "commit"):
            if model.get(key) is not None and not isinstance(model.get(key), str):
                out.append(f"model.{key} is not text")
    floors = doc.get("aa_floor")
    if isinstance(floors, Mapping):
        for key, value in floors.items():
            if key != "chunk" and key in KL_KEYS:
                out.extend(_figure_problems(f"aa_floor.{key}", key, value))
    known_bad = doc.get("known_bad")
    bad_drift = known_bad.get("drift") if isinstance(known_bad, Mapping) else None
    for where, drift in (("drift", doc.get("drift")), ("known_bad.drift", bad_drift)):
        if drift is None:
            continue
        if not isinstance(drift, Mapping) or not isinstance(drift.get("metrics", {}), Mapping):
            out.append(f"{where} is not an object of metrics")
            continue
        for key, row in (drift.get("metrics") or {}).items():
            if not isinstance(row, Mapping):
                out.append(f"{where}.metrics.{key} is {type(row).__name__}, not {{value, lower, upper}}")
                continue
            for end in ("value", "lower", "upper"):
                out.extend(_figure_problems(f"{where}.metrics.{key}.{end}", str(key), row.get(end)))
            lo, hi = row.get("lower"), row.get("upper")
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
                out.append(f"{where}.metrics.{key}: lower {lo} > upper {hi}")
    speed = doc.get("speed")
    contexts = speed.get("contexts") if isinstance(speed, Mapping) else None
    if isinstance(contexts, Mapping):
        for ctx, row in contexts.items():
            if not str(ctx).isdigit():
                out.append(f"speed.contexts key {ctx!r} is not a context length in tokens")
            for key, est in row.items() if isinstance(row, Mapping) else ():
                if isinstance(est, Mapping) and est.get("ratio") is not None and not _is_number(est.get("ratio")):
                    out.append(f"speed.contexts.{ctx}.{key}.ratio {est.get('ratio')!r} is not a number")
    return out


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _figure_problems(where: str, key: str, value: object) -> list[str]:
    """A figure of metric `key` (None: none measured) that is no finite number in its range."""
    if value is None:
        return []
    if not _is_number(value):
        return [f"{where} {value!r} is not a finite number"]
    assert isinstance(value, (int, float))
    if key in AGREEMENT_METRICS and not 0 <= value <= 1:
        return [f"{where} {value} is an agreement rate outside [0, 1]"]
    if key not in AGREEMENT_METRICS and key != "ln_ppl" and value < 0:
        return [f"{where} {value} is a KL below 0"]
    return []


def machine_versions(machine: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(machine, versions) as the file holds them, from a run's machine facts."""
    versions = {
        "mlx": machine.get("mlx", "unknown"),
        "mlx_lm": machine.get("mlx-lm", machine.get("mlx_lm", "unknown")),
        "python": platform.python_version(),
    }
    try:
        versions["pytest_mlxgate"] = version("pytest-mlxgate")
    except PackageNotFoundError:
        versions["pytest_mlxgate"] = "unknown"
    facts = {key: machine.get(key, "unknown") for key in ("device", "blas", "chip", "tf32")}
    return ({**facts, **versions}, versions)
