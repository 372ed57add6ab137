"""The routes beside the request pipeline: health, readiness, metrics, models, and the Files and Batch APIs."""
