"""A report as a list of blocks, rendered to markdown or HTML.

Blocks: ``("h", text)``, ``("p", text)``, ``("img", path, alt)``, ``("table", header, rows)``,
``("list", items)``. Cells and items are plain text; :class:`Code` marks a literal (token strings).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

Block = tuple[Any, ...]


@dataclass(frozen=True)
class Code:
    """A cell shown literally (code font, nothing interpreted as markup)."""

    text: str


def _md_cell(cell: Any) -> str:
    if isinstance(cell, Code):
        text = cell.text.replace("\n", "\\n")
        fence = "``" if "`" in text else "`"
        pad = " " if fence == "``" else ""
        return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")
    return str(cell).replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: list[Block]) -> str:
    """GitHub-flavoured markdown; images are referenced by their (relative) paths."""
    lines = [f"# {title}", ""]
    for block in blocks:
        kind = block[0]
        if kind == "h":
            lines += [f"## {block[1]}", ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "img":
            lines += [f"![{block[2]}]({block[1]})", ""]
        elif kind == "list":
            lines += [f"- {_md_cell(item)}" for item in block[1]] + [""]
        elif kind == "table":
            header, rows = block[1], block[2]
            lines.append("| " + " | ".join(_md_cell(c) for c in header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _html_cell(cell: Any) -> str:
    if isinstance(cell, Code):
        return f"<code>{html.escape(cell.text)}</code>"
    return html.escape(str(cell))


def to_html(title: str, blocks: list[Block]) -> str:
    """A standalone HTML page, everything escaped."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for block in blocks:
        kind = block[0]
        if kind == "h":
            body.append(f"<h2>{html.escape(block[1])}</h2>")
        elif kind == "p":
            body.append(f"<p>{html.escape(block[1])}</p>")
        elif kind == "img":
            body.append(f'<p><img src="{html.escape(block[1])}" alt="{html.escape(block[2])}"></p>')
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_html_cell(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_html_cell(c)}</th>" for c in block[1])
            rows = "".join(
                "<tr>" + "".join(f"<td>{_html_cell(c)}</td>" for c in r) + "</tr>" for r in block[2]
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
