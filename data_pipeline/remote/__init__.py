"""Prepared data in S3-compatible object storage, read through a bounded node-local cache.

`url` parses `s3://BUCKET/PREFIX` and sizes (no boto3: the run config's parser uses it), `client` is the
boto3 client with bounded retries, `cache` the node-local cache (sha256 check, flock locks, size bound,
LRU eviction), `prefetch` the background fetcher, `upload` `roformer data upload`. docs/data_format.md#remote-data.
"""
