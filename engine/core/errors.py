"""Errors a client can cause, each with a stable code the server sends back as-is."""

from __future__ import annotations


class FluxoError(Exception):
    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EmptyPrompt(FluxoError):
    code = "empty_prompt"


class PromptTooLong(FluxoError):
    code = "prompt_too_long"


class InvalidMaxTokens(FluxoError):
    code = "invalid_max_tokens"


class InvalidSampling(FluxoError):
    code = "invalid_sampling"


class KVBudgetTooSmall(FluxoError):
    code = "kv_budget_too_small"


class UnknownMode(FluxoError):
    code = "unknown_mode"


class InvalidConfig(FluxoError):
    code = "invalid_config"


class UnknownRequest(FluxoError):
    code = "unknown_request"


class StepFailed(FluxoError):
    """The step computing this request raised; the request fails, the engine keeps serving."""

    code = "step_failed"


class DeviceUnavailable(FluxoError):
    """``--device cuda`` (or ``EngineConfig(device="cuda")``) on a machine where torch sees no GPU:
    refused at start, never a silent CPU run."""

    code = "device_unavailable"
