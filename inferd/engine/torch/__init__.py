"""The PyTorch engine: shared scheduling and sampling rules; forward pass, paged KV pool and sampling in torch."""
