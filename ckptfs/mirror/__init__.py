"""The tiered mirror: sealed groups uploaded to S3-compatible object storage (docs/mirror.md).

Modules: ``remote`` (the store: boto3, conditional puts, multipart, checksums, the startup probe),
``protocol`` (remote layout; part, MANIFEST and COMMIT documents; M1-M3), ``journal`` (the
crash-safe upload state, U1-U3), ``uploader`` (the background uploader subscribed to the core's
events; local and remote retention, M4-M6), ``restore`` (``ckptfs restore`` / ``verify s3://``),
``dcpmeta`` (the files a DCP ``.metadata`` names, read without torch and without running code).

The package sits above the core: it subscribes to ``CkptFS.events``, registers attribute sources
and a retention gate, and reads committed bytes through the backing store; the core never imports it.
"""
