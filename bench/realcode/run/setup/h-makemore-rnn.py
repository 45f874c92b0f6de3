"""makemore reads names.txt (one word a line): synthetic names."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import names  # noqa: E402

Path("names.txt").write_text("\n".join(names(2000)) + "\n")
