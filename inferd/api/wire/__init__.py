"""OpenAI's wire formats: request structs and validation, response bodies and chunks, the OpenAPI document."""
