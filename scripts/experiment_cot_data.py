#!/usr/bin/env python3
"""Writes the multi-step task of the FP8 table experiment: multi-digit addition with a worked,
column-by-column answer, as `jsonl` task files ({"prompt", "answer"} per line).

Why this task: the experiment needs answers of many tokens (the sampler/learner mismatch adds up
over the tokens of a sequence) whose every step is checkable, on a byte tokenizer (the real Qwen3
vocabulary, 151,936 rows, does not fit a model a 2-core machine can train). The worked answer is
one line, so the `jsonl` task's `line` match scores the whole derivation: reward 1 only when every
column and the result are right. Example, 3 digits:

  prompt  "507+386="
  answer  "c1: 7+6+0=13 w3 c1; c2: 0+8+1=9 w9 c0; c3: 5+3+0=8 w8 c0; answer 893"

(column k from the right: digits + carry in = sum, written digit, carry out). With 5 digits an
answer is about 110 bytes, i.e. ~110 new tokens plus EOS. The train and validation files hold
distinct problems (no validation prompt is in the training file); the same arguments always give
byte-identical files.

usage: experiment_cot_data.py --out DIR [--digits 5] [--train 20000] [--val 1000] [--seed 1]
"""

import argparse
import json
import os
import random
import sys


def worked_answer(a, b, digits):
    """The one-line column-by-column derivation of a + b (both < 10^digits)."""
    steps, carry = [], 0
    for k in range(digits):
        da, db = (a // 10 ** k) % 10, (b // 10 ** k) % 10
        s = da + db + carry
        steps.append(f"c{k + 1}: {da}+{db}+{carry}={s} w{s % 10} c{s // 10}")
        carry = s // 10
    return "; ".join(steps) + f"; answer {a + b}"


def problems(count, digits, rng, taken):
    out = []
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    while len(out) < count:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if (a, b) in taken:
            continue
        taken.add((a, b))
        out.append({"prompt": f"{a}+{b}=", "answer": worked_answer(a, b, digits)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--digits", type=int, default=5)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--val", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not 1 <= args.digits <= 9:
        raise SystemExit(f"experiment_cot_data: --digits must be in [1, 9], got {args.digits}")
    space = (9 * 10 ** (args.digits - 1)) ** 2
    if args.train + args.val > space // 2:
        raise SystemExit(f"experiment_cot_data: {args.train + args.val} problems do not fit "
                         f"{args.digits}-digit operands")
    rng = random.Random(args.seed)
    taken = set()
    # Validation first, so its problems do not depend on --train.
    val = problems(args.val, args.digits, rng, taken)
    train = problems(args.train, args.digits, rng, taken)
    os.makedirs(args.out, exist_ok=True)
    for name, rows in (("val.jsonl", val), ("train.jsonl", train)):
        path = os.path.join(args.out, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
        os.replace(tmp, path)
    print(f"experiment_cot_data: {len(train)} train, {len(val)} val problems in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
