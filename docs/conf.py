"""Sphinx configuration for normcert's documentation (pip install -e ".[docs]";
sphinx-build -W -b html docs docs/_build/html)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "normcert"
author = "the normcert authors"
copyright = "the normcert authors"

extensions = ["myst_parser", "normcert_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# headings get anchors so that pages can link to a section: [text](page.md#a-heading)
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_title = "normcert"
html_static_path = ["_static"]
