import threading
from collections import Counter

from inferd.config.aliases import Arm, Split
from inferd.models.registry import ModelRegistry
from inferd.types import ModelVersion

V1 = ModelVersion("llama", "aaaa1111")
V2 = ModelVersion("llama", "bbbb2222")


def make_registry(*ready: ModelVersion, aliases, loading=()):
    reg = ModelRegistry(defaults={"llama": V1.version}, aliases=aliases)
    for key in (*ready, *loading):
        reg.register(key, f"engine-{key}")
    for key in ready:
        reg.mark_ready(key)
    return reg


def split(*weights):
    return Split(tuple(Arm(k, w) for k, w in weights))


def test_a_held_table_is_unchanged_by_later_swaps():
    reg = make_registry(V1, V2, aliases={"chat": split((V1, 1))})
    old = reg.table
    reg.set_split("chat", split((V2, 1)))
    assert old.resolve("chat", "acme", "u").target == V1
    assert reg.resolve("chat", "acme", "u").target == V2


def test_table_swaps_are_atomic_for_concurrent_readers():
    # Two routings that are each consistent: alias on V1 with V2 loading, or alias on V2 with V1
    # retired. A reader that saw one half of a change would find no ready arm and raise.
    reg = make_registry(V1, loading=(V2,), aliases={"chat": split((V1, 1))})

    def to_v2(t):
        return t.with_version(V2, "e2", "ready").with_version(V1, "e1", "retired").with_split("chat", split((V2, 1)))

    def to_v1(t):
        return t.with_version(V1, "e1", "ready").with_version(V2, "e2", "loading").with_split("chat", split((V1, 1)))
    stop, errors, seen = threading.Event(), [], Counter()

    def reader():
        while not stop.is_set():
            try:
                seen[reg.resolve("chat", "acme", "u").target] += 1
            except Exception as exc:  # noqa: BLE001 - the test collects whatever a torn table raises
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(2000):
        reg.swap(to_v2 if i % 2 == 0 else to_v1)
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and seen[V1] + seen[V2] > 0
