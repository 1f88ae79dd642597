"""Datasets in object stores (``s3://``, ``gs://``, ``az://``, ``https://``): URLs, the client, the node cache, uploads.

Importing this package imports no client: obstore (``pip install "fastload[s3]"``) is imported when a
URL is first read or written, and its absence is a :class:`~fastload.errors.DependencyError` then.
"""

from .nodecache import RemoteShards, cache_root, parse_limit
from .store import DEFAULT_RETRY_DEADLINE, RemoteStore
from .url import RemoteURL, is_url, parse_url

__all__ = ["RemoteShards", "RemoteStore", "RemoteURL", "is_url", "parse_url", "cache_root", "parse_limit",
           "DEFAULT_RETRY_DEADLINE"]
