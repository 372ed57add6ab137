"""The routes beside the request pipeline: health, readiness, metrics, models, tokenizers, Files and Batch APIs."""
