"""What the notebooks show, as importable code: where the tables are, the queries, and the charts.

The notebooks (``notebooks/*.ipynb``) are a few calls into this package, so what they draw is unit-tested and
the same code runs locally (delta-rs, no Spark) and on Databricks (the notebook's ``spark``, native Delta).
"""
