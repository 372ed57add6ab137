"""The paged decode kernel against plain torch, run under Triton's CPU interpreter in a subprocess
(triton_interpret_cases.py: TRITON_INTERPRET must be set before triton is imported); its compile for
Hopper at the Llama-3-8B shape (no GPU needed: the ptxas in Triton's wheel); its argument checks and split
choice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inferd.engine.torch import triton_attention
from inferd.engine.torch.triton_attention import decode_splits, paged_decode_attention

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


@pytest.fixture(scope="module")
def interpreted_errors() -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.torch.triton_interpret_cases"], check=False,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"interpreter run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [
    "float32_gqa4_block16_splits1", "float32_gqa4_block16_splits3", "float32_gqa4_block16_splitsauto",
    "float16_gqa4_block16_splits1", "float16_gqa4_block16_splits3",
    "bfloat16_gqa4_block32_splits1", "bfloat16_gqa4_block32_splits2",
    "float32_mha_block32_splits1", "float32_mha_block32_splits2",
    "float16_mha_block16_dim24_splits1", "float16_mha_block16_dim24_splits4",
    "float32_gqa2_block16_dim8_splits1", "float32_gqa2_block16_dim8_splits2",
])
def test_kernel_matches_softmax_over_gathered_blocks(interpreted_errors, case):
    # ragged lengths 1, a block boundary, several tiles, a zero-length padding row; NaN past each context
    assert interpreted_errors[case] <= TOLERANCE[case.split("_")[0]]


def test_rows_of_only_padding_are_zeros_after_the_split_merge(interpreted_errors):
    assert interpreted_errors["all_padding_splits2"] == 0.0


def test_out_argument_is_written_in_place(interpreted_errors):
    assert interpreted_errors["out_param"] <= TOLERANCE["float16"]


def test_the_interpreter_run_took_the_split_path_for_a_small_batch(interpreted_errors):
    assert interpreted_errors["auto_splits_small_batch"] > 1


def test_a_large_batch_is_not_split_and_a_small_one_is_split_up_to_its_tiles():
    cpu = torch.device("cpu")
    assert decode_splits(256, 8, 64, 16, cpu) == 1
    assert decode_splits(1, 1, 64, 16, cpu) == 16      # bounded by the split cap
    assert decode_splits(1, 1, 4, 16, cpu) == 1        # 64 tokens: one tile, nothing to split
    assert decode_splits(1, 1, 12, 16, cpu) == 2       # three tiles: rounded down to a power of two


def _inputs(dtype=torch.float16, heads=4, kv_heads=2):
    q = torch.zeros(2, heads, 16, dtype=dtype)
    cache = torch.zeros(3, 16, kv_heads, 16, dtype=dtype)
    return q, cache, cache.clone(), torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)


def test_mismatched_dtypes_are_rejected():
    q, k, v, tables, lens = _inputs()
    with pytest.raises(TypeError):
        paged_decode_attention(q.float(), k, v, tables, lens)
    with pytest.raises(TypeError):
        paged_decode_attention(q, k, v, tables.long(), lens)


def test_heads_that_do_not_divide_into_kv_heads_are_rejected():
    q, k, v, tables, lens = _inputs(heads=3)
    with pytest.raises(ValueError):
        paged_decode_attention(q, k, v, tables, lens)


def test_a_block_table_for_another_batch_is_rejected():
    q, k, v, tables, lens = _inputs()
    with pytest.raises(ValueError):
        paged_decode_attention(q, k, v, tables[:1], lens)


def test_an_out_of_the_wrong_shape_is_rejected():
    q, k, v, tables, lens = _inputs()
    with pytest.raises(ValueError):
        paged_decode_attention(q, k, v, tables, lens, out=torch.empty(1, 4, 16, dtype=q.dtype))


def _compile_for_hopper(kernel, args: dict, constants: dict, launch: dict) -> str:
    """PTX for sm_90, specialised as Triton's JIT specialises a launch: pointers and ints divisible by 16
    carry that hint, ints equal to 1 become constants."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this triton has no ASTSource/GPUTarget")
    if not (Path(triton_attention.triton.__file__).parent / "backends/nvidia/bin/ptxas").exists():
        pytest.skip("this triton wheel carries no ptxas")
    signature, attrs, constexprs = {}, {}, dict(constants)
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
            continue
        kind, value = args[name]
        if value == 1:
            signature[name], constexprs[name] = "constexpr", 1
            continue
        signature[name] = kind
        if value is None or value % 16 == 0:
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton_attention.triton.compile(source, target=GPUTarget("cuda", 90, 32), options=launch).asm["ptx"]


@pytest.mark.parametrize("splits", [1, 4])
def test_kernels_compile_for_hopper_and_read_kv_in_wide_accesses(splits):
    # Llama-3-8B: 32 query heads over 8 kv heads of dim 128, 16-token pages, q a slice of the fused qkv
    heads, kv_heads, dim, block_size = 32, 8, 128, 16
    part = "*fp32" if splits > 1 else "*bf16"
    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "BlockTables": "*i32", "ContextLens": "*i32",
                "Out": "*bf16", "PartOut": part, "PartLse": part}
    strides = {"stride_qb": (heads + 2 * kv_heads) * dim, "stride_qh": dim, "stride_kb": block_size * kv_heads * dim,
               "stride_kt": kv_heads * dim, "stride_kh": dim, "stride_vb": block_size * kv_heads * dim,
               "stride_vt": kv_heads * dim, "stride_vh": dim, "stride_bt": 256, "stride_ob": heads * dim,
               "stride_oh": dim, "stride_pb": heads * splits, "stride_ph": splits, "stride_ps": 1}
    args = {name: (kind, None) for name, kind in pointers.items()} | {n: ("i32", v) for n, v in strides.items()}
    ptx = _compile_for_hopper(triton_attention._split_partial_kernel, args, triton_attention._partial_constants(
        heads, kv_heads, dim, block_size, splits, torch.bfloat16), triton_attention._PARTIAL_LAUNCH)
    # 16-bit scalar loads would cap the kernel far below HBM bandwidth; K/V must stream in 16-byte copies
    assert "ld.global.b16" not in ptx and "ld.global.u16" not in ptx
    assert "cp.async" in ptx or "ld.global.v4" in ptx
    if splits > 1:
        merge_args = {"PartOut": ("*fp32", None), "PartLse": ("*fp32", None), "Out": ("*bf16", None),
                      "stride_pb": ("i32", heads * splits), "stride_ph": ("i32", splits), "stride_ps": ("i32", 1),
                      "stride_ob": ("i32", heads * dim), "stride_oh": ("i32", dim)}
        _compile_for_hopper(triton_attention._merge_splits_kernel, merge_args,
                            triton_attention._merge_constants(dim, splits), triton_attention._MERGE_LAUNCH)
