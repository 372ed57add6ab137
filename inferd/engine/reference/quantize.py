"""Int8 weight-only versions of reference artifacts, made from a float one (`build_engines.py --quantize int8`).

Every projection of every layer, the embedding and the LM head become int8 with a float32 scale per output
channel (`<tensor>_scale`; inferd.engine.reference.int8 reads them); norms and biases stay float32. The
result is a version of the same artifact name: its manifest's `[build]` says `precision = "int8"` and
which float version it came from, and LATEST keeps pointing where it did, so a config serves the int8
version only where it names it (a precision tier, docs/models.md).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from inferd.artifacts import ArtifactError, Progress, publish_artifact, read_manifest, staging_dir
from inferd.artifacts.build import (INT8_QUANT_METHOD, architecture_from_config, read_json_object,
                                   sampling_from_generation_config)
from inferd.engine.reference.int8 import Int8Matrix
from inferd.engine.reference.weights import SCALE_SUFFIX, Checkpoint

QUANTIZED_SUFFIXES = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")
PRECISIONS = ("int8",)
_COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
           "chat_template.jinja")


def quantized_tensors(checkpoint: Checkpoint) -> tuple[dict[str, np.ndarray], int]:
    """The checkpoint's tensors with its matrices int8 (plus scales); and its parameter count."""
    tensors: dict[str, np.ndarray] = {}
    params = 0
    for name in checkpoint:
        w = checkpoint.get(name)
        params += w.size
        if name.endswith(QUANTIZED_SUFFIXES) and w.ndim == 2:
            q = Int8Matrix.quantize(w)
            tensors[name], tensors[name + SCALE_SUFFIX] = q.q, q.scale
        else:
            tensors[name] = w
    return tensors, params


def quantize_artifact(source: Path, engines_root: Path, precision: str = "int8",
                      progress: Progress | None = None) -> Path:
    """engines/<source's name>/<version>: `source` (a float reference artifact) with int8 weights."""
    if precision not in PRECISIONS:
        raise ArtifactError(f"--quantize {precision}: the reference target builds {', '.join(PRECISIONS)}")
    say = progress or (lambda message: None)
    source = Path(source)
    manifest = read_manifest(source)
    if manifest.target != "reference" or manifest.embedding is not None:
        raise ArtifactError(f"{source}: only a generative reference artifact can be quantized here")
    if manifest.build.get("precision"):
        raise ArtifactError(f"{source}: already {manifest.build['precision']}")
    config = read_json_object(source / "config.json")
    say(f"{manifest.name}: quantizing {manifest.version} to int8 (weight-only, per output channel)")
    tensors, params = quantized_tensors(Checkpoint(source))
    config["quantization_config"] = {"quant_method": INT8_QUANT_METHOD, "bits": 8,
                                     "granularity": "per_output_channel", "scale_suffix": SCALE_SUFFIX}
    generation = read_json_object(source / "generation_config.json") if (
        source / "generation_config.json").is_file() else {}
    with staging_dir(engines_root, manifest.name) as staging:
        for file in _COPIED:
            if (source / file).is_file():
                shutil.copyfile(source / file, staging / file)
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        path = publish_artifact(staging, engines_root, name=manifest.name, target="reference",
                                source=manifest.source, revision=manifest.revision,
                                architecture=architecture_from_config(config, params),
                                sampling=sampling_from_generation_config(generation),
                                build={"precision": precision, "quantized_from": manifest.version},
                                progress=say, latest=False)
    say(f"{manifest.name}: int8 version at {path} (LATEST unchanged: pin it as a version)")
    return path
