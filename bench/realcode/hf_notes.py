"""Print the rows table of notes_bugs_hf.md from bugs_hf.jsonl (keeps the table in step with the labels)."""

import json
from pathlib import Path

HERE = Path(__file__).parent

for line in (HERE / "bugs_hf.jsonl").read_text().splitlines():
    row = json.loads(line)
    what = row["reason"].split(";")[0]
    print(f"| {row['id']} | {row['repo']} | {row['family']} | `{row['path']}:{row['line']}` | {what} |")
