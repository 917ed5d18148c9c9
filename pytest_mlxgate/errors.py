"""The errors and warnings mlxgate raises on purpose: each message says what, why, and the fix.

The hub downloader has its own hierarchy (`pytest_mlxgate.hub.HubError`); these cover naming
models and configuring the plugin. The plugin turns `MlxgateUsageError` into `pytest.UsageError`
and the CLI into exit status 2, so the wording lives here once.
"""

from __future__ import annotations

import pytest

__all__ = [
    "MlxgateError",
    "MlxgateUsageError",
    "MlxgateWarning",
    "InconclusiveGateWarning",
    "ModelNameError",
    "ModelUnavailableError",
    "LeverError",
    "LeverNotApplicableError",
    "VacuousLeverError",
    "PromptsError",
    "GateRunError",
    "NonFiniteLogitsError",
    "VocabularyMismatchError",
    "DistributedRunError",
    "ArmTimeoutError",
    "ContextLengthError",
    "ChatTemplateMissingError",
    "OracleNotMeasuredError",
    "ServerArmError",
    "CalibrationError",
    "StaleCalibrationWarning",
]


class MlxgateError(Exception):
    """Base of every error mlxgate (outside the hub downloader) raises on purpose."""


class MlxgateUsageError(MlxgateError, ValueError):
    """The user asked for something that cannot work as written (a bad option or config value)."""


class ModelNameError(MlxgateUsageError):
    """A model name is neither a known alias, a valid repo id, nor a local directory."""


class ModelUnavailableError(MlxgateError):
    """A configured model cannot be had (download, build or load failed); the message says why."""


class LeverError(MlxgateUsageError):
    """A lever (marker, --mlx-lever/--mlx-ref-value/--mlx-cand-value, KV config) cannot work as written."""


class LeverNotApplicableError(MlxgateError):
    """The lever cannot apply to this model (e.g. quantizing weights that already are): the gate
    skips, saying why and what model it needs, rather than failing a model it does not concern."""


class VacuousLeverError(LeverError):
    """The lever changes nothing the gate scores (a KV plan that quantizes no scored position, a patch
    whose site is never called, both arms the same): passing would certify a change that was never
    tested, so the gate is refused, saying why and how to make it test something."""


class PromptsError(MlxgateUsageError):
    """A prompts file (--mlx-prompts-file) or prompt setting is unusable; the message names the line."""


class GateRunError(MlxgateError):
    """A gate's arms could not be run to the end (the message names the arm, prompt and position)."""


class NonFiniteLogitsError(GateRunError):
    """An arm produced NaN or inf logits: a broken kernel, not a small drift."""


class VocabularyMismatchError(GateRunError):
    """Two-model mode with models whose tokenizers differ: their KL would be garbage."""


class DistributedRunError(GateRunError):
    """The ranks of an `mlx.launch` job cannot pair their shares: they disagree on the items, or one failed."""


class ArmTimeoutError(GateRunError):
    """An arm ran past --mlx-arm-timeout (checked between forwards, decode steps and capability
    batches, never by interrupting MLX): the message names the arm, how far it got and the limit."""


class ContextLengthError(MlxgateUsageError):
    """A gate asks for more positions than the model serves (its config's max_position_embeddings):
    refused before any arm runs, naming the asked tokens, the model's limit and the option to lower."""


class OracleNotMeasuredError(MlxgateUsageError):
    """`assert_kl_below(relative=...)` in a module whose source does not name `relative=` where the plugin
    reads it before the arms run: no float32 oracle arm was measured to judge against."""


class ChatTemplateMissingError(LeverNotApplicableError):
    """The gate's prompts are chat conversations and the model's tokenizer has no chat template to
    render them: the gate skips on this model, saying which prompts and what would make it run."""


class ServerArmError(GateRunError):
    """An arm served over HTTP could not be asked, or answered what is no distribution of the gate's tokens:
    the message names the server (never its key), the request or position, and what to do."""


class MlxgateWarning(pytest.PytestWarning):
    """Something makes the gate slow or less trustworthy, but it can still run."""


class InconclusiveGateWarning(MlxgateWarning):
    """A gate could not tell (--mlx-inconclusive=warn): it did not pass; its record says inconclusive."""


class CalibrationError(MlxgateError):
    """--mlx-calibrate measured, but not what the calibration file may hold (a known-bad variant that
    could not be measured, sizes other than the gate's): the file on disk is kept, and the message says why."""


class StaleCalibrationWarning(MlxgateWarning):
    """A gate's calibration file was measured on other serving code, another lever or other versions:
    its figures may not be what this code measures; the message names the command that refreshes it."""
