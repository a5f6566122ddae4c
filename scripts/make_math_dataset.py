#!/usr/bin/python3
"""Generates a small offline math word-problem dataset in GSM8K's shape, deterministically.

Each line of train.jsonl / val.jsonl is {"question": ..., "answer": "<worked steps>\\n#### <n>"},
the shape of GSM8K, so the `math` task, its tests and configs/examples/ run without a download.
The same arguments always give byte-identical files (Python's random.Random with an integer seed
is stable across Python 3 versions); every question is distinct and no validation question is in
the training file. Answers are non-negative integers up to about 2,400 (six problem templates: sums,
products, change after a purchase, equal shares, pages read, discounts).

usage: make_math_dataset.py --out DIR [--train 2000] [--val 200] [--seed 1]
"""
import argparse
import json
import os
import random
import sys
import tempfile

NAMES = ["Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kai",
         "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq"]
ITEMS = ["apple", "marble", "sticker", "pencil", "book", "cookie", "shell", "coin", "card",
         "stamp", "button", "ribbon"]


def add_problem(rng):
    name, friend = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    q = (f"{name} has {a} {item}s. {friend} gives {name} {b} more {item}s. "
         f"How many {item}s does {name} have now?")
    steps = f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}s."
    return q, steps, a + b


def multiply_problem(rng):
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    packs, per = rng.randint(2, 60), rng.randint(2, 40)
    q = (f"{name} buys {packs} packs of {item}s. Each pack holds {per} {item}s. "
         f"How many {item}s does {name} buy?")
    steps = f"{packs} packs of {per} is {packs} * {per} = <<{packs}*{per}={packs * per}>>" \
            f"{packs * per} {item}s."
    return q, steps, packs * per


def spend_problem(rng):
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    count, price = rng.randint(2, 12), rng.randint(1, 25)
    cost = count * price
    money = cost + rng.randint(0, 200)
    q = (f"{name} has ${money} and buys {count} {item}s at ${price} each. "
         f"How many dollars does {name} have left?")
    steps = (f"The {item}s cost {count} * {price} = <<{count}*{price}={cost}>>{cost} dollars.\n"
             f"{name} has {money} - {cost} = <<{money}-{cost}={money - cost}>>{money - cost} "
             f"dollars left.")
    return q, steps, money - cost


def share_problem(rng):
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    friends, each = rng.randint(2, 12), rng.randint(2, 50)
    total = friends * each
    q = (f"{name} shares {total} {item}s equally among {friends} friends. "
         f"How many {item}s does each friend get?")
    steps = f"Each friend gets {total} / {friends} = <<{total}/{friends}={each}>>{each} {item}s."
    return q, steps, each


def reading_problem(rng):
    name = rng.choice(NAMES)
    per_day, days, extra = rng.randint(5, 60), rng.randint(2, 30), rng.randint(1, 99)
    week = per_day * days
    q = (f"{name} reads {per_day} pages a day for {days} days, then {extra} more pages on the "
         f"last evening. How many pages does {name} read in all?")
    steps = (f"In {days} days {name} reads {per_day} * {days} = <<{per_day}*{days}={week}>>"
             f"{week} pages.\nIn all that is {week} + {extra} = <<{week}+{extra}={week + extra}>>"
             f"{week + extra} pages.")
    return q, steps, week + extra


def discount_problem(rng):
    item = rng.choice(ITEMS)
    percent = rng.choice([10, 20, 25, 50, 75])
    price = rng.randint(1, 40) * 20  # a multiple of 20: every discount is whole dollars
    off = price * percent // 100
    q = (f"A box of {item}s costs ${price}. It is on sale for {percent}% off. "
         f"What is the sale price in dollars?")
    steps = (f"The discount is {price} * {percent} / 100 = <<{price}*{percent}/100={off}>>{off} "
             f"dollars.\nThe sale price is {price} - {off} = <<{price}-{off}={price - off}>>"
             f"{price - off} dollars.")
    return q, steps, price - off


GENERATORS = [add_problem, multiply_problem, spend_problem, share_problem, reading_problem,
              discount_problem]


def generate(rng, count, taken):
    out = []
    while len(out) < count:
        q, steps, answer = rng.choice(GENERATORS)(rng)
        if q in taken:
            continue
        taken.add(q)
        out.append({"question": q, "answer": f"{steps}\n#### {answer}"})
    return out


def write_atomic(path, rows):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp.")
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--train", type=int, default=2000, help="training problems")
    parser.add_argument("--val", type=int, default=200, help="validation problems")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    args = parser.parse_args()
    if not 1 <= args.train <= 100000:
        sys.exit("make_math_dataset: --train must be in [1, 100000]")
    if not 1 <= args.val <= 100000:
        sys.exit("make_math_dataset: --val must be in [1, 100000]")
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    taken = set()
    val = generate(rng, args.val, taken)
    train = generate(rng, args.train, taken)
    write_atomic(os.path.join(args.out, "train.jsonl"), train)
    write_atomic(os.path.join(args.out, "val.jsonl"), val)
    print(f"make_math_dataset: {len(train)} train, {len(val)} val problems -> {args.out}")


if __name__ == "__main__":
    main()
