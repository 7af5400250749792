"""Regenerate the documentation's figures from the engine: docs/img/fig3.png and the Fig. 3
table in docs/semantics.md (between its ``fig3`` markers).

    .venv/bin/python tools/figures.py
"""

from __future__ import annotations

import re
from pathlib import Path

from mediator.plots import fig3_figure, fig3_table

DOCS = Path(__file__).resolve().parent.parent / "docs"


def main() -> None:
    fig3_figure(DOCS / "img" / "fig3.png")
    semantics = DOCS / "semantics.md"
    text = semantics.read_text(encoding="utf-8")
    text = re.sub(r"(<!-- fig3:begin -->\n).*?(<!-- fig3:end -->)",
                  lambda m: m.group(1) + fig3_table() + m.group(2), text, flags=re.S)
    semantics.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
