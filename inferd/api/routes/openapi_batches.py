"""The Files and Batches operations of the OpenAPI document (inferd.api.routes.openapi merges them in).

What no schema can say: the `file` of an upload is JSON lines of batch requests, each line checked
(inferd.api.routes.batch_input) and refused with a 400 naming the line; its size limit is store.max_file_bytes.
"""
from __future__ import annotations

from inferd.api.routes.batch_input import URLS
from inferd.api.routes.batches import COMPLETION_WINDOWS, MAX_METADATA_KEY, MAX_METADATA_KEYS, MAX_METADATA_VALUE
from inferd.api.routes.files import LIST_PURPOSES, PURPOSES

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_TEXT = {
    "400": "Invalid request: the message and `param` name the field (for an upload, the line of the file)",
    "401": "Missing or unknown API key (when auth is on)",
    "403": "The key lacks the `inference` scope",
    "404": "No such file or batch for this tenant (another tenant's id is not found either)",
    "409": "The batch has ended (or is finalizing) and cannot be cancelled",
    "413": "Upload larger than store.max_file_bytes, or a batch request body over 64 KiB",
    "415": "Wrong Content-Type (multipart/form-data for uploads, application/json otherwise)",
    "500": "Server error (never caused by the request's content)",
    "503": "The server keeps no store (Retry-After)",
}
_ALWAYS = ("401", "403", "500", "503")


def _responses(ok: dict, *statuses: str) -> dict:
    errors = {s: {"description": _TEXT[s], "content": {"application/json": {"schema": _ERROR_REF}}}
              for s in sorted({*statuses, *_ALWAYS})}
    return {"200": ok, **errors}


def _ok(description: str, content_type: str = "application/json", schema: dict | None = None) -> dict:
    return {"description": description, "content": {content_type: {"schema": schema or {"type": "object"}}}}


def _query(name: str, schema: dict) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _path(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_UPLOAD = {
    "type": "object",
    "required": ["file", "purpose"],
    "additionalProperties": False,
    "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "JSON lines: {custom_id, method: POST, url, body} per line, custom_id unique"},
        "purpose": {"type": "string", "enum": list(PURPOSES)},
    },
}

_CREATE_BATCH = {
    "type": "object",
    "required": ["input_file_id", "endpoint", "completion_window"],
    "additionalProperties": False,
    "properties": {
        "input_file_id": {"type": "string"},
        "endpoint": {"type": "string", "enum": list(URLS)},
        "completion_window": {"type": "string", "enum": list(COMPLETION_WINDOWS)},
        "metadata": {"type": ["object", "null"], "maxProperties": MAX_METADATA_KEYS,
                     "propertyNames": {"maxLength": MAX_METADATA_KEY},
                     "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE}},
    },
}

_FILE_ID, _BATCH_ID = _path("file_id"), _path("batch_id")
_AFTER = _query("after", {"type": "string"})


def batch_paths() -> dict:
    return {
        "/v1/files": {
            "post": {"summary": "Upload a batch input file (JSON lines, checked line by line)",
                     "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _UPLOAD}}},
                     "responses": _responses(_ok("A File object"), "400", "413", "415")},
            "get": {"summary": "The caller's files, newest first (order=asc: oldest)",
                    "parameters": [_query("purpose", {"type": "string", "enum": list(LIST_PURPOSES)}),
                                   _query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}),
                                   _AFTER, _query("order", {"type": "string", "enum": ["asc", "desc"]})],
                    "responses": _responses(_ok("A list of File objects"), "400")},
        },
        "/v1/files/{file_id}": {
            "get": {"summary": "A File object", "parameters": [_FILE_ID],
                    "responses": _responses(_ok("A File object"), "404")},
            "delete": {"summary": "Delete a file", "parameters": [_FILE_ID],
                       "responses": _responses(_ok("{id, object: file, deleted: true}"), "404")},
        },
        "/v1/files/{file_id}/content": {
            "get": {"summary": "A file's bytes (a batch's output or errors: JSON lines)", "parameters": [_FILE_ID],
                    "responses": _responses(_ok("The file", "application/octet-stream",
                                                {"type": "string", "format": "binary"}), "404")},
        },
        "/v1/batches": {
            "post": {"summary": "Create a batch over an uploaded file; it runs in the background",
                     "requestBody": {"required": True,
                                     "content": {"application/json": {"schema": _CREATE_BATCH}}},
                     "responses": _responses(_ok("A Batch object (status validating)"), "400", "404", "413",
                                             "415")},
            "get": {"summary": "The caller's batches, newest first",
                    "parameters": [_AFTER, _query("limit", {"type": "integer", "minimum": 1, "maximum": 100})],
                    "responses": _responses(_ok("A list of Batch objects"), "400")},
        },
        "/v1/batches/{batch_id}": {
            "get": {"summary": "A Batch object, with its request counts as of now", "parameters": [_BATCH_ID],
                    "responses": _responses(_ok("A Batch object"), "404")},
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {"summary": "Cancel a validating or in-progress batch (it ends cancelled, with the lines done)",
                     "parameters": [_BATCH_ID],
                     "responses": _responses(_ok("The Batch object (status cancelling)"), "404", "409")},
        },
    }
