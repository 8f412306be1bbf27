"""The seeded fuzz test of model loading and running (tests/fuzz_models.py): valid models mutated
(truncation, byte flips, unknown ops, undefined and duplicated values, cycles, wrong attribute types,
huge and negative dims and axes, short raw data, opsets 0 and 999, bad subgraphs and functions,
hostile external-data paths), each loaded and run by onnxhal and by onnxruntime in a child process.

It asserts no crash, no hang, only OrtError from onnxhal, and that no mutant onnxruntime refuses
runs to completion here, except for the kinds of difference docs/hostile-models.md lists (``ACCEPTED``).
``ONNXHAL_FUZZ_MUTANTS`` sets how many mutants (default 5,000, 10-25 s with onnxruntime);
``benchmarks/fuzz_campaign.py`` runs the long campaigns."""

from __future__ import annotations

import os

import pytest

from tests import fuzz_models as fm

pytest.importorskip("onnxruntime")
COUNT = int(os.environ.get("ONNXHAL_FUZZ_MUTANTS", "5000"))

#: Kinds of mutant onnxhal runs although onnxruntime refuses it, each on purpose and documented in
#: docs/hostile-models.md (the list after the campaign's table): a mutation name and words of
#: onnxruntime's refusal.
ACCEPTED = [
    ("", "does not match expected type"),          # a graph output declared with another dtype than computed
    ("", "Could not find an implementation"),      # old opsets: onnx.reference runs what ORT dropped
    ("", "Can't merge shape info"),                # a declared shape contradicting the computed one
    ("", "Mismatch between number of inferred and declared dimensions"),
    ("", "Graph attribute inferencing failed"),    # the same, inside a subgraph
    ("", "Subgraph must have the shape set"),      # a Scan body output of unknown shape: ORT needs it, not we
    ("ir_version", "initializer_arg was false"),   # an unused initializer at IR < 4: an assertion inside ORT
    ("", "has unknown shape"),                     # a Loop body input of unknown shape: ORT needs it, not we
    ("", "CallModImpl"),                           # Mod fmod=0 on floats: the spec's (and onnx's tests'), not ORT's
]


def _accepted(outcome: fm.Outcome) -> bool:
    message = outcome.onnxruntime[3]
    return any(m in outcome.mutation and words in message for m, words in ACCEPTED)


def _check(results: list[fm.Outcome]) -> None:
    bad = [r for r in results if r.onnxhal[1] not in ("ok", "typed")]
    assert not bad, "crash, hang or untyped error:\n" + "\n".join(
        f"  mutant {r.index} ({r.seed_model}, {r.mutation}): {r.onnxhal}" for r in bad[:10])
    wrong = [r for r in results if r.onnxhal[1] == "ok" and fm.ort_refused(r) and not _accepted(r)]
    assert not wrong, "runs to completion where onnxruntime refuses:\n" + "\n".join(
        f"  mutant {r.index} ({r.seed_model}, {r.mutation}): onnxruntime {r.onnxruntime}" for r in wrong[:10])


def test_mutated_models_never_crash_hang_or_raise_untyped_errors():
    results = fm.campaign(seed=34, count=COUNT, hang_seconds=30)
    assert len(results) == COUNT
    _check(results)


def test_hostile_external_data_locations():
    results = fm.campaign(seed=0, count=3 * len(fm.EXTERNAL_LOCATIONS), hang_seconds=30, external=True)
    _check(results)
