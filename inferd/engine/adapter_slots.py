"""Which LoRA adapters an engine has loaded: the slots, who holds each, least-recently-used eviction, idling.

Every backend that serves adapters keeps its loaded table here; what a loaded adapter *is* (the payload)
stays the backend's: the reference engine's LoraWeights, the sim's rank, trtllm's LoRARequest.

- At most `max_loaded` adapters are loaded (None: no limit). Installing one more evicts the least
  recently used adapter that nobody holds; when every loaded adapter is held, `install` raises AdapterBusy.
- A holder (a sequence running with it) pins an adapter: a pinned adapter is never evicted or unloaded.
- An adapter nobody holds for `idle_unload_s` seconds is unloaded by `unload_idle` (None: never).

Thread-safe (one lock, held only for bookkeeping): the event loop lists, loads and unloads adapters for the
admin API while an engine's step thread pins them for its sequences.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

from inferd.engine.adapters import AdapterBusy, AdapterSources

Payload = TypeVar("Payload")


class AdapterUse(Generic[Payload]):
    """One adapter's state for a listing: its payload (None: not loaded), holders, and idle seconds."""

    __slots__ = ("payload", "pins", "idle_s")

    def __init__(self, payload: Payload | None, pins: int, idle_s: float | None) -> None:
        self.payload, self.pins, self.idle_s = payload, pins, idle_s


class AdapterSlots(AdapterSources, Generic[Payload]):
    def __init__(self, sources: Mapping[str, str | Path], *, max_loaded: int | None = None,
                 idle_unload_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if max_loaded is not None and (isinstance(max_loaded, bool) or not isinstance(max_loaded, int)
                                       or max_loaded < 1):
            raise ValueError(f"max_loaded_adapters must be an integer >= 1, got {max_loaded!r}")
        if idle_unload_s is not None and not idle_unload_s > 0:
            raise ValueError(f"adapter_idle_unload_s must be > 0 (or None: never), got {idle_unload_s!r}")
        super().__init__(sources)
        self.max_loaded, self.idle_unload_s, self._clock = max_loaded, idle_unload_s, clock
        self._lock = threading.Lock()
        self._loaded: OrderedDict[str, Payload] = OrderedDict()   # least recently used first
        self._pins: dict[str, int] = {}
        self._last_used: dict[str, float] = {}

    def is_loaded(self, name: str) -> bool:
        with self._lock:
            return name in self._loaded

    def loaded(self, name: str) -> Payload | None:
        """Adapter `name`'s payload when it is loaded (nothing pinned, nothing touched); else None."""
        with self._lock:
            return self._loaded.get(name)

    def install(self, name: str, payload: Payload, pins: int = 0) -> Payload:
        """Make `payload` the loaded adapter `name` (an already loaded one is kept and returned), with
        `pins` more holders. Evicts the least recently used adapter nobody holds when all slots are taken."""
        self.source(name)
        with self._lock:
            if name not in self._loaded:
                if self.max_loaded is not None and len(self._loaded) >= self.max_loaded:
                    victim = next((n for n in self._loaded if not self._pins.get(n)), None)
                    if victim is None:
                        raise AdapterBusy(f"LoRA adapter {name!r}: all {self.max_loaded} adapter slots hold "
                                          "adapters in use", name)
                    self._drop(victim)
                self._loaded[name] = payload
            self._pins[name] = self._pins.get(name, 0) + pins
            return self._touch(name)

    def acquire(self, name: str) -> Payload | None:
        """Adapter `name`, pinned for one more holder, if it is loaded (else None, nothing pinned)."""
        with self._lock:
            if name not in self._loaded:
                return None
            self._pins[name] = self._pins.get(name, 0) + 1
            return self._touch(name)

    def release(self, name: str) -> None:
        """One holder of adapter `name` let go of it."""
        with self._lock:
            held = self._pins.get(name, 0)
            if held > 0:
                self._pins[name] = held - 1
                self._last_used[name] = self._clock()

    def unload(self, name: str) -> bool:
        """Unload adapter `name`; False when it was not loaded. AdapterBusy while it is held."""
        self.source(name)
        with self._lock:
            if name not in self._loaded:
                return False
            if self._pins.get(name):
                raise AdapterBusy(f"LoRA adapter {name!r} is in use by {self._pins[name]} sequence(s)", name)
            self._drop(name)
            return True

    def unload_idle(self) -> list[str]:
        """Unload every adapter nobody has held for idle_unload_s; returns their names."""
        if self.idle_unload_s is None:
            return []
        with self._lock:
            cutoff = self._clock() - self.idle_unload_s
            idle = [n for n in self._loaded if not self._pins.get(n) and self._last_used[n] <= cutoff]
            for name in idle:
                self._drop(name)
            return idle

    def has_room(self) -> bool:
        """True when install() would find a slot now: one is empty, or holds an adapter nobody holds."""
        with self._lock:
            return (self.max_loaded is None or len(self._loaded) < self.max_loaded
                    or any(not self._pins.get(n) for n in self._loaded))

    def idle_wait(self) -> float | None:
        """Seconds until the next adapter becomes idle long enough to unload (None: none will)."""
        if self.idle_unload_s is None:
            return None
        with self._lock:
            free = [self._last_used[n] for n in self._loaded if not self._pins.get(n)]
            if not free:
                return None
            return max(0.0, min(free) + self.idle_unload_s - self._clock())

    def use(self, name: str) -> AdapterUse[Payload]:
        """Adapter `name`'s payload, holders and idle seconds (None while held or not loaded), at once."""
        with self._lock:
            payload, pins = self._loaded.get(name), self._pins.get(name, 0)
            idle = self._clock() - self._last_used[name] if name in self._loaded and not pins else None
        return AdapterUse(payload, pins, idle)

    def _touch(self, name: str) -> Payload:
        self._loaded.move_to_end(name)
        self._last_used[name] = self._clock()
        return self._loaded[name]

    def _drop(self, name: str) -> None:
        del self._loaded[name]
        self._pins.pop(name, None)
        self._last_used.pop(name, None)
