"""``posenc report``: the source article's selection table (seed 001, section 4.1) filled with
what posenc measured, then its scenario advice beside the measurements.

``measure`` turns run directories and a profile into numbers per encoding, ``code_size`` is
the implementation-complexity proxy, ``advice`` weighs each scenario's pick against the
numbers, and ``render`` writes the Markdown, the terminal table and the PNG. The JSON document
(``SCHEMA``) is what scripts rely on: its keys only ever grow.
"""
