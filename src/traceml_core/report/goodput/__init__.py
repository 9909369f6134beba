"""The goodput ledger: where every device-second of a job went, across its attempts.

``buckets`` names the ledger's buckets (one table: the JSON keys, the words, the colours, the
docs); ``ledger`` is the ledger as types (``final_summary.json``'s ``goodput``); ``account``
divides one attempt's allocation among the buckets, a pure function of its typed run data;
``previous`` reads the run's earlier attempts back (their layout: ``traceml_core/attempts.py``); ``advice`` names the largest avoidable bucket, with throughput and MFU
where the script declares its work. See docs/goodput.md.
"""
