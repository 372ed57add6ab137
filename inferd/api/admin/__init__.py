"""The admin routes (admin scope): rollouts, shadows, adapters, the model lifecycle, usage."""
