"""Errors a client can cause, each with a stable code the server sends back as-is."""

from __future__ import annotations


class FluxoError(Exception):
    code = "internal"
    # Declared, never set here: the server sets it where one request field is to blame (OpenAI's
    # error ``param``) and reads it with ``getattr(exc, "param", None)``.
    param: str | None

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


class InvalidTokenIds(FluxoError):
    """A prompt given as token ids holds one that is not an integer in ``[0, vocab)``."""

    code = "invalid_token_ids"


class KVBudgetTooSmall(FluxoError):
    code = "kv_budget_too_small"


class KVOverMemory(FluxoError):
    """A KV pool (``kv_blocks``) larger than the machine's free memory could hold: refused before
    the cache is resized, never an out-of-memory kill."""

    code = "kv_over_memory"


class UnknownMode(FluxoError):
    code = "unknown_mode"


class InvalidConfig(FluxoError):
    code = "invalid_config"


class UnknownRequest(FluxoError):
    code = "unknown_request"


class StepFailed(FluxoError):
    """The step computing this request raised; the request fails, the engine keeps serving."""

    code = "step_failed"


class ShuttingDown(FluxoError):
    """The server is stopping (SIGTERM, Ctrl-C): every request in flight ends with this, so each
    client is told rather than cut off."""

    code = "shutting_down"


class DeviceUnavailable(FluxoError):
    """``--device cuda`` (or ``EngineConfig(device="cuda")``) on a machine where torch sees no GPU:
    refused at start, never a silent CPU run."""

    code = "device_unavailable"


class UnsupportedModel(FluxoError):
    """A ``--model`` the engine cannot serve faithfully: not a local checkpoint or a hub id already
    in the local cache (nothing is ever downloaded), or an architecture its Llama forward does
    not implement (it would give wrong text, not an error)."""

    code = "unsupported_model"


class PolicyError(FluxoError):
    """A scheduling policy's decision was refused (it broke a rule, raised, or took longer than
    its bound): that step is decided by the continuous policy instead, and the step record's
    events say why. Never sent to a request: the requests go on."""

    code = "policy_error"


class InvalidPolicy(FluxoError):
    """A ``--policy-file`` that cannot be loaded: missing, not Python, no ``Policy`` subclass, a
    name already taken. Refused at start, before anything is served."""

    code = "invalid_policy"
