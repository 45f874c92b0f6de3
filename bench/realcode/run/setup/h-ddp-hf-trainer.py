"""Text for our Trainer driver: train.txt and valid.txt (characters are the tokens)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import sentences  # noqa: E402

Path("train.txt").write_text("\n".join(sentences(300)) + "\n")
Path("valid.txt").write_text("\n".join(sentences(30, seed=1)) + "\n")
