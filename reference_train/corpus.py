"""The bundled offline corpus: short children's stories generated from templates.

It is generated, deterministically from a seed, rather than downloaded, so the
default `prepare` and the tests need no network. It is small (about 0.6 MB of
text for the default 2,000 stories) and repetitive: good for checking that a
loss goes down and that the trainer is correct, not for a useful model. Use
TinyStories (`--hf-dataset roneneldan/TinyStories`) or your own text for that.
"""

from __future__ import annotations

import random

NAMES = ["Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Leo", "Zoe", "Sam",
         "Tim", "Lucy", "Jack", "Emma", "Noah", "Ella"]
ANIMALS = ["cat", "dog", "bird", "frog", "bunny", "fox", "duck", "bear", "mouse", "fish"]
PLACES = ["park", "garden", "forest", "beach", "farm", "house", "school", "river", "hill", "zoo"]
THINGS = ["ball", "kite", "box", "hat", "cake", "book", "boat", "toy car", "red cup", "big drum"]
ADJECTIVES = ["happy", "sad", "small", "big", "kind", "funny", "brave", "sleepy", "shy", "loud"]
FEELINGS = ["happy", "proud", "glad", "calm", "excited", "thankful"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy"]

OPENINGS = [
    "Once upon a time, there was a {adj} {animal} named {name}.",
    "One {weather} day, {name} went to the {place}.",
    "{name} had a {adj} {thing}.",
    "There was a little {animal} who lived near the {place}.",
]
MIDDLES = [
    "{name} wanted to play with the {thing}, but it was stuck in a tree.",
    "At the {place}, {name} met a {adj} {animal}.",
    "The {animal} said, \"Can I play too?\" {name} said, \"Yes, you can!\"",
    "{name} lost the {thing} and looked for it everywhere.",
    "It started to rain, so {name} and the {animal} hid under a big leaf.",
    "{name} shared the {thing} with a {adj} friend.",
    "The {animal} was {adj} because it could not find its mom.",
]
ENDINGS = [
    "In the end, {name} felt {feeling} and went home.",
    "They played together all day and were {feeling}.",
    "{name} learned that sharing is good.",
    "The {animal} found its mom, and everyone was {feeling}.",
    "From that day on, {name} and the {animal} were best friends.",
]


def generate_story(rng: random.Random) -> str:
    """One story of 3 to 6 sentences; the same `rng` state always gives the same story."""
    slots = {
        "name": rng.choice(NAMES), "animal": rng.choice(ANIMALS), "place": rng.choice(PLACES),
        "thing": rng.choice(THINGS), "adj": rng.choice(ADJECTIVES),
        "feeling": rng.choice(FEELINGS), "weather": rng.choice(WEATHER),
    }
    sentences = [rng.choice(OPENINGS)]
    sentences += rng.sample(MIDDLES, rng.randint(1, 4))
    sentences.append(rng.choice(ENDINGS))
    return " ".join(s.format(**slots) for s in sentences)


def offline_corpus(n_stories: int = 2000, seed: int = 0) -> list[str]:
    """The bundled corpus: `n_stories` generated stories, identical for a given seed."""
    rng = random.Random(seed)
    return [generate_story(rng) for _ in range(n_stories)]
