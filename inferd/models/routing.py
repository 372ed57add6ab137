"""Which loaded engine version serves a request: model names, `name@version` pins, aliases with
weighted sticky splits, and shadow mirroring.

Readers never lock: `ModelRegistry.table` is one immutable `RoutingTable`; every change (a version
becoming ready, a reload, a rollout step, a rollback) builds a new table and swaps the reference,
so a request sees either the old routing or the new one, never a mix.

Sticky splits use weighted rendezvous hashing: each arm scores `-ln(u) / weight` with `u` a stable
hash (blake2b) of (route, tenant, user, arm) and the lowest score wins. Arm i wins with probability
weight_i / sum(weights), and raising one arm's weight only ever moves users *onto* that arm, so a
canary growing 1% -> 5% keeps every user it already had. Arms that are not ready are skipped; their
users spread over the rest and everyone else stays put.

`inferd.models.registry.ModelRegistry` holds the live table; `inferd.models.errors` has the routing
errors. `ModelVersion` is in `inferd.types`; `inferd.config.aliases` turns the `[aliases.*]` tables into
splits and holds their vocabulary (`Arm`, `Split`, `ROUTE_NAME_RE`, `RoutingConfigError`).
"""
from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from inferd.config import ROUTE_NAME_RE, Arm, RoutingConfigError, Split
from inferd.models.errors import InvalidModelField, UnknownModel, VersionNotLoaded, VersionUnavailable
from inferd.types import ModelVersion

VersionState = Literal["loading", "ready", "retired"]
SpecKey = tuple[str, str]       # a configured version: (model, requested), requested "latest" or a version id


class Route(msgspec.Struct, frozen=True):
    """Where one request goes. `shadow` is set when this request should also be mirrored there."""

    target: ModelVersion
    shadow: ModelVersion | None = None
    alias: str | None = None            # the alias named in the request (None for names and pins; the model
    #                                     asked for when a breaker or degradation sent it elsewhere)
    lora: str | None = None             # the LoRA adapter named as `name:adapter` (the API checks it exists)
    tier: str | None = None             # the alias's precision-tier rule that chose the version ("tiers.batch")


def split_adapter(model_field: str) -> tuple[str, str | None]:
    """`name:adapter` / `name@version:adapter` -> (`name` / `name@version`, `adapter`); a field
    without `:` names no adapter. Model names and versions never contain `:`."""
    base, sep, adapter = model_field.partition(":")
    if not sep:
        return model_field, None
    if not base or not adapter.strip():
        raise InvalidModelField(f"`model` {model_field!r} is not 'name:adapter'", model_field)
    return base, adapter


# -- the immutable table -------------------------------------------------------------------


class VersionEntry(msgspec.Struct, frozen=True):
    """One loaded version: its engine and state, and what the config knows it as."""

    engine: Any
    state: VersionState
    loaded_as: SpecKey | None = None        # the configured version whose load brought it up
    serves: tuple[SpecKey, ...] = ()        # configured versions that resolve to it now (none once retired)
    config: Any = None                      # the ModelConfig it was loaded with


class ArmListing(msgspec.Struct, frozen=True):
    target: str                          # "model@version"
    weight: float                        # normalised share of the route's traffic, 0..1
    ready: bool


class ModelListing(msgspec.Struct, frozen=True, omit_defaults=True):
    """One row of GET /v1/models (the API wraps these in OpenAI's list object)."""

    id: str                              # alias, model name, or "model@version"
    kind: Literal["alias", "model", "version"]
    routable: bool                       # a request naming `id` would be served now
    model: str | None = None
    version: str | None = None           # kind=version: its id; kind=model: its default version
    state: VersionState | None = None    # kind=version only
    split: tuple[ArmListing, ...] = ()
    shadow: str | None = None
    shadow_fraction: float = 0.0


_PERSON = b"inferd-route-v1"


def _hasher(*parts: str) -> Any:
    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    for p in parts:  # length-prefixed, so ("a", "bc") and ("ab", "c") differ
        b = p.encode()
        h.update(len(b).to_bytes(4, "big") + b)
    return h


def _unit(h: Any) -> float:
    """A hash as a float in the open interval (0, 1)."""
    return (int.from_bytes(h.digest(), "big") + 0.5) / 2.0**64


class RoutingTable:
    """One immutable snapshot: versions with their engines and states, defaults, splits.

    Build new ones with the `with_*` methods; never mutate one that a reader may hold.
    """

    __slots__ = ("versions", "defaults", "aliases", "model_splits", "_rng")

    def __init__(self, versions: Mapping[ModelVersion, VersionEntry] | None = None,
                 defaults: Mapping[str, str] | None = None, aliases: Mapping[str, Split] | None = None,
                 model_splits: Mapping[str, Split] | None = None, rng: random.Random | None = None) -> None:
        self.versions = dict(versions or {})
        self.defaults = dict(defaults or {})
        self.aliases = dict(aliases or {})
        self.model_splits = dict(model_splits or {})
        self._rng = rng or random.Random()
        clash = set(self.aliases) & self.models()
        if clash:
            raise RoutingConfigError(f"alias names clash with model names: {', '.join(sorted(clash))}")
        bad = [a for a in self.aliases if not ROUTE_NAME_RE.match(a)]
        if bad:
            raise RoutingConfigError(f"alias names must match {ROUTE_NAME_RE.pattern}: {', '.join(bad)}")

    def _replace(self, **kw: Any) -> RoutingTable:
        args = {"versions": self.versions, "defaults": self.defaults, "aliases": self.aliases,
                "model_splits": self.model_splits, "rng": self._rng}
        args.update(kw)
        return RoutingTable(**args)

    # -- builders (return a new table) -----------------------------------------------------
    def with_version(self, key: ModelVersion, engine: Any, state: VersionState) -> RoutingTable:
        return self._replace(versions={**self.versions, key: VersionEntry(engine, state)})

    def with_entry(self, key: ModelVersion, entry: VersionEntry) -> RoutingTable:
        return self._replace(versions={**self.versions, key: entry})

    def without_version(self, key: ModelVersion) -> RoutingTable:
        versions = dict(self.versions)
        versions.pop(key, None)
        return self._replace(versions=versions)

    def with_split(self, name: str, split: Split) -> RoutingTable:
        """Replace the split of an alias, or override a model name's default routing."""
        if name in self.aliases:
            return self._replace(aliases={**self.aliases, name: split})
        if name in self.models():
            return self._replace(model_splits={**self.model_splits, name: split})
        raise UnknownModel(f"no alias or model named {name!r}", name)

    def with_routes(self, *, defaults: Mapping[str, str], aliases: Mapping[str, Split]) -> RoutingTable:
        """A config reload: new defaults and aliases; rollout overrides of model names are dropped."""
        return self._replace(defaults=defaults, aliases=aliases, model_splits={})

    # -- reads ------------------------------------------------------------------------------
    def models(self) -> set[str]:
        """Model names a request may send: configured ones, and those with a version not retired (a retired
        version only finishes its streams, or waits warm for a rollback: its model is gone for new requests)."""
        return set(self.defaults) | {k.model for k in self._live()}

    def _live(self) -> list[ModelVersion]:
        return [k for k, entry in self.versions.items() if entry.state != "retired"]

    def state(self, key: ModelVersion) -> VersionState | None:
        entry = self.versions.get(key)
        return entry.state if entry else None

    def is_ready(self, key: ModelVersion) -> bool:
        entry = self.versions.get(key)
        return entry is not None and entry.state == "ready"

    def engine(self, key: ModelVersion) -> Any:
        """The engine of a loaded version (ready, loading or retired: in-flight streams still need it)."""
        entry = self.versions.get(key)
        if entry is None:
            raise VersionNotLoaded(f"version {key} is not loaded on this server", str(key))
        return entry.engine

    def split_for(self, name: str) -> Split | None:
        """The split a non-pinned `name` routes by (None: unknown name or no default version)."""
        if name in self.aliases:
            return self.aliases[name]
        if name in self.model_splits:
            return self.model_splits[name]
        if name in self.defaults:
            return Split.single(ModelVersion(name, self.defaults[name]))
        loaded = sorted(k for k in self._live() if k.model == name)
        return Split.single(loaded[0]) if len(loaded) == 1 else None

    def resolve(self, model_field: str, tenant: str, user: str | None = None, *,
                request_id: str | None = None, priority: str | None = None, tiers: bool = True) -> Route:
        """Route one request. A split's tenant or tier rule for `tenant` or its `priority` class names its
        versions (while one of them is ready; else the arms decide; `tiers=False`: the arms decide). With
        `user`, the arm is sticky per (tenant, user); without it, the draw is per request (a hash of
        `request_id`, else a random draw). Shadow selection hashes `request_id` (else draws at random); a
        tier's request is not mirrored."""
        if not isinstance(model_field, str) or not model_field.strip():
            raise InvalidModelField("`model` must be a non-empty string", str(model_field))
        model_field, lora = split_adapter(model_field)
        if "@" in model_field:
            return Route(self._pinned(model_field), lora=lora)
        split = self.split_for(model_field)
        if split is None:
            if model_field in self.models():
                raise VersionUnavailable(f"model `{model_field}` has no default version loaded", model_field)
            raise UnknownModel(f"The model `{model_field}` does not exist on this server; "
                               "GET /v1/models lists them.", model_field)
        alias = model_field if model_field in self.aliases else None
        rule = split.tier_rule(tenant, priority) if tiers and (split.tenants or split.tiers) else None
        if rule is not None and any(self.is_ready(a.target) for a in rule.arms if a.weight > 0):
            return Route(self._pick(model_field, rule.arms, tenant, user, request_id), None, alias, lora, rule.key)
        target = self._pick(model_field, split.arms, tenant, user, request_id)
        shadow = None
        # A shadow runs the base model (mirrors carry no adapter): nothing to compare an adapter's output with.
        if split.shadow is not None and split.shadow != target and self.is_ready(split.shadow) and lora is None:
            if self._draw(request_id, "shadow", model_field) < split.shadow_fraction:
                shadow = split.shadow
        return Route(target, shadow, alias, lora)

    def _pinned(self, field: str) -> ModelVersion:
        try:
            key = ModelVersion.parse(field)
        except ValueError:
            raise InvalidModelField(f"`model` {field!r} is not 'name@version'", field) from None
        if key.model not in self.models():
            hint = " (aliases cannot be pinned; pin a model name)" if key.model in self.aliases else ""
            raise UnknownModel(f"The model `{key.model}` does not exist on this server{hint}.", field)
        state = self.state(key)
        if state is None or state == "retired":
            loaded = ", ".join(k.version for k in sorted(self.versions)
                               if k.model == key.model and self.versions[k].state == "ready")
            why = "is retired" if state else "is not loaded"
            raise VersionNotLoaded(f"version `{key.version}` of model `{key.model}` {why}; "
                                   f"ready versions: {loaded or 'none'}", field)
        if state == "loading":
            raise VersionUnavailable(f"version `{field}` is still loading; retry shortly", field)
        return key

    def _pick(self, name: str, candidates: tuple[Arm, ...], tenant: str, user: str | None,
              request_id: str | None) -> ModelVersion:
        arms = [a for a in candidates if a.weight > 0 and self.is_ready(a.target)]
        if not arms:
            raise VersionUnavailable(f"no version of `{name}` is ready to serve; retry shortly", name)
        if len(arms) == 1:
            return arms[0].target
        if user is not None:
            base = _hasher(name, "user", tenant, user)
        elif request_id is not None:
            base = _hasher(name, "request", request_id)
        else:
            base = _hasher(name, "random", str(self._rng.getrandbits(64)))
        best, best_score = arms[0].target, math.inf
        for arm in arms:
            h = base.copy()
            h.update(str(arm.target).encode())
            score = -math.log(_unit(h)) / arm.weight
            if score < best_score:
                best, best_score = arm.target, score
        return best

    def _draw(self, request_id: str | None, purpose: str, name: str) -> float:
        if request_id is None:
            return self._rng.random()
        return _unit(_hasher(name, purpose, request_id))

    def list_models(self) -> list[ModelListing]:
        """Aliases, then model names, then every loaded version not retired, each sorted by name."""
        out = []
        for name in sorted(self.aliases) + sorted(self.models()):
            split = self.split_for(name)
            kind = "alias" if name in self.aliases else "model"
            arms: tuple[ArmListing, ...] = ()
            routable = False
            if split is not None:
                total = sum(a.weight for a in split.arms)
                arms = tuple(ArmListing(str(a.target), a.weight / total, self.is_ready(a.target))
                             for a in split.arms)
                routable = any(a.ready and a.weight > 0 for a in arms)
            out.append(ModelListing(
                id=name, kind=kind, routable=routable, model=name if kind == "model" else None,
                version=self.defaults.get(name) if kind == "model" else None, split=arms,
                shadow=str(split.shadow) if split and split.shadow else None,
                shadow_fraction=split.shadow_fraction if split and split.shadow else 0.0))
        for key in sorted(self._live()):
            st = self.versions[key].state
            out.append(ModelListing(id=str(key), kind="version", routable=st == "ready",
                                    model=key.model, version=key.version, state=st))
        return out
