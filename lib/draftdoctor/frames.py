"""DataFrames as the kit shows them in a notebook: as text, whatever a checkpoint put in their cells.

A tensor name, a config value or an engine's message reaches a notebook's tables. pandas escapes HTML
in every cell; JupyterLab would still run MathJax over the table, so a name holding `$...$` was typeset
as math instead of shown as it is. Every DataFrame the kit returns is made here.
"""

from __future__ import annotations


def frame(data=None, columns=None):
    """`pd.DataFrame(data, columns=columns)`, with pandas told not to mark its tables for MathJax
    (`display.html.use_mathjax`, pandas' own option: process-wide, so after the kit's first table no
    DataFrame in the kernel is typeset)."""
    import pandas as pd

    pd.set_option("display.html.use_mathjax", False)
    return pd.DataFrame(data, columns=columns)
