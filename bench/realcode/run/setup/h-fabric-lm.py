"""Lightning's WikiText2 demo dataset reads ./data/wikitext-2.txt (and downloads it only when missing).

The examples split it into n-4000/2000/2000 blocks of 35 tokens, so it needs more than 140k tokens.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import sentences  # noqa: E402

Path("data").mkdir(exist_ok=True)
Path("data/wikitext-2.txt").write_text("\n".join(sentences(13000)) + "\n")
