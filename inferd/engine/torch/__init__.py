"""The PyTorch engine: the shared scheduler and sampling rules, the decoder's forward pass and paged KV pool in torch (CUDA or CPU)."""
