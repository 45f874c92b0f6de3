"""pytorch/examples word_language_model reads ./data/wikitext-2/{train,valid,test}.txt: synthetic sentences."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import sentences  # noqa: E402

out = Path("data/wikitext-2")
out.mkdir(parents=True, exist_ok=True)
for name, n, seed in (("train", 300, 0), ("valid", 40, 1), ("test", 40, 2)):
    (out / f"{name}.txt").write_text("\n".join(sentences(n, seed=seed)) + "\n")
