"""Checkpoints mirrored to S3-compatible object storage (`--mirror s3://BUCKET/PREFIX`).

Importing this package imports no S3 client: boto3 (the `s3` extra) is imported when a mirror
is configured, so the supervisor stays small without it.

    mirror     Mirror: what the supervisor's loop calls (check, restore, poll, metrics, close)
    uploader   the background upload thread: one in flight, newest wins, retries; remote rotation
    remote     remote checkpoints: committed ones (manifest last), verified download and restore
    url        MirrorUrl: s3://BUCKET/PREFIX parsed (what the config checks)
    _client    the S3 operations (boto3), every failure as a one-line MirrorError
"""
