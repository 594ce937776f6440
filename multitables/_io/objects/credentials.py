"""Credentials for S3 requests: where they come from, and how they reach readers without ever being kept in a pickle.

NOTE [credentials]
    A secret must not be written anywhere a user could keep it: an error, a
    log, a repr, ``pickle.dumps(streamer)``, a ``state_dict()``. So:

    * credentials come from the standard places, resolved in each process
      that reads (the consumer, every reader): ``AWS_ACCESS_KEY_ID``,
      ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN``; else botocore's
      chain (``AWS_PROFILE`` and the profile files, SSO, web identity,
      containers, instance metadata), which the ``[s3]`` extra installs.
      Readers inherit the environment, so they find what the consumer found;
    * credentials given in ``storage_options`` (``key``, ``secret``,
      ``token``) are kept in a registry of this process, and what travels
      with the store's settings is a :class:`CredentialRef`, a random name
      for them. A reader started by ``fork`` inherits the registry. One
      started by ``spawn`` or ``forkserver`` gets its arguments pickled over
      a pipe: while multiprocessing pickles for a process it starts (and
      only then, ``multiprocessing.context.get_spawning_popen``, the test
      multiprocessing's own locks use), the reference pickles with the
      credentials, which the child puts in its registry. Pickled anywhere
      else (a user's ``pickle.dumps``, a stage header), it carries the name
      alone, and a process that lacks it says so clearly when it reads;
    * :class:`Credentials` has a redacted repr and refuses to be pickled;
      botocore's signer is never used (it logs the canonical request, session
      token included, at DEBUG): requests are signed by ``sigv4``.
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any

from ..._sys.forks import renew_lock_in_children

#: Environment variables the credentials come from (botocore's first provider).
ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: What to install for the providers beyond the environment.
EXTRA = "pip install 'multitables[s3]'"


class Credentials:
    """An access key, its secret and a session token: repr redacted, never pickled.

    ``source``: a botocore credentials object that refreshes itself
    (temporary credentials), asked for the current values at each request.
    """

    __slots__ = ("_access_key", "_secret", "_token", "_source")

    def __init__(self, access_key: str, secret: str, token: "str | None" = None, source: Any = None) -> None:
        self._access_key, self._secret, self._token, self._source = access_key, secret, token or None, source

    def current(self) -> "tuple[str, str, str | None]":
        """(access key, secret, token) now."""
        if self._source is not None:
            frozen = self._source.get_frozen_credentials()
            return frozen.access_key, frozen.secret_key, frozen.token or None
        return self._access_key, self._secret, self._token

    def scrub(self, text: str) -> str:
        """``text`` with the secret and the token replaced by ``***``."""
        _key, secret, token = self.current()
        for value in (secret, token):
            if value and len(value) >= 4:
                text = text.replace(value, "***")
        return text

    def __repr__(self) -> str:
        return "Credentials(***)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("credentials are never pickled: each process resolves its own (NOTE [credentials])")


# -- credentials given in storage_options ----------------------------------------------------------------------------

_GIVEN: "dict[str, Credentials]" = {}
_GIVEN_LOCK = threading.Lock()

renew_lock_in_children(globals(), "_GIVEN_LOCK")


def _spawning() -> bool:
    """Whether multiprocessing is pickling the arguments of a process it starts (spawn, forkserver)."""
    from multiprocessing import context

    return context.get_spawning_popen() is not None


def _restore(name: str, key: str, secret: str, token: "str | None") -> "CredentialRef":
    with _GIVEN_LOCK:
        _GIVEN.setdefault(name, Credentials(key, secret, token))
    return CredentialRef(name)


class CredentialRef:
    """A name for credentials given in ``storage_options``, held in this process's registry (NOTE [credentials])."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def register(cls, key: str, secret: str, token: "str | None" = None) -> "CredentialRef":
        name = secrets.token_hex(8)
        with _GIVEN_LOCK:
            _GIVEN[name] = Credentials(key, secret, token)
        return cls(name)

    def get(self) -> "Credentials | None":
        """The credentials, or None where this process never received them."""
        with _GIVEN_LOCK:
            return _GIVEN.get(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CredentialRef) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return "CredentialRef(***)"

    def __reduce__(self) -> Any:
        given = self.get() if _spawning() else None
        if given is None:
            return (CredentialRef, (self.name,))
        return (_restore, (self.name, *given.current()))


# -- credentials from the standard places ---------------------------------------------------------------------------

_FOUND: "dict[tuple[Any, ...], Credentials | None]" = {}


def botocore_session(profile: "str | None") -> Any:
    """A botocore session (profile files, the provider chain); ``ImportError`` naming the extra where it is missing."""
    try:
        import botocore.session
    except ImportError:
        raise ImportError(f"reading AWS profile files and credential providers needs botocore: {EXTRA}") from None
    return botocore.session.Session(profile=profile)


def from_environment(profile: "str | None", shown: str) -> Credentials:
    """The credentials this process finds for ``profile`` (None: the default), resolved once per process.

    ``ValueError`` naming where it looked when there are none.
    """
    places = ENV_KEYS + ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
    key = (os.getpid(), profile, tuple(os.environ.get(k) for k in places))
    if key in _FOUND:
        found = _FOUND[key]
    else:
        found = _resolve(profile, shown)
        _FOUND.clear()  # one entry: a changed environment (or a fork) asks again
        _FOUND[key] = found
    if found is None:
        raise ValueError(
            f"no AWS credentials found for {shown}: looked in storage_options (key, secret), AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY, the profile files and the instance's role; for a public bucket pass "
            f"storage_options={{'anon': True}}"
        )
    return found


def _resolve(profile: "str | None", shown: str) -> "Credentials | None":
    env_key, env_secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if profile is None and env_key and env_secret:  # botocore's first provider, without importing botocore
        return Credentials(env_key, env_secret, os.environ.get("AWS_SESSION_TOKEN"))
    try:
        session = botocore_session(profile)
    except ImportError:
        if profile is not None or os.environ.get("AWS_PROFILE"):
            raise
        return None
    try:
        found = session.get_credentials()
    except Exception as exc:  # a profile that does not exist, a provider that failed: its class only (no text)
        named = profile or os.environ.get("AWS_PROFILE")  # a profile's name is no secret: say which one
        where = f" (profile {named!r})" if named else ""
        raise ValueError(f"AWS credentials for {shown} could not be resolved{where}: {type(exc).__name__}") from None
    return None if found is None else Credentials("", "", None, source=found)
