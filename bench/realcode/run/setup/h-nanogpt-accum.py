"""Synthetic data for nanoGPT's shakespeare_char dataset: train.bin/val.bin (uint16 ids) and meta.pkl."""
import pickle
import random
from pathlib import Path

import numpy as np

random.seed(0)
words = ["the", "king", "shall", "speak", "to", "thee", "my", "lord", "and", "what", "is", "love"]
text = "\n".join(" ".join(random.choice(words) for _ in range(12)) for _ in range(3000))
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
ids = np.array([stoi[c] for c in text], dtype=np.uint16)
cut = int(len(ids) * 0.9)
out = Path("data/shakespeare_char")
out.mkdir(parents=True, exist_ok=True)
ids[:cut].tofile(out / "train.bin")
ids[cut:].tofile(out / "val.bin")
with open(out / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
