"""AWS Signature Version 4 for S3 requests without a body, in a few lines and with no logging.

botocore's signer logs the canonical request at DEBUG level, session token
included (``x-amz-security-token:...``): a user who turns DEBUG logging on
would write the token to their logs. This one logs nothing;
``tests/test_objects.py`` checks it gives botocore's signature for the same
request and time.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from urllib.parse import quote, unquote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

#: Signing keys by (secret, date, region): one derivation a day, not one a request.
_key_cache: "dict[tuple[str, str, str], bytes]" = {}


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _signing_key(secret: str, date: str, region: str) -> bytes:
    k = (secret, date, region)
    key = _key_cache.get(k)
    if key is None:
        key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), date), region), "s3"), "aws4_request")
        if len(_key_cache) > 16:
            _key_cache.clear()
        _key_cache[k] = key
    return key


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = []
    for part in query.split("&"):
        k, _, v = part.partition("=")
        pairs.append((quote(unquote(k), safe="-_.~"), quote(unquote(v), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def sign(method: str, host_header: str, path: str, headers: dict, region: str, access_key: str, secret: str,
         token: "str | None" = None, now: "datetime.datetime | None" = None) -> dict:
    """The headers to send: ``headers`` plus Host, X-Amz-Date, X-Amz-Content-SHA256, the token, Authorization.

    ``path`` is the request target as sent (already percent-encoded, S3 does not encode it twice), with any query.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    out = {"Host": host_header, **headers, "X-Amz-Date": amz_date, "X-Amz-Content-SHA256": EMPTY_SHA256}
    if token:
        out["X-Amz-Security-Token"] = token
    canon = sorted((k.lower(), " ".join(str(v).split())) for k, v in out.items())
    signed = ";".join(k for k, _ in canon)
    uri, _, query = path.partition("?")
    creq = "\n".join([method, uri, _canonical_query(query), "".join(f"{k}:{v}\n" for k, v in canon), signed,
                      EMPTY_SHA256])
    scope = f"{date}/{region}/s3/aws4_request"
    sts = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(creq.encode()).hexdigest()}"
    sig = hmac.new(_signing_key(secret, date, region), sts.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={sig}"
    return out
