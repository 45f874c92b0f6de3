"""yunjey's language_model reads data/train.txt (Penn Treebank in the original): random sentences."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import sentences  # noqa: E402

Path("data").mkdir(exist_ok=True)
Path("data/train.txt").write_text("\n".join(sentences(250)) + "\n")
