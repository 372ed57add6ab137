"""The operator's console (/admin/ui): server-rendered pages behind an admin sign-in, no outside resources.

Sign-in and sessions (session), pages (pages), the views (now_view, keys_view) and the routes (routes).
"""
from __future__ import annotations

from inferd.api.console.routes import add_routes

__all__ = ["add_routes"]
