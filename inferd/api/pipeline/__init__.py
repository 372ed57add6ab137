"""The request path as one ordered list of stages over one typed context, the same for every endpoint.

`run.py` lists the stages in the order a request meets them and runs them; each stage module holds a
few small stages; `settle.py` is the one way out. Importers use the handlers in `run.py`.
"""
