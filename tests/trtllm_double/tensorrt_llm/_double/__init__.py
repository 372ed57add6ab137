"""Not part of the real package: the fake executor behind the double, and test controls."""
from .controls import controls

__all__ = ["controls"]
