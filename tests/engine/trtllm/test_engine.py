"""TrtllmEngine against the tensorrt_llm test double (tests/trtllm_double), plus the double's own fidelity.

The shared engine behaviour is in test_conformance.py; here: how the backend drives the LLM API,
TensorRT-LLM specific failures, LoRA, tenant isolation, capacity vs the executor's queue, the build.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pytest

from inferd.artifacts.manifest import ArtifactError, verify_artifact
from inferd.engine.base import EngineUnavailable, InvalidRequest
from inferd.engine.trtllm.engine import TrtllmEngine, TrtllmNotInstalled
from inferd.types import FinishReason, GenerationRequest, SamplingParams
from tests.trtllm_double.harness import make_engine_dir, make_lora_dir, trtllm_on_double, use_double

TIMEOUT_S = 20.0
PROMPT = "Paged attention keeps the KV cache in blocks of tokens"


def request(engine, rid: str, text: str = PROMPT, tenant: str = "local", lora: str | None = None, **sampling):
    sampling.setdefault("ignore_eos", True)
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(text)),
                             sampling=SamplingParams(**sampling), tenant=tenant, lora=lora)


async def run(engine, req):
    return await asyncio.wait_for(engine.submit(req).collect(), TIMEOUT_S)


def calls(controls, name: str) -> list[dict]:
    return [kwargs for method, kwargs in controls.calls if method == name]


# -- without TensorRT-LLM ------------------------------------------------------------------------------

async def test_start_without_tensorrt_llm_says_how_to_install_on_a_gpu_node(tmp_path: Path) -> None:
    assert "tensorrt_llm" not in sys.modules
    engine = TrtllmEngine(tmp_path)        # the module and the constructor need no tensorrt_llm
    with pytest.raises(TrtllmNotInstalled, match="GPU node.*pip install 'inferd\\[trtllm\\]'"):
        await engine.start()
    assert not engine.healthy
    with pytest.raises(EngineUnavailable):
        engine.submit(GenerationRequest(request_id="x", prompt_token_ids=(1,), sampling=SamplingParams()))


def test_constructor_rejects_bad_config_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scheduler_policy"):
        TrtllmEngine(tmp_path, scheduler_policy="fcfs")
    with pytest.raises(ValueError, match="fraction"):
        TrtllmEngine(tmp_path, kv_cache_free_gpu_memory_fraction=1.0)


# -- how the LLM API is driven --------------------------------------------------------------------------

async def test_loads_the_tensorrt_engine_llm_with_config_and_explicit_tokenizer(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path, engine_dir_kwargs={"copy_tokenizer": False},
                                tokenizer_dir=tiny_artifact, kv_cache_max_tokens=None,
                                kv_cache_free_gpu_memory_fraction=0.01, scheduler_policy="max_utilization",
                                enable_block_reuse=False, enable_chunked_prefill=False) as engine:
        from tensorrt_llm._double import controls
        from tensorrt_llm.llmapi import CapacitySchedulerPolicy

        (ctor,) = calls(controls, "LLM")
        assert type(engine._llm).__module__ + "." + type(engine._llm).__qualname__ == "tensorrt_llm.llmapi.llm._TrtLLM"
        assert ctor["model"] == str(engine.engine_dir) and ctor["tokenizer"] == str(tiny_artifact)
        kv = ctor["kv_cache_config"]
        assert (kv.free_gpu_memory_fraction, kv.max_tokens, kv.enable_block_reuse) == (0.01, None, False)
        assert ctor["scheduler_config"].capacity_scheduler_policy is CapacitySchedulerPolicy.MAX_UTILIZATION
        assert ctor["enable_chunked_prefill"] is False and ctor["max_batch_size"] == 4
        # the KV size comes from the executor's stats (0.01 of the double's 65536 "GPU" tokens, 16 per block)
        assert engine.info.num_kv_blocks == int(0.01 * 65536) // 16


async def test_greedy_request_maps_to_top_k_1_with_max_tokens_and_tenant_salt(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        controls.calls.clear()
        final = await run(engine, request(engine, "g", tenant="acme", max_tokens=40, temperature=0.0,
                                          stop_token_ids=(7,)))
        (call,) = calls(controls, "generate_async")
        sp = call["sampling_params"]
        assert sp.max_tokens == 40 and sp.top_k == 1 and sp.temperature is None and sp.top_p is None
        assert sp.detokenize is False and sp.ignore_eos is True and 7 in sp.stop_token_ids
        assert call["streaming"] is True and call["cache_salt"] == "acme" and call["lora_request"] is None
        assert final.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


async def test_sampled_request_passes_temperature_top_p_top_k_and_a_seed(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        controls.calls.clear()
        await run(engine, request(engine, "s1", max_tokens=8, temperature=0.7, top_p=0.9, top_k=0, seed=5))
        await run(engine, request(engine, "s2", max_tokens=8, temperature=0.7, top_p=0.9, top_k=40))
        first, second = (c["sampling_params"] for c in calls(controls, "generate_async"))
        assert (first.temperature, first.top_p, first.top_k, first.seed) == (0.7, 0.9, 0, 5)
        assert second.top_k == 40 and isinstance(second.seed, int)   # no seed: a fresh one, not C++'s fixed 0


async def test_any_seed_reaches_the_executor_as_an_unsigned_64_bit_value(tiny_artifact, tmp_path) -> None:
    # The C++ seed is a uint64: a negative or oversized seed must be mapped, not fail the request.
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        controls.calls.clear()
        finals = [await run(engine, request(engine, f"seed{i}", max_tokens=4, temperature=0.8, seed=seed))
                  for i, seed in enumerate((-1, 2**64 + 7, 2**70))]
        seeds = [c["sampling_params"].seed for c in calls(controls, "generate_async")]
        assert seeds == [2**64 - 1, 7, 0]
        assert [f.finish_reason for f in finals] == [FinishReason.LENGTH] * 3


async def test_tenants_never_share_prefix_blocks(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        long_prompt = PROMPT * 3
        first = await run(engine, request(engine, "a1", long_prompt, tenant="a", max_tokens=2))
        again = await run(engine, request(engine, "a2", long_prompt, tenant="a", max_tokens=2))
        other = await run(engine, request(engine, "b1", long_prompt, tenant="b", max_tokens=2))
        assert first.usage.cached_tokens == 0 and again.usage.cached_tokens >= engine.info.block_size
        assert other.usage.cached_tokens == 0


# -- failures -------------------------------------------------------------------------------------------

async def test_request_error_fails_only_that_request(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        running = engine.submit(request(engine, "ok", max_tokens=30))
        await asyncio.wait_for(running.__anext__(), TIMEOUT_S)   # enqueued before the failure is armed
        controls.fail_next_requests = 1
        failed = await run(engine, request(engine, "bad", max_tokens=5))
        assert failed.finish_reason is FinishReason.ERROR and "injected request failure" not in failed.error
        assert "see server logs for request bad" in failed.error
        assert (await asyncio.wait_for(running.collect(), TIMEOUT_S)).finish_reason is FinishReason.LENGTH
        assert engine.healthy and engine.capacity().free_slots == engine.info.max_batch_size


async def test_executor_failure_ends_every_stream_and_refuses_new_requests(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        streams = [engine.submit(request(engine, f"r{i}", max_tokens=200)) for i in range(3)]
        await asyncio.gather(*(asyncio.wait_for(s.__anext__(), TIMEOUT_S) for s in streams))
        controls.crash_with = RuntimeError("worker process died")
        finals = await asyncio.gather(*(asyncio.wait_for(s.collect(), TIMEOUT_S) for s in streams))
        assert [f.finish_reason for f in finals] == [FinishReason.ERROR] * 3   # none left hanging
        assert not engine.healthy
        with pytest.raises(EngineUnavailable, match="worker process died"):
            engine.submit(request(engine, "after", max_tokens=2))


async def test_llm_shutting_down_marks_engine_unavailable(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        engine._llm.shutdown()                 # as if the executor went away underneath us
        with pytest.raises(EngineUnavailable, match="LLM is shutting down"):
            engine.submit(request(engine, "late", max_tokens=2))
        assert not engine.healthy


async def test_value_error_from_generate_async_is_an_invalid_request(tiny_artifact, tmp_path, monkeypatch) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        def reject(inputs, **kwargs):
            raise ValueError("The sum of prompt length (9), query length (0) and max_tokens (99) should not "
                             "exceed max_seq_len (64)")
        monkeypatch.setattr(engine._llm, "generate_async", reject)
        with pytest.raises(InvalidRequest) as info:
            engine.submit(request(engine, "v", max_tokens=4))
        assert info.value.param == "max_tokens" and engine.healthy and not engine._reqs


async def test_bad_requests_are_refused_at_submit_before_they_reach_the_executor(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        vocab = engine.tokenizer.vocab_size
        prompt = tuple(engine.tokenizer.encode(PROMPT))
        bad = {
            "prompt": GenerationRequest(request_id="oov", prompt_token_ids=prompt + (vocab,),
                                        sampling=SamplingParams(max_tokens=4)),
            "temperature": request(engine, "t", max_tokens=4, temperature=-0.5),
            "top_p": request(engine, "p", max_tokens=4, temperature=0.7, top_p=0.0),
            "stop": request(engine, "s", max_tokens=4, stop=("",)),
            "stop_token_ids": request(engine, "i", max_tokens=4, stop_token_ids=(vocab,)),
        }
        controls.calls.clear()
        for param, req in bad.items():
            with pytest.raises(InvalidRequest) as refused:
                engine.submit(req)
            assert refused.value.param == param
        assert calls(controls, "generate_async") == [] and not engine._reqs
        # an out-of-vocabulary id that did reach the executor would have crashed it for everyone
        final = await run(engine, request(engine, "after", max_tokens=3))
        assert final.finish_reason is FinishReason.LENGTH and engine.healthy


async def test_stop_string_ends_the_stream_at_once_and_holds_capacity_until_the_executor_lets_go(
        tiny_artifact, tmp_path, monkeypatch) -> None:
    from inferd.engine.trtllm import stream as trtllm_stream

    monkeypatch.setattr(trtllm_stream, "ABORT_GRACE_S", 1.0)
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        from tensorrt_llm._double import controls

        free_run = await run(engine, request(engine, "free", max_tokens=40, temperature=0.0))
        text = free_run.text
        stop = text[len(text) // 3:len(text) // 3 + 3]
        controls.drop_cancel_replies = True          # TensorRT-LLM never confirms the cancel
        req = request(engine, "stopped", max_tokens=40, temperature=0.0, stop=(stop,))
        stream = engine.submit(req)
        tracked = engine._reqs[req.request_id]
        final = await asyncio.wait_for(stream.collect(), TIMEOUT_S)
        assert final.finish_reason is FinishReason.STOP and final.text == text[:text.index(stop)]
        assert final.usage.completion_tokens == len(final.token_ids) < 40
        # the executor has not confirmed: the request still holds its slot and KV reservation
        assert req.request_id in engine._reqs
        assert engine.capacity().free_slots == engine.info.max_batch_size - 1
        await asyncio.wait({tracked.task}, timeout=TIMEOUT_S)   # the overdue timer gives up on the reply
        assert not engine._reqs and engine.capacity().free_slots == engine.info.max_batch_size
        engine.abort(req.request_id)                 # ignored: long gone


async def test_timing_splits_queue_and_prefill_with_the_executors_perf_metrics(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path, step_time_s=0.02) as engine:
        from tensorrt_llm._double import controls

        controls.calls.clear()
        timed = (await run(engine, request(engine, "pm", max_tokens=3))).timing
        assert calls(controls, "generate_async")[0]["sampling_params"].return_perf_metrics is True
        # the prefill iteration took >= 20 ms between scheduling and the first token
        assert timed.first_token - timed.first_scheduled >= 0.019
        assert timed.submitted <= timed.first_scheduled <= timed.first_token <= timed.finished
        controls.perf_metrics = False               # a TensorRT-LLM that attaches none: no prefill split
        untimed = (await run(engine, request(engine, "none", max_tokens=3))).timing
        assert untimed.submitted <= untimed.first_scheduled == untimed.first_token <= untimed.finished


# -- LoRA -----------------------------------------------------------------------------------------------

async def test_lora_adapter_is_sent_per_request_and_unknown_adapters_are_rejected(tiny_artifact, tmp_path) -> None:
    adapter = make_lora_dir(tmp_path / "loras" / "support")
    async with trtllm_on_double(tiny_artifact, tmp_path, engine_dir_kwargs={"lora": True},
                                lora_adapters={"support": str(adapter)}) as engine:
        from tensorrt_llm._double import controls

        controls.calls.clear()
        final = await run(engine, request(engine, "l", lora="support", max_tokens=3))
        lora = calls(controls, "generate_async")[0]["lora_request"]
        assert (lora.lora_name, lora.lora_int_id, lora.lora_path) == ("support", 1, str(adapter))
        assert final.finish_reason is FinishReason.LENGTH
        with pytest.raises(InvalidRequest) as unknown:
            engine.submit(request(engine, "u", lora="nope", max_tokens=3))
        assert unknown.value.param == "model"


async def test_lora_on_an_engine_built_without_the_plugin_fails_that_request(tiny_artifact, tmp_path) -> None:
    adapter = make_lora_dir(tmp_path / "lora-a")
    async with trtllm_on_double(tiny_artifact, tmp_path, lora_adapters={"a": str(adapter)}) as engine:
        final = await run(engine, request(engine, "l", lora="a", max_tokens=3))
        assert final.finish_reason is FinishReason.ERROR and "see server logs" in final.error and engine.healthy


# -- capacity and stats ---------------------------------------------------------------------------------

async def test_admitting_by_capacity_keeps_the_executor_queue_empty(tiny_artifact, tmp_path) -> None:
    # 20 blocks of 16 tokens; each request reserves 7 (prompt + 96 tokens): KV, not slots, is the limit.
    async with trtllm_on_double(tiny_artifact, tmp_path, kv_cache_max_tokens=20 * 16) as engine:
        samples: list[dict] = []
        on_stats = engine._on_stats
        engine._on_stats = lambda item: (samples.append(item), on_stats(item))
        pending = [request(engine, f"c{i}", f"{PROMPT} {i}", max_tokens=96) for i in range(8)]
        need = -(-(len(pending[0].prompt_token_ids) + 96) // engine.info.block_size)
        streams, peak = [], 0
        while pending:                                  # what admission does: release only into room
            cap = engine.capacity()
            if cap.free_slots and cap.free_kv_blocks >= need:
                streams.append(engine.submit(pending.pop(0)))
                peak = max(peak, len(engine._reqs))
                continue
            running = [asyncio.ensure_future(s.collect()) for s in streams if not s.finished]
            await asyncio.wait(running, timeout=TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            for task in running:
                task.cancel()
        await asyncio.gather(*(asyncio.wait_for(s.collect(), TIMEOUT_S) for s in streams if not s.finished))
        assert peak == 20 // need                       # KV-bound concurrency was used, not exceeded
        assert samples and max(s["numQueuedRequests"] for s in samples) == 0
        assert engine.capacity().free_kv_blocks == engine.info.num_kv_blocks == 20


async def stats_samples_until(engine, done) -> None:
    """Wait for stats samples (the double forwards them every 0.2 s, like the real worker) until `done()`."""
    while not done():
        engine._ledger.sample_applied.clear()
        await asyncio.wait_for(engine._ledger.sample_applied.wait(), TIMEOUT_S)


async def test_stats_come_from_executor_iterations(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        before = engine.stats()
        final = await run(engine, request(engine, "st", max_tokens=12))
        await stats_samples_until(engine, lambda: engine.stats().steps_total > before.steps_total)
        stats = engine.stats()
        assert stats.steps_total > before.steps_total and stats.kv_blocks_total == engine.info.num_kv_blocks
        assert stats.prompt_tokens_total - before.prompt_tokens_total == final.usage.prompt_tokens
        assert stats.generation_tokens_total - before.generation_tokens_total == 12
        assert stats.running == stats.waiting == 0 and stats.step_latency_s >= 0


async def test_step_observer_gets_each_iteration_latency_in_seconds(tiny_artifact, tmp_path) -> None:
    async with trtllm_on_double(tiny_artifact, tmp_path, step_time_s=0.004) as engine:
        observed: list[float] = []
        samples: list[dict] = []
        on_stats = engine._on_stats
        engine._on_stats = lambda item: (samples.append(item), on_stats(item))
        engine.step_observer = observed.append
        await run(engine, request(engine, "obs", max_tokens=12))
        # 12 tokens take at least 12 iterations; wait for the sample that saw the request leave
        await stats_samples_until(engine, lambda: len(samples) >= 12 and samples[-1]["numActiveRequests"] == 0)
        assert observed == [s["iterLatencyMS"] / 1000.0 for s in samples]
        assert min(observed) >= 0.004


# -- the build ------------------------------------------------------------------------------------------

def build_args(hf_dir: Path, engines_root: Path, **overrides) -> argparse.Namespace:
    from inferd.artifacts.build import trtllm as builder

    parser = argparse.ArgumentParser()
    builder.add_arguments(parser)
    args = parser.parse_args([])
    args.hf_dir, args.name, args.engines_root = hf_dir, "tiny-trt", engines_root
    vars(args).update(overrides)
    return args


def test_build_without_tensorrt_llm_fails_at_once_with_install_hint(tiny_artifact, tmp_path, capsys) -> None:
    from inferd.artifacts.build import trtllm as builder

    assert builder.main(build_args(tiny_artifact, tmp_path / "engines")) == 1
    assert "GPU node" in capsys.readouterr().err and not (tmp_path / "engines").exists()


async def test_build_publishes_a_verified_artifact_the_engine_serves(tiny_artifact, tmp_path) -> None:
    from inferd.artifacts.build import trtllm as builder

    with use_double():
        path = await asyncio.to_thread(builder.build, build_args(tiny_artifact, tmp_path / "engines",
                                                                 max_batch_size=4, max_num_tokens=64,
                                                                 max_seq_len=256))
        manifest = verify_artifact(path)
        assert manifest.target == "trtllm" and manifest.build["max_seq_len"] == 256
        assert {"config.json", "rank0.engine", "tokenizer.json"} <= set(manifest.files)
        engine = TrtllmEngine(path, kv_cache_max_tokens=1024)
        await engine.start()
        try:
            await engine.warmup()
            assert (engine.info.model_name, engine.info.version) == ("tiny-trt", manifest.version)
            final = await run(engine, request(engine, "b", max_tokens=5))
            assert final.finish_reason is FinishReason.LENGTH and len(final.token_ids) == 5
        finally:
            await engine.close()


async def test_a_tampered_artifact_fails_start_naming_the_file(tiny_artifact, tmp_path) -> None:
    from inferd.artifacts.build import trtllm as builder

    with use_double() as controls:
        path = await asyncio.to_thread(builder.build, build_args(tiny_artifact, tmp_path / "engines",
                                                                 max_batch_size=4, max_seq_len=256))
        with open(path / "rank0.engine", "ab") as engine_file:
            engine_file.write(b"tampered")
        controls.calls.clear()
        engine = TrtllmEngine(path, kv_cache_max_tokens=1024)
        with pytest.raises(ArtifactError, match="rank0.engine") as refused:
            await engine.start()
        assert refused.value.file == "rank0.engine" and not engine.healthy
        assert calls(controls, "LLM") == []                 # nothing was loaded from the altered files
        unchecked = TrtllmEngine(path, kv_cache_max_tokens=1024, verify=False)   # the operator's choice
        await unchecked.start()
        try:
            assert unchecked.healthy and unchecked.info.version == path.name
        finally:
            await unchecked.close()


async def test_verify_refuses_a_bare_engine_directory_and_says_how_to_serve_it(tiny_artifact, tmp_path) -> None:
    with use_double():
        engine = TrtllmEngine(make_engine_dir(tmp_path / "bare", tiny_artifact))
        with pytest.raises(ArtifactError, match="verify = false") as refused:
            await engine.start()
        assert refused.value.file == "manifest.toml"


def test_factory_passes_the_models_verify_setting(tmp_path) -> None:
    from inferd.config.root import parse_config
    from inferd.models.factory import build_engine

    for verify in (True, False):
        cfg = parse_config({"models": {"m": {"backend": "trtllm", "verify": verify,
                                             "trtllm": {"engine_dir": str(tmp_path / "eng")}}}})
        assert build_engine("m", cfg.models["m"], cfg.server)._verify is verify


def test_builder_uses_only_public_names_of_other_inferd_modules() -> None:
    import ast

    from inferd.artifacts.build import trtllm as builder

    tree = ast.parse(Path(builder.__file__).read_text())
    private = [f"{node.module}.{alias.name}" for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inferd.")
               for alias in node.names if alias.name.startswith("_")]
    assert private == []


# -- the double itself mirrors the real API -------------------------------------------------------------

def test_double_configs_are_strict_and_defaults_are_the_real_ones(tiny_artifact, tmp_path) -> None:
    with use_double():
        from tensorrt_llm import SamplingParams as TrtSamplingParams
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.llmapi import KvCacheConfig, SchedulerConfig

        with pytest.raises(ValueError, match="Extra inputs"):
            KvCacheConfig(free_gpu_memory_fraction=0.5, block_size=16)
        with pytest.raises(ValueError, match="Extra inputs"):
            SchedulerConfig(policy="fcfs")
        sp = TrtSamplingParams()
        assert sp.max_tokens == 32 and not hasattr(sp, "__dict__")
        with pytest.raises(TypeError):
            TrtSamplingParams(None, None, 10)          # kw_only
        engine_dir = make_engine_dir(tmp_path / "e", tiny_artifact)
        with pytest.raises(ValueError, match="got invalid argument: kv_cache_max_tokens"):
            LLM(model=str(engine_dir), kv_cache_max_tokens=10)


def test_double_pytorch_llm_refuses_engine_directories(tiny_artifact, tmp_path) -> None:
    with use_double():
        import tensorrt_llm

        engine_dir = make_engine_dir(tmp_path / "e", tiny_artifact)
        with pytest.raises(AssertionError, match="_tensorrt_engine"):
            tensorrt_llm.LLM(model=str(engine_dir))


async def test_double_result_queues_need_the_running_loop_and_stream_in_place(tiny_artifact, tmp_path) -> None:
    with use_double() as controls:
        from tensorrt_llm import SamplingParams as TrtSamplingParams
        from tensorrt_llm._tensorrt_engine import LLM

        controls.step_time_s = 0.002   # slow enough that the abort lands mid-generation
        llm = await asyncio.to_thread(LLM, model=str(make_engine_dir(tmp_path / "e", tiny_artifact)))
        try:
            assert [s async for s in llm.get_stats_async(timeout=0.1)] == []   # nothing before a request
            with pytest.raises(TypeError):
                llm.generate_async([1, 2, 3], TrtSamplingParams())             # keywords after inputs
            out = llm.generate_async([5, 6, 7], sampling_params=TrtSamplingParams(max_tokens=50), streaming=True)
            seen = []
            async for step in out:
                seen.append(step)
                if len(seen) == 2:
                    step.abort()
            assert all(s is out for s in seen) and out.outputs[0].finish_reason == "cancelled"
            stats = [s async for s in llm.get_stats_async(timeout=0.5)]
            assert stats and {"kvCacheStats", "inflightBatchingStats", "numQueuedRequests", "iter"} <= set(stats[0])
            assert [s async for s in llm.get_stats_async(timeout=0.1)] == []   # ended after idle timeout
            off_loop = await asyncio.to_thread(llm.generate_async, [5, 6, 7], sampling_params=TrtSamplingParams())
            with pytest.raises(AssertionError, match="event loop was not present"):
                await off_loop.aresult()
        finally:
            await asyncio.to_thread(llm.shutdown)
        with pytest.raises(RuntimeError, match="LLM is shutting down"):
            llm.generate_async([1], sampling_params=TrtSamplingParams())


async def test_close_returns_even_when_the_stats_task_swallows_its_cancel(tiny_artifact, tmp_path) -> None:
    # asyncio.wait_for (3.10/3.11) can swallow a cancel that races its result; the stats loop then goes
    # back to waiting for a submission that never comes. close() must still return.
    async with trtllm_on_double(tiny_artifact, tmp_path) as engine:
        engine._stats_task.cancel()

        async def swallowing_stats_loop() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass                                  # the swallowed cancel
            await engine._stats_wakeup.wait()         # where the real loop waits between streams

        engine._stats_task = asyncio.get_running_loop().create_task(swallowing_stats_loop())
        await asyncio.sleep(0)
        await asyncio.wait_for(engine.close(), TIMEOUT_S)
        assert engine._stats_task.done()


async def test_an_eagle_build_and_its_engine_pass_the_eagle_config_through(tiny_artifact, tmp_path) -> None:
    from inferd.artifacts.build import trtllm as builder

    eagle = tmp_path / "eagle-head"
    eagle.mkdir()
    with use_double() as controls:
        path = await asyncio.to_thread(builder.build, build_args(tiny_artifact, tmp_path / "engines", max_seq_len=256,
                                                                 eagle_dir=eagle, max_draft_len=3))
        manifest = verify_artifact(path)
        assert (manifest.build["speculative"], manifest.build["max_draft_len"]) == ("eagle", 3)
        controls.calls.clear()
        engine = TrtllmEngine(path, kv_cache_max_tokens=1024, eagle=(str(eagle), 3))
        await engine.start()
        try:
            (served,) = calls(controls, "LLM")
            spec = served["speculative_config"]
            assert (spec.decoding_type, spec.max_draft_len, spec.speculative_model_dir) == ("Eagle", 3, str(eagle))
        finally:
            await engine.close()


def test_the_tensorrt_backend_refuses_ngram_speculation_as_tensorrt_llm_does() -> None:
    with use_double():
        from tensorrt_llm.llmapi import NGramDecodingConfig
        from tensorrt_llm.llmapi.quant_spec import validate_quant_and_speculation

        with pytest.raises(ValueError, match="does not support backend tensorrt"):
            validate_quant_and_speculation({"speculative_config": NGramDecodingConfig(max_draft_len=4)})


def test_each_iterations_speculative_decoding_stats_add_up_to_the_engines_series() -> None:
    from inferd.engine.base import EngineInfo
    from inferd.engine.trtllm.stats import RequestLedger

    info = EngineInfo(backend="trtllm", model_name="m", version="v", max_model_len=64, block_size=32,
                      num_kv_blocks=8, max_batch_size=4, max_num_tokens=64)
    ledger = RequestLedger(speculating=True)
    assert RequestLedger().stats(info).speculation is None
    for drafted, accepted, rows in ((8, 5, 2), (12, 9, 3)):
        ledger.apply_sample({"iter": 1, "specDecodingStats": {"numDraftTokens": drafted, "numAcceptedTokens": accepted,
                                                              "numRequestsWithDraftTokens": rows}}, info, None)
    ledger.apply_sample({"iter": 2, "specDecodingStats": None}, info, None)      # absent: serialized as null
    s = ledger.stats(info).speculation
    assert (s.draft_tokens, s.accepted_tokens, s.verifications) == (20, 14, 5)
