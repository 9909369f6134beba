"""Moved to :mod:`traceml_core.stats.sketch` (re-exported here until every importer moved)."""

from ..stats.sketch import (  # noqa: F401
    ENCODING, FOLD_VALUES, HOT_MAX, MAX_BUCKETS, QuantileSketch, bucket_value, column_keys, merge_dense,
    quantiles_of, trimmed, value_bucket,
)
