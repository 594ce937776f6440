"""Sphinx configuration for the multitables documentation.

Build with warnings as errors, as the tests do::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys

# Document the package of this checkout, installed or not.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import multitables  # noqa: E402

project = "multitables"
author = "the multitables authors"
copyright = "the multitables authors"
version = release = multitables.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

# Docstrings are numpydoc style; Google style is not used here.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# "Attributes" sections become ``:ivar:`` fields of their class, not separate
# attribute entries (the attributes are documented once, in the docstring).
napoleon_use_ivar = True
# Render "int, optional" and '{"auto", "h5py"}' as words and literals rather
# than as links to classes named "optional" or '{"auto"'.
napoleon_preprocess_types = True

autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
}
# Signatures keep the type hints; the numpydoc sections describe them in words.
autodoc_typehints = "signature"

exclude_patterns = ["_build"]
root_doc = "index"
html_theme = "alabaster"
html_title = f"multitables {release}"
