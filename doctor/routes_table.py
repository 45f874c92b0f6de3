"""`torchdoctor routes`: the routing table, printed from rules/data/routing.toml."""

from __future__ import annotations

import json
import sys

from torchdoctor.render.document import Block, Bullets, Heading, Section, Text
from torchdoctor.rules import catalog


def routes_blocks() -> list[Block]:
    table = catalog.routing()
    by_route: dict[str, list[str]] = {}
    for info in catalog.symptoms().values():
        by_route.setdefault(info.route[0], []).append(info.id if len(info.route) == 1 else f"{info.id} (-> {' -> '.join(info.route)})")
    blocks: list[Block] = [Heading("torchdoctor routing table")]
    for n, spec in enumerate(table["specialist"], 1):
        blocks.append(
            Section(
                f"{n}. {spec['id']} — {spec['name']}",
                [
                    Text(spec["covers"]),
                    Text("Symptoms: " + ", ".join(by_route.get(spec["id"], [])), "dim"),
                    Text("Example queries: " + "; ".join(f'"{q}"' for q in spec["examples"]), "dim"),
                ],
            )
        )
    blocks.append(
        Section(
            "Precedence (diagnosis before prescription; the first row that holds leads the route)",
            [Bullets([f"{row['label']}: {' -> '.join(row['order'])} — {row['why']}" for row in table["precedence"]], numbered=True)],
        )
    )
    blocks.append(
        Section(
            "Cross-cutting sequences",
            [
                Bullets(
                    [
                        f"{s['label']}: {' -> '.join(s['steps'])}"
                        + (f" (then {' / '.join(s['follow'])})" if s.get("follow") else "")
                        + f" — {s['why']}"
                        for s in table["sequence"]
                    ]
                )
            ],
        )
    )
    blocks.append(
        Section(
            "Ambiguous queries: one clarifying question",
            [Bullets([f'"{q["label"]}" -> {q["text"]}' for q in table["question"]])],
        )
    )
    blocks.append(
        Section(
            "Common routing mistakes",
            [Bullets([f'"{m["query"]}": not {m["wrong"]}, but {" -> ".join(m["correct"])} — {m["why"]}' for m in table["mistake"]])],
        )
    )
    return blocks


def print_routes(fmt: str) -> None:
    if fmt == "json":
        table = dict(catalog.routing())
        table["symptoms"] = [
            {"id": s.id, "title": s.title, "route": list(s.route), "severity": s.severity, "kind": s.kind}
            for s in catalog.symptoms().values()
        ]
        sys.stdout.write(json.dumps(table, indent=2) + "\n")
        return
    from torchdoctor.render import render_blocks

    render_blocks(routes_blocks(), fmt, sys.stdout)
