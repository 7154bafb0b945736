"""Reliability campaigns for ckptfs (issue 5): writer kills, daemon kills, resume
exactness, the I/O-error sweep, and the report that tabulates them.

Every campaign is a function taking its trial counts, so the full run
(``scripts/*``) and the bounded tests (``tests/test_campaign_*.py``) execute the
same code with different numbers.  Every campaign returns a JSON-serialisable
dict whose ``violations`` list is empty exactly when no invariant was broken.
"""
