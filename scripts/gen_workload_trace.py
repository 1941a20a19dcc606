"""Writes a synthetic workload trace (docs/WORKLOADS.md) of N requests: Poisson arrivals at --rate requests
per second, prompt and output lengths drawn from log-normal distributions (chat-like: a few hundred tokens
of prompt, a hundred or two of output, long tails), clipped to --max-context. Seeded: the same flags give
the same file.

    python scripts/gen_workload_trace.py 1000000 runs/workload_1m.jsonl [--rate 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("requests", type=int)
    p.add_argument("out")
    p.add_argument("--rate", type=float, default=40.0, help="requests per second (default 40)")
    p.add_argument("--prompt-median", type=float, default=512.0)
    p.add_argument("--output-median", type=float, default=160.0)
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal spread of both lengths (default 1.0)")
    p.add_argument("--max-context", type=int, default=32768)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.requests < 1 or a.rate <= 0 or a.max_context < 2:
        print("gen_workload_trace: requests >= 1, rate > 0 and max-context >= 2", file=sys.stderr)
        return 2
    rng = random.Random(a.seed)
    t = 0.0
    lp, lo = math.log(a.prompt_median), math.log(a.output_median)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(
            json.dumps(
                {
                    "workload": 1,
                    "source": f"synthetic: gen_workload_trace.py {a.requests} --rate {a.rate:g} --seed {a.seed}",
                }
            )
            + "\n"
        )
        for _ in range(a.requests):
            t += rng.expovariate(a.rate)
            prompt = min(max(1, int(rng.lognormvariate(lp, a.sigma))), a.max_context - 1)
            output = min(max(1, int(rng.lognormvariate(lo, a.sigma))), a.max_context - prompt)
            f.write(f'{{"arrival_s": {t:.6f}, "prompt_tokens": {prompt}, "output_tokens": {output}}}\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
