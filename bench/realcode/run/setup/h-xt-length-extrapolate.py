"""x-transformers' enwik8 scripts read ./data/enwik8.gz: ~97 MB of synthetic text, gzipped (~1 MB on disk).

The script reads the first 95e6 bytes and keeps the last 5e6 for validation: with less, the
validation loaders are empty and its `cycle()` spins forever at the first validation.
"""
import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import sentences  # noqa: E402

Path("data").mkdir(exist_ok=True)
block = ("\n".join(sentences(16000)) + "\n").encode()
with gzip.open("data/enwik8.gz", "wb", compresslevel=1) as f:
    for _ in range(int(97e6) // len(block) + 1):
        f.write(block)
