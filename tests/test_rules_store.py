"""Rules of the store client: which answers are retried, and which endpoint setting wins."""

from __future__ import annotations

import obstore.exceptions as ox
import pytest

from fastload.errors import RemoteError
from fastload.remote.store import RemoteStore
from fastload.remote.url import parse_url

# The AWS SDKs' documented retry rules ("Retry behavior", AWS SDKs and Tools reference guide):
# transient errors are 500, 502, 503, 504, a timeout (408 Request Timeout) and throttling (429 Too
# Many Requests); any other 4xx is the caller's error and asking again will not help.
RETRIED = {408: True, 429: True, 500: True, 502: True, 503: True, 504: True,
           400: False, 401: False, 404: False, 405: False, 409: False, 411: False, 412: False, 416: False,
           418: False, 428: False, 431: False, 480: False, 499: False}  # fmt: skip

# the two ways obstore (object_store) words an HTTP answer it did not expect
WORDINGS = ["Generic S3 error: Error performing GET http://h/b/k: Server returned non-2xx status code: {code} X: body",
            "Generic S3 error: Client error with status {code} X: body"]  # fmt: skip


@pytest.mark.parametrize("wording", WORDINGS)
@pytest.mark.parametrize("code,retried", sorted(RETRIED.items()))
def test_transient_answers_are_retried_and_client_errors_are_not(monkeypatch, code, retried, wording):
    """Bug: 408 or 429 read as a client error (a 4xx pattern without its exceptions), so a throttled
    read fails at once; or every 4xx retried until the deadline. Expected: the table above."""
    monkeypatch.setattr("fastload.remote.store.time.sleep", lambda s: None)
    store = RemoteStore(parse_url("s3://bucket/ds"), storage_options={"endpoint": "http://127.0.0.1:1"}, retry_deadline=60)
    tries = []

    def fn(st):
        tries.append(1)
        if len(tries) == 1:
            raise ox.GenericError(wording.format(code=code))
        return "answer"

    monkeypatch.setattr(RemoteStore, "store", property(lambda self: object()))
    if retried:
        assert store.call("GET", "k", fn) == "answer"
        assert len(tries) == 2
    else:
        with pytest.raises(RemoteError, match=f"refused by the server.*{code}"):
            store.call("GET", "k", fn)
        assert len(tries) == 1


# (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, storage_options endpoint, the endpoint used). The AWS
# SDKs' documented precedence ("Service-specific endpoints"): an endpoint given in code, then the
# service-specific variable AWS_ENDPOINT_URL_S3, then the global AWS_ENDPOINT_URL.
ENDPOINTS = [
    ("http://global:1", None, None, "http://global:1"),
    (None, "http://s3:2", None, "http://s3:2"),
    ("http://global:1", "http://s3:2", None, "http://s3:2"),
    ("http://global:1", "http://s3:2", "http://code:3", "http://code:3"),
    (None, None, "http://code:3", "http://code:3"),
    (None, None, None, None),
]


@pytest.mark.parametrize("glob,s3,code,expected", ENDPOINTS)
def test_the_endpoint_follows_the_aws_sdks_precedence(monkeypatch, glob, s3, code, expected):
    """Bug: AWS_ENDPOINT_URL read before AWS_ENDPOINT_URL_S3, so with both set the S3 client talks
    to the global endpoint; or an environment variable overriding the one given in code."""
    for var, value in (("AWS_ENDPOINT_URL", glob), ("AWS_ENDPOINT_URL_S3", s3)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    store = RemoteStore(parse_url("s3://bucket/ds"), storage_options=None if code is None else {"endpoint": code})
    assert store.config.get("endpoint") == expected
    if expected is not None:
        assert store.client.get("allow_http") is True  # an http:// endpoint is allowed plain HTTP
