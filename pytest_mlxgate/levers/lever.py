"""Levers: a named switch with a reference value and a candidate value, applied around a forward.

A gate module declares one lever in a marker; both arms run the same model on the same tokens and
differ only by the lever, so their KL divergence is the lever's drift::

    pytestmark = pytest.mark.mlx_lever("perf_kernel", env="MLX_BUN_PERF_KERNEL", ref="0", cand="1")
    pytestmark = pytest.mark.mlx_lever("attention", patch="mlx.core.fast.scaled_dot_product_attention",
                                       ref="pytest_mlxgate.reference_ops:scaled_dot_product_attention",
                                       cand=None)
    pytestmark = pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8})
    pytestmark = pytest.mark.mlx_lever("model")   # --mlx-reference model vs the candidate model
    pytestmark = pytest.mark.mlx_lever("flag", context=factory, ref=0, cand=1)  # factory(value) -> CM

Kinds: `env` sets (None: unsets) an environment variable; `patch` replaces an attribute (None:
leaves the original); `kv` chooses a KV cache plan (`pytest_mlxgate.serving.kv_plan`), serving path only;
`context` enters `factory(value)`; `model` compares two models. `--mlx-lever NAME --mlx-ref-value V
--mlx-cand-value V` overrides the values or defines a lever from the command line
(`lever_from_options`).

Built from markers and options in `parsing`; applied with `patching`; named for reports and the
reference cache by `naming`. Imported while pytest collects: no mlx or mlx_lm at import time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import LeverError, VacuousLeverError
from ..serving.kv_plan import PLAIN, KVPlan, parse_kv_value
from .naming import canonical, object_name, source_digest
from .patching import counted, env_set, patched, resolve_object
from .weights import WeightsSpec, parse_weights_value

__all__ = [
    "ARMS",
    "LEVER_KINDS",
    "LEVER_PATHS",
    "Arm",
    "Lever",
    "LeverKind",
    "LeverPath",
]

Arm = Literal["reference", "candidate"]
LeverKind = Literal["env", "patch", "kv", "model", "context", "weights"]
LeverPath = Literal["prefill", "serving"]

ARMS: tuple[Arm, ...] = get_args(Arm)
LEVER_KINDS: tuple[LeverKind, ...] = get_args(LeverKind)
LEVER_PATHS: tuple[LeverPath, ...] = get_args(LeverPath)

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


#: What `snapshot_plan=` may name: a file in a snapshot's top folder (no path, not hidden).
_PLAN_FILE = re.compile(r"[\w-][\w.-]*\.json")


@dataclass(frozen=True)
class Lever:
    """One lever: what it switches (`kind`, `target`), its two values, and the path it runs on."""

    name: str
    kind: LeverKind
    target: str | None  # env var name, dotted patch target, context factory name; None for kv/model
    ref: object  # the reference value (normalized: "unset"/"original" become None)
    cand: object
    path: LeverPath = "prefill"
    factory: Callable[[Any], AbstractContextManager[Any]] | None = None  # kind == "context"
    snapshot_plan: str | None = None  # kind == "kv": a file the candidate snapshot may ship; it then is `cand`

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise LeverError(f"lever name {self.name!r} must be a non-empty string; name what the lever switches")
        if self.kind not in LEVER_KINDS:
            raise LeverError(f"lever {self.name!r}: kind {self.kind!r} is not one of {list(LEVER_KINDS)}")
        if self.path not in LEVER_PATHS:
            raise LeverError(
                f"lever {self.name!r}: path={self.path!r} is not one of {list(LEVER_PATHS)}; use 'prefill' "
                "(one teacher-forced forward) or 'serving' (prefill then one-token decode through the KV cache)"
            )
        if self.kind == "kv" and self.path != "serving":
            raise LeverError(
                f"lever {self.name!r} is a KV lever on path='prefill': a teacher-forced prefill never reads "
                "a KV cache back, so both arms would be identical; drop path= or use path='serving'"
            )
        if self.kind in ("env", "patch", "context") and self.target is None and self.factory is None:
            raise LeverError(f"lever {self.name!r} ({self.kind}) needs a target; say what it switches")
        if self.snapshot_plan is not None:
            name = self.snapshot_plan
            if self.kind != "kv":
                raise LeverError(
                    f"lever {self.name!r}: snapshot_plan= names a KV plan a snapshot ships; it applies to kv=True "
                    f"levers only (this one is {self.kind})"
                )
            if not isinstance(name, str) or not _PLAN_FILE.fullmatch(name):
                raise LeverError(
                    f"lever {self.name!r}: snapshot_plan={name!r} must be the file name of a kv_config in the "
                    "snapshot's top folder, e.g. 'kv_config.json'"
                )

    def value(self, arm: Arm) -> object:
        """The value this lever takes on `arm`."""
        return self.ref if _check_arm(arm) == "reference" else self.cand

    def describe_value(self, arm: Arm) -> str:
        """Short human text for one arm's value: `0`, `unset`, `original`, `8-bit g64 from token 0`."""
        value = self.value(arm)
        if self.kind == "model":
            return f"{arm} model"
        if self.kind == "kv":
            return self.kv_plan(arm).describe()
        if self.kind == "weights":
            spec = self.weights_spec(arm)
            return spec.describe() if spec is not None else "weights as loaded"
        if value is None:
            return {"env": "unset", "patch": "original"}.get(self.kind, "None")
        if isinstance(value, str):
            return value
        if callable(value):
            return object_name(value)
        return repr(value)

    def describe(self) -> str:
        """One line for reports: `attention: reference_ops:sdpa → original · path=prefill`."""
        ref, cand = (self.describe_value(arm).removeprefix("pytest_mlxgate.") for arm in ARMS)
        return f"{self.name}: {ref} → {cand} · path={self.path}"

    def to_json(self) -> dict[str, str | None]:
        """The lever as JSON-able strings (values as `describe_value` writes them)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "target": self.target,
            "ref": self.describe_value("reference"),
            "cand": self.describe_value("candidate"),
            "path": self.path,
        }

    def key(self, arm: Arm) -> str:
        """Stable text identifying this arm's configuration, for a cache key.

        An arm that switches nothing (`as_loaded`) is named by its path alone. Otherwise:
        kind, target, path and a canonical value: a kv_config.json by the sha256 of its bytes
        (not its path), a callable by module:qualname *and the sha256 of its module's source*, so
        an edited function under the same name is another key (the patch value, the original it
        replaces, a context factory; see `code_digests`). The lever's name is left out (it changes
        nothing computed); a model lever's key names only the arm, so add the models' identity.
        """
        if self.as_loaded(arm):  # the same computation whichever lever names it: one key, one cached reference
            return json.dumps({"kind": "as-loaded", "path": self.path}, sort_keys=True, separators=(",", ":"))
        value = self.value(arm)
        stable: object
        if self.kind == "kv":
            plan = self.kv_plan(arm)
            stable = f"sha256:{plan.digest}" if plan.digest else plan.source
        elif self.kind == "model":
            stable = arm
        elif self.kind == "weights":
            weights = self.weights_spec(arm)
            stable = weights.stable if weights is not None else "as loaded"
        else:
            stable = canonical(value)
        key: dict[str, object] = {"kind": self.kind, "target": self.target, "value": stable, "path": self.path}
        code = self.code_digests(arm)
        if code:
            key["code"] = code
        return json.dumps(key, sort_keys=True, separators=(",", ":"))

    def as_loaded(self, arm: Arm) -> bool:
        """True when `arm` switches nothing: the model as loaded with mlx_lm's plain caches and its own
        functions (a KV lever's plain plan, a patch left to the original, a weights lever's weights as
        loaded). Such arms of different levers compute the same thing on the same path, so they share a
        key (`key`) and a run computes their reference once. An env lever is never one (unsetting a
        variable the process has is a change), nor a context lever (its factory runs whatever the value)."""
        if self.kind == "kv":
            return self.kv_plan(arm).is_plain
        if self.kind == "patch":
            return self.value(arm) is None
        if self.kind == "weights":
            return self.weights_spec(arm) is None
        return False

    def code_digests(self, arm: Arm) -> dict[str, str]:
        """{object name: sha256 of its module's source} for the Python code this arm runs through the
        lever: a patch's value (or, patched to the original, the original), a context factory. Code
        in C extensions has no entry: mlx's and mlx-lm's versions are in every key already."""
        objects: list[object] = []
        if self.kind == "patch" and self.target is not None:
            value = self.value(arm)
            if value is None:
                value = resolve_object(self.target, what=f"lever {self.name!r} patch target")[2]
            elif isinstance(value, str):
                value = resolve_object(value, what=f"lever {self.name!r} patch value")[2]
            objects.append(value)
        elif self.kind == "context":
            factory: object = self.factory
            if factory is None and self.target is not None:
                factory = resolve_object(self.target, what=f"lever {self.name!r} context factory")[2]
            objects.append(factory)
            if callable(self.value(arm)):
                objects.append(self.value(arm))
        out: dict[str, str] = {}
        for obj in objects:
            digest = source_digest(obj)
            if digest is not None:  # a callable instance is named by its class (its repr holds an address)
                out[object_name(obj if hasattr(obj, "__qualname__") else type(obj))] = digest
        return out

    @contextmanager
    def applied(self, arm: Arm, *, on_call: Callable[[], None] | None = None) -> Iterator[None]:
        """Run the body with this arm's value in force; everything is restored on exit, raise or not.

        `on_call` (patch levers): called at every call of the patched site during the body, whether
        the arm patches it or keeps the original, so a gate can prove its lever was exercised.
        Not for timed trials: the counting wrapper is a Python call."""
        value = self.value(arm)
        if self.kind == "env":
            assert self.target is not None
            with env_set(self.target, value if value is None else str(value)):
                yield
        elif self.kind == "patch" and (value is not None or on_call is not None):
            assert self.target is not None
            if value is None:
                value = resolve_object(self.target, what=f"lever {self.name!r} patch target")[2]
            with patched(self.name, self.target, value if on_call is None else counted(value, on_call, self.name)):
                yield
        elif self.kind == "context":
            with self._enter_context(value):
                yield
        else:  # kv (the plan is read by the caller), model/weights (two models), patch to the original
            yield

    def require_exercised(self, arm: Arm, calls: int | None, *, during: str) -> None:
        """Refuse a patch lever whose site was never called during `arm` (`calls` from `applied`'s
        `on_call`): its two arms ran the same code, and a pass would certify nothing."""
        if self.kind != "patch" or calls is None or calls > 0:
            return
        raise VacuousLeverError(
            f"lever {self.name!r}: {self.target} was never called during the {arm} arm's {during} "
            f"({self.describe_value(arm)}): the lever was never exercised, so both arms ran the same code and "
            "the gate would pass without testing anything. Fix: patch the attribute the model really calls "
            "(the module that looks it up at call time, e.g. mlx_lm.models.<arch>.<name> when the model "
            "imported it by name), or a function the path reaches (serving vs prefill: path=)"
        )

    def kv_plan(self, arm: Arm) -> KVPlan:
        """The KV cache plan for `arm`: a kv lever's parsed value, otherwise the plain plan."""
        value = self.value(arm)
        if self.kind != "kv":
            return PLAIN
        try:
            return parse_kv_value(value)
        except LeverError as e:
            raise LeverError(f"lever {self.name!r}, {arm} value: {e}") from None

    def weights_spec(self, arm: Arm) -> WeightsSpec | None:
        """A weights lever's quantization for `arm` (None: the weights as loaded)."""
        if self.kind != "weights":
            return None
        try:
            return parse_weights_value(self.value(arm))
        except LeverError as e:
            raise LeverError(f"lever {self.name!r}, {arm} value: {e}") from None

    @property
    def two_models(self) -> bool:
        """The arms run different model objects: two-model mode, or two weight quantizations."""
        return self.kind in ("model", "weights")

    def _enter_context(self, value: object) -> AbstractContextManager[Any]:
        factory: object = self.factory
        if factory is None:
            assert self.target is not None
            factory = resolve_object(self.target, what=f"lever {self.name!r} context factory")[2]
        if not callable(factory):
            raise LeverError(
                f"lever {self.name!r}: context factory {self.target} is {type(factory).__name__}, not callable; "
                "give a function value -> context manager"
            )
        manager = factory(value)
        if not (hasattr(manager, "__enter__") and hasattr(manager, "__exit__")):
            raise LeverError(
                f"lever {self.name!r}: context factory {self.target}({value!r}) returned "
                f"{type(manager).__name__}, not a context manager; return one (e.g. use @contextlib.contextmanager)"
            )
        return manager  # type: ignore[no-any-return]


def _check_arm(arm: str) -> Arm:
    if arm in ARMS:
        return arm
    raise LeverError(f"arm {arm!r} is neither 'reference' nor 'candidate'")
