"""mkdocs hooks: pages maintained next to other parts of the code join the site when they exist.

``docs/summary-schema.md`` (the field-by-field schema of final_summary.json) is written with the
report code; until it exists, the build stays strict and the results page says where it will be.
"""

from __future__ import annotations

from pathlib import Path

OPTIONAL_PAGES = {"summary-schema.md": "Summary schema"}
LINK_MARK = "<!-- summary-schema-link -->"


def on_config(config):
    docs = Path(config["docs_dir"])
    for name, title in OPTIONAL_PAGES.items():
        if (docs / name).exists() and not any(name in str(item) for item in config["nav"]):
            config["nav"].insert(7, {title: name})
    return config


def on_page_markdown(markdown, page, config, files):
    if LINK_MARK in markdown:
        exists = (Path(config["docs_dir"]) / "summary-schema.md").exists()
        text = ("The exact field-by-field schema is on the [summary schema](summary-schema.md) page."
                if exists else "The exact field-by-field schema is documented with the report code "
                "(`docs/summary-schema.md`).")
        markdown = markdown.replace(LINK_MARK, text)
    return markdown
