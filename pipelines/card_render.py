"""A model card's blocks as Markdown and as one self-contained HTML page (its figure inline), so that MLflow's
artifact viewer shows the page as it is, with no stylesheet or image to fetch."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field

from common.markdown import markdown_cell


@dataclass
class Blocks:
    """Headings, paragraphs, bullet lists, tables and one figure, in order; text may hold **bold** and `code`."""

    items: list[tuple] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.items.append(("h", level, text))

    def paragraph(self, text: str) -> None:
        self.items.append(("p", text))

    def bullets(self, lines: list[str]) -> None:
        if lines:
            self.items.append(("ul", list(lines)))

    def table(self, header: list[str], rows: list[list]) -> None:
        if rows:
            self.items.append(("table", header, [[markdown_cell(v) for v in row] for row in rows]))

    def figure(self, name: str, png: bytes, alt: str) -> None:
        self.items.append(("img", name, png, alt))


def to_markdown(blocks: Blocks) -> str:
    out = []
    for kind, *rest in blocks.items:
        if kind == "h":
            out.append("#" * rest[0] + " " + rest[1])
        elif kind == "p":
            out.append(rest[0])
        elif kind == "ul":
            out.append("\n".join(f"- {line}" for line in rest[0]))
        elif kind == "table":
            header, rows = rest
            out.append("\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                                  *("| " + " | ".join(row) + " |" for row in rows)]))
        else:  # the figure, an artifact beside the card
            out.append(f"![{rest[2]}]({rest[0]})")
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    escaped = html.escape(text.replace("\\|", "|"), quote=False)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:1.5em;line-height:1.4}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}"
         "th{background:#f3f3f3}img{max-width:100%}")


def to_html(blocks: Blocks, title: str) -> str:
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{STYLE}</style></head><body>"]
    for kind, *rest in blocks.items:
        if kind == "h":
            out.append(f"<h{rest[0]}>{_inline(rest[1])}</h{rest[0]}>")
        elif kind == "p":
            out.append(f"<p>{_inline(rest[0])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(line)}</li>" for line in rest[0]) + "</ul>")
        elif kind == "table":
            header, rows = rest
            out.append("<table><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in header) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in rows)
                       + "</table>")
        else:
            data = base64.b64encode(rest[1]).decode()
            out.append(f"<p><img alt='{html.escape(rest[2])}' src='data:image/png;base64,{data}'></p>")
    return "\n".join(out) + "</body></html>\n"
