"""The run's report: ``final_summary.json`` / ``.txt`` built from aggregate plain data.

``summary`` (the JSON, docs/summary-schema.md), ``verdicts`` + ``thresholds`` (why is it slow),
``stats`` (medians, merged sketches and series, memory trend), ``render_txt`` (the human text),
``output`` (writing both files), ``summarize`` (rebuild from a checkpoint).
"""
