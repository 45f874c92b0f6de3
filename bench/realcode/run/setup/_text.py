"""Shared synthetic text for the setups: a small fixed vocabulary, seeded, so every run sees the same data."""
import random

WORDS = ("the king shall speak to thee my lord and what is love a house of stone where rivers run "
         "under bright cold stars we will go home before night falls on green hills").split()


def sentences(n: int, length: int = 12, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]


def names(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syll = ["an", "el", "ma", "ri", "so", "ta", "lo", "ne", "ka", "di", "us", "ra"]
    return ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(n)]
