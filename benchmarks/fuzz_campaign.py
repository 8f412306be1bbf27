"""A long fuzz campaign of model loading and running (tests/fuzz_models.py), onnxhal against
onnxruntime: valid models mutated, each loaded and run by both in a child process.

    python benchmarks/fuzz_campaign.py [--seed 34] [--mutants 6000] [--external 100] [--json out.json]
    python benchmarks/fuzz_campaign.py --bridge [--seed 35] [--mutants 3000] [--external 30]

Prints the figures docs/hostile-models.md records (mutants, typed and untyped errors, crashes, hangs,
mutants run to completion where onnxruntime refuses, and those not on the documented list) and
lists every crash, hang, untyped error and undocumented acceptance. The suite's
tests/test_fuzz_models.py runs the same harness on 5,000 mutants.

``--bridge`` runs each mutant inside onnxruntime instead (tests/fuzz_bridge.py): onnxhal's plugin
library registered, a simulated device preferred (PREFER_NPU on generic-npu for even mutants,
PREFER_GPU on generic-gpu for odd ones), against onnxruntime's CPU EP alone in the same child. It
prints that mode's figures and lists every crash, hang, untyped error, refusal where onnxruntime
runs the mutant, wrong output, and run to completion where onnxruntime refuses it.
tests/test_ort_plugin_fuzz.py runs 400 of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import fuzz_models as fm  # noqa: E402 - after the path is set
from tests.test_fuzz_models import ACCEPTED, _accepted  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--mutants", type=int, default=6000)
    parser.add_argument("--external", type=int, default=100, help="external-data mutants (hostile locations)")
    parser.add_argument("--no-ort", action="store_true", help="onnxhal only (no comparison)")
    parser.add_argument("--hang-seconds", type=float, default=30.0, help="no answer for this long is a hang")
    parser.add_argument("--json", help="write the figures and the findings to this file")
    parser.add_argument("--bridge", action="store_true",
                        help="inside onnxruntime, through onnxhal's plugin library, a simulated device preferred")
    args = parser.parse_args()
    if args.bridge:
        return bridge_campaign(args)
    t0 = time.perf_counter()
    step = max(args.mutants // 20, 1)
    results = fm.campaign(args.seed, args.mutants, with_ort=not args.no_ort, hang_seconds=args.hang_seconds,
                          progress=lambda n: n % step == 0 and print(f"  {n} mutants", file=sys.stderr))
    if args.external:
        results += fm.campaign(args.seed, args.external, with_ort=not args.no_ort, hang_seconds=args.hang_seconds,
                               external=True)
    figures = fm.summary(results)
    accepted = [r for r in results if r.onnxhal[1] == "ok" and fm.ort_refused(r)]
    figures["of which documented (docs/hostile-models.md)"] = sum(_accepted(r) for r in accepted)
    for _, words in ACCEPTED:
        figures[f"  accepted, onnxruntime said {words!r}"] = sum(words in r.onnxruntime[3] for r in accepted)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    findings = [r.__dict__ for r in results if r.onnxhal[1] in ("untyped", "crash", "hang")]
    findings += [r.__dict__ for r in accepted if not _accepted(r)]
    findings += [r.__dict__ for r in results
                 if r.onnxhal[1] == "typed" and any(w in r.onnxhal[3] for w in fm.INTERNAL_WORDS)]
    print(json.dumps(figures, indent=1))
    for f in findings:
        print(f"mutant {f['index']} ({f['seed_model']}, {f['mutation']}): onnxhal {f['onnxhal']}, "
              f"onnxruntime {(f['onnxruntime'] or ['-'])[:4]}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"figures": figures, "findings": findings}, out, indent=1)
    return 1 if findings else 0


def bridge_campaign(args: argparse.Namespace) -> int:
    from tests import fuzz_bridge as fb

    t0 = time.perf_counter()
    step = max(args.mutants // 20, 1)
    results = fb.campaign(args.seed, args.mutants, hang_seconds=args.hang_seconds,
                          progress=lambda n: n % step == 0 and print(f"  {n} mutants", file=sys.stderr))
    if args.external:
        results += fb.campaign(args.seed, args.external, hang_seconds=args.hang_seconds, external=True)
    figures = fb.summary(results)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    findings = fb.findings(results)
    print(json.dumps(figures, indent=1))
    for f in findings:
        print(f"mutant {f.index} ({f.seed_model}, {f.mutation}): bridge {f.onnxhal}, "
              f"onnxruntime alone {(f.onnxruntime or ['-'])[:4]}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"figures": figures, "findings": [f.__dict__ for f in findings]}, out, indent=1)
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
