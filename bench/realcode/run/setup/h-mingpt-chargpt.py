"""minGPT chargpt reads input.txt in the working directory: a small synthetic text."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text import sentences  # noqa: E402

# the script samples from the context "O God, O God!": its characters must be in the vocabulary
Path("input.txt").write_text("O God, O God!\n" + "\n".join(sentences(400)) + "\n")
