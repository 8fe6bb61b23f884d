"""Authentication (DESIGN §4): the request's credentials become an `Identity`.

- `jwt.py`: bearer JWTs verified with PyJWT (`keys.py` loads the keys they may use);
- `tokens.py`: the static token file;
- `headers.py`: trusted front-proxy headers;
- `stage.py`: the identity stage that tries them in that order;
- `impersonation.py`: the impersonation stage (`Impersonate-*`, decided by
  `sidecar.policy.kinds.impersonation`) that follows the tenant rate limit;
- `credentials.py`: re-reads the credential files on change and on SIGHUP.

`names.py` holds what every authenticator shares: the `Authenticator` interface, the
rules for user, group and tenant names, and the 401 for bad credentials.
"""
