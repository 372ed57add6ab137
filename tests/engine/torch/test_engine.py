"""TorchEngine end to end on the CPU path (float32), against the reference engine on the same artifact."""
from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from inferd.engine.reference.engine import ReferenceEngine  # noqa: E402  (after the skip)
from inferd.engine.torch.engine import TorchDeviceError, TorchEngine  # noqa: E402
from inferd.types import GenerationRequest, SamplingParams  # noqa: E402
from tests.engine.backends import started_engines  # noqa: E402

TEXTS = ["the quick brown fox", "one of the most common words in the language is the", "we said",
         "there was a time when all of them were at home and they could not be found by the", "how"]
LENGTHS = [20, 7, 15, 24, 9]


@pytest.fixture
async def make_engine(tiny_artifact):
    def build(cls=TorchEngine, **kwargs):
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("block_size", 4)
        kwargs.setdefault("max_num_tokens", 16)      # prefill chunks mix with decodes
        if cls is TorchEngine:
            kwargs.setdefault("device", "cpu")
            kwargs.setdefault("dtype", "float32")
        return cls(tiny_artifact, **kwargs)

    async with started_engines(build) as make:
        yield make


def req(engine, rid: str, text: str, max_tokens: int, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("ignore_eos", True)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(text)),
                             sampling=SamplingParams(max_tokens=max_tokens, **sampling), tenant=rid)


async def outputs(engine, **sampling) -> list[tuple[int, ...]]:
    streams = [engine.submit(req(engine, f"r{i}", t, n, **sampling)) for i, (t, n) in enumerate(zip(TEXTS, LENGTHS))]
    return [tuple((await s.collect()).token_ids) for s in streams]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buffers"])
async def test_batched_greedy_output_equals_the_reference_engines(make_engine, graphs):
    reference = await make_engine(ReferenceEngine)
    engine = await make_engine(cuda_graphs=graphs)
    assert await outputs(engine) == await outputs(reference)


async def test_decode_steps_go_through_the_graph_ladder_when_it_is_on(make_engine):
    engine = await make_engine(cuda_graphs=True, max_batch_size=4)
    graphs = engine._runner.graphs
    assert graphs is not None and graphs.batch_sizes[-1] == 4
    replays = []
    run = graphs.run
    graphs.run = lambda *args: replays.append(len(args[0])) or run(*args)
    await outputs(engine)
    assert replays and max(replays) <= 4


async def test_seeded_sampling_draws_what_the_reference_engine_draws(make_engine):
    reference = await make_engine(ReferenceEngine)
    engine = await make_engine()
    params = dict(temperature=0.8, top_p=0.9, seed=1234)
    assert await outputs(engine, **params) == await outputs(reference, **params)


async def test_logprobs_agree_with_the_reference_engine(make_engine):
    reference = await make_engine(ReferenceEngine)
    engine = await make_engine()
    got = [await e.submit(req(e, "lp", TEXTS[1], 6, logprobs=3, prompt_logprobs=2)).collect()
           for e in (engine, reference)]
    assert got[0].token_ids == got[1].token_ids
    for ours, theirs in zip(got[0].logprobs, got[1].logprobs):
        assert ours.token_id == theirs.token_id and ours.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert [t for t, _ in ours.top] == [t for t, _ in theirs.top]
    for ours, theirs in zip(got[0].prompt_logprobs[1:], got[1].prompt_logprobs[1:]):
        assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-4)


async def test_memory_is_the_weights_and_the_pool_and_close_gives_it_back(make_engine):
    engine = await make_engine(num_kv_blocks=32, block_size=4)
    runner = engine._runner
    pool, c = runner.pool, runner.config
    assert engine.memory_bytes() == runner.model.weight_bytes() + pool.nbytes
    per_block = pool.bytes_per_block(c.num_hidden_layers, 4, c.num_key_value_heads, c.head_dim, torch.float32)
    assert pool.nbytes == (32 + 1) * per_block       # and the scratch block padded graph rows write to
    await engine.close()
    assert engine.memory_bytes() == 0 and engine.model is None     # nothing left holding the weights


async def test_the_info_names_the_backend_and_the_hardware(make_engine):
    engine = await make_engine()
    assert (engine.info.backend, engine.info.hardware, engine.info.num_kv_blocks) == ("torch", "cpu", 256)


async def test_dummy_weights_load_from_the_config_alone_and_generate(make_engine):
    engine = await make_engine(load_format="dummy", seed=3)
    done = await engine.submit(req(engine, "d", TEXTS[0], 5)).collect()
    assert len(done.token_ids) == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the refusal cannot be shown")
async def test_cuda_without_a_gpu_refuses_to_start_and_says_why(tiny_artifact):
    engine = TorchEngine(tiny_artifact, device="cuda", dtype="bfloat16", num_kv_blocks=None)
    with pytest.raises(TorchDeviceError, match="no usable CUDA device"):
        await engine.start()
    await engine.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(device="tpu"), "device must be"), (dict(dtype="int4"), "dtype must be"),
    (dict(load_format="pt"), "load_format"), (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(device="cpu", num_kv_blocks=None), "num_kv_blocks is required on the CPU"),
])
def test_bad_settings_are_refused_at_construction(tiny_artifact, kwargs, message):
    kwargs = {"num_kv_blocks": 16, "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=message):
        TorchEngine(tiny_artifact, **kwargs)


async def test_steps_run_off_the_event_loop(make_engine):
    engine = await make_engine()
    loop_thread = asyncio.get_running_loop()
    seen = []
    execute = engine._runner.execute
    engine._runner.execute = lambda out: seen.append(asyncio._get_running_loop()) or execute(out)
    await engine.submit(req(engine, "t", TEXTS[2], 3)).collect()
    assert seen and all(loop is None for loop in seen) and loop_thread is not None


async def test_a_device_fault_stops_the_engine_but_running_out_of_memory_fails_only_the_step(make_engine):
    engine = await make_engine()
    execute = engine._runner.execute
    engine._runner.execute = lambda out: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory"))
    failed = await engine.submit(req(engine, "oom", TEXTS[0], 3)).collect()
    assert failed.finish_reason.value == "error" and engine.healthy
    engine._runner.execute = execute
    assert len((await engine.submit(req(engine, "ok", TEXTS[0], 3)).collect()).token_ids) == 3
    engine._runner.execute = lambda out: (_ for _ in ()).throw(RuntimeError("CUDA error: device-side assert"))
    fault = await engine.submit(req(engine, "fault", TEXTS[0], 3)).collect()
    assert fault.finish_reason.value == "error"
    await asyncio.wait_for(_until(lambda: not engine.healthy), 10)


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_a_decode_step_with_an_id_out_of_range_never_reaches_the_graphs(tiny_artifact):
    import numpy as np

    from inferd.engine.scheduler import SchedulerOutput
    from inferd.engine.sequence import Sequence
    from inferd.engine.torch.inputs import StepInputsError
    from inferd.engine.torch.model import TorchLlama
    from inferd.engine.torch.runner import TorchRunner

    runner = TorchRunner(TorchLlama.from_pretrained(tiny_artifact, device="cpu", dtype="float32"))
    runner.allocate(8, 4, gpu_memory_utilization=0.9, max_num_tokens=16, max_batch_size=2, max_model_len=32)
    runner.capture(2, 32, 4)
    for slot, block in ((32, 0), (3, 8)):     # the scratch slot; a block past the pool
        out = SchedulerOutput(seqs=[Sequence("s", [1, 2, 3, 4])], num_new_tokens=[1],
                              token_ids=np.array([4]), positions=np.array([3]), slot_mapping=np.array([slot]),
                              context_lens=[4], block_tables=[[block]], sample_rows=[0])
        with pytest.raises(StepInputsError, match="out of range"):
            runner.execute(out)


async def test_greedy_output_with_prompt_lookup_equals_the_reference_engines_without(copying_model):
    from inferd.engine.speculative import Speculation
    from tests.engine.speculative.copying import copying_prompts

    artifact, successor = copying_model
    prompts = copying_prompts(successor)

    async def run(engine, sampling: dict) -> list[tuple[int, ...]]:
        return await copying_outputs(engine, prompts, 30, **sampling)

    def build(cls, **kwargs):
        return cls(artifact, num_kv_blocks=256, block_size=4, max_num_tokens=32, **kwargs)

    async with started_engines(build) as make:
        reference = await make(ReferenceEngine)
        torch_engine = await make(TorchEngine, device="cpu", dtype="float32",
                                  speculative=Speculation(num_tokens=4, min_n=1, max_n=3))
        assert await run(torch_engine, {"temperature": 0.0}) == await run(reference, {"temperature": 0.0})
        kept = torch_engine.stats().speculation.accepted_tokens
        assert kept > 0
        sampled = await run(torch_engine, {"temperature": 1.0, "seed": 3})        # drafts verified on the host
        assert [len(s) for s in sampled] == [30] * len(prompts)
        assert torch_engine.stats().speculation.verifications > 0


async def test_an_int8_artifact_runs_int8_on_the_device_and_decodes_what_the_reference_engine_does(
        int8_artifact, tiny_artifact):
    def build(cls, artifact, **kwargs):
        return cls(artifact, num_kv_blocks=64, block_size=4, **kwargs)

    async with started_engines(build) as make:
        reference = await make(ReferenceEngine, int8_artifact)
        engine = await make(TorchEngine, int8_artifact, device="cpu", dtype="float32")
        full = await make(TorchEngine, tiny_artifact, device="cpu", dtype="float32")
        assert engine.info.precision == "int8" and full.info.precision == "float32"
        assert engine.model.weight_bytes() < 0.3 * full.model.weight_bytes()
        assert await outputs(engine) == await outputs(reference)


async def test_a_draft_model_on_the_torch_engine_keeps_the_greedy_output_and_drafts_most_tokens(
        copying_model, tmp_path):
    from inferd.artifacts.build.copying import build_copying
    from inferd.engine.speculative import Speculation
    from tests.engine.speculative.copying import copying_prompts

    artifact, successor = copying_model
    draft = build_copying("tiny", tmp_path / "draft", draft=True)[0]
    prompts = copying_prompts(successor)

    async def run(engine) -> list[tuple[int, ...]]:
        return await copying_outputs(engine, prompts, 20, temperature=0.0)

    def build(cls, **kwargs):
        return cls(artifact, num_kv_blocks=256, block_size=4, max_num_tokens=32, **kwargs)

    async with started_engines(build) as make:
        reference = await make(ReferenceEngine)
        engine = await make(TorchEngine, device="cpu", dtype="float32",
                            speculative=Speculation(method="draft_model", num_tokens=3, draft_dir=str(draft)))
        assert await run(engine) == await run(reference)
        stats = engine.stats().speculation
        assert stats.accepted_tokens > 0.8 * stats.draft_tokens > 0


async def copying_outputs(engine, prompts: list[list[int]], max_tokens: int, **sampling) -> list[tuple[int, ...]]:
    """Each prompt's output, submitted together (ignore_eos: every output is max_tokens long)."""
    streams = [engine.submit(GenerationRequest(
        request_id=f"c{i}", prompt_token_ids=tuple(p), tenant=f"c{i}",
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling))) for i, p in enumerate(prompts)]
    return [tuple((await s.collect()).token_ids) for s in streams]
