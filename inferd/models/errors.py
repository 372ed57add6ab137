"""Why a route cannot be built or a request's `model` cannot be routed.

`RoutingError`s carry the OpenAI envelope fields (status, code, param, retry_after_s) and a
message that is safe to show clients. Config and split errors are inferd.config's RoutingConfigError.
"""
from __future__ import annotations


class RoutingError(Exception):
    """A request's `model` cannot be routed. `message` is safe for clients; the API maps
    status/code/param/retry_after_s onto the OpenAI error envelope."""

    status = 404
    code = "model_not_found"
    retry_after_s: int | None = None

    def __init__(self, message: str, model: str) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.param = "model"


class InvalidModelField(RoutingError):
    status, code = 400, "invalid_model"


class UnknownModel(RoutingError):
    status, code = 404, "model_not_found"


class VersionNotLoaded(RoutingError):
    status, code = 404, "model_version_not_found"


class VersionUnavailable(RoutingError):
    status, code, retry_after_s = 503, "model_version_unavailable", 1
