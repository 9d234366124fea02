#!/usr/bin/env python3
"""Writes a small synthetic JSONL corpus for demos and tests (standard library only).

Each line is {"text": "..."}: a short document of templated sentences with regularities a tiny
model learns within a few hundred steps: fixed facts (every animal has one colour and one home),
additions ("17 + 25 = 42."), counting ("three four five six."), and simple agreement. The output
is a pure function of --documents and --seed.

    python3 scripts/make_demo_corpus.py data/demo.jsonl
    python3 scripts/prepare_data.py data/demo.jsonl --output data/demo
"""
import argparse
import json
import os
import random
import sys

ANIMALS = ["cat", "dog", "frog", "bird", "fish", "horse", "mouse", "sheep", "lion", "bear",
           "duck", "goat"]
COLOURS = ["black", "brown", "green", "blue", "orange", "white", "grey", "pink", "yellow", "red",
           "purple", "gold"]
HOMES = ["house", "garden", "pond", "tree", "river", "field", "barn", "hill", "cave", "forest",
         "lake", "farm"]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jonas"]
PLURALS = {"fish": "fish", "sheep": "sheep", "mouse": "mice", "goose": "geese"}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]


def sentence(rng: random.Random) -> str:
    kind = rng.randrange(7)
    i = rng.randrange(len(ANIMALS))
    animal, colour, home = ANIMALS[i], COLOURS[i], HOMES[i]  # fixed facts per animal
    if kind == 0:
        return f"The {animal} is {colour}."
    if kind == 1:
        return f"The {animal} lives in the {home}."
    if kind == 2:
        a, b = rng.randrange(50), rng.randrange(50)
        return f"{a} + {b} = {a + b}."
    if kind == 3:
        start = rng.randrange(len(NUMBER_WORDS) - 5)
        n = rng.randrange(3, 6)
        return " ".join(NUMBER_WORDS[start:start + n]) + "."
    if kind == 4:
        n = rng.randrange(1, 10)
        noun = animal if n == 1 else PLURALS.get(animal, animal + "s")
        return f"{rng.choice(NAMES)} has {NUMBER_WORDS[n]} {noun}."
    if kind == 5:
        return f"A {colour} {animal} sleeps in the {home}."
    a = rng.randrange(10)
    return f"{NUMBER_WORDS[a]} plus one is {NUMBER_WORDS[a + 1]}."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", help="the JSONL file to write")
    parser.add_argument("--documents", type=int, default=3000, help="number of documents (default 3000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args()
    if args.documents < 1:
        parser.error("--documents must be positive")
    rng = random.Random(args.seed)
    folder = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{args.output}.tmp.{os.getpid()}"
    chars = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for _ in range(args.documents):
            text = " ".join(sentence(rng) for _ in range(rng.randrange(3, 9)))
            chars += len(text)
            f.write(json.dumps({"text": text}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.output)
    print(f"wrote {args.documents} documents ({chars} characters) to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
