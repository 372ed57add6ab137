"""inferd.api.pipeline.run: one ordered list of stages per endpoint, as the README draws it."""
from __future__ import annotations

import re
from pathlib import Path

from inferd.api.pipeline.run import EMBEDDING, GENERATION
from inferd.api.pipeline.timeline import ADMISSION

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_flow() -> list[str]:
    """The stage names in README's "How a request flows" drawing, in order."""
    text = README.read_text(encoding="utf-8")
    drawing = text.split("## How a request flows", 1)[1].split("```", 2)[1]
    names = []
    for line in drawing.splitlines():
        if line.startswith("beside the path"):
            break
        m = re.match(r"  (\w+)\s{2,}", line)
        if m:
            names.append(m.group(1))
    return names


def test_the_readme_draws_the_generation_pipeline_in_its_order_ending_in_settle():
    assert readme_flow() == [name for name, _ in GENERATION] + ["settle"]


def test_both_pipelines_share_their_front_and_admit_only_after_every_cheap_check():
    generation = [name for name, _ in GENERATION]
    embedding = [name for name, _ in EMBEDDING]
    assert embedding[:generation.index("degrade")] == generation[:generation.index("degrade")]
    assert embedding[-2:] == ["track", ADMISSION]
    assert generation[-2:] == [ADMISSION, "stream"]
    for names in (generation, embedding):       # refusals that cost nothing come before the tokenizer
        assert names.index("auth") < names.index("body") < names.index("route") < names.index("tokenize")
        assert names.index("permission") < names.index("tokenize") < names.index("policy") < names.index("track")


def test_responses_reads_its_stored_conversation_right_after_the_deadline_and_the_idempotency_key():
    from inferd.api.pipeline.run import RESPONSES
    names = [name for name, _ in RESPONSES]
    assert names.index("deadline") < names.index("idempotency") == names.index("conversation") - 1
    assert [n for n in names if n != "conversation"] == [name for name, _ in GENERATION]
